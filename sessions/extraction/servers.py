"""The servers of one extraction job (issue 24 item 3): ``servers = [...]`` in the spec, or
``extract run JOB --servers a,b``, resolved into endpoints, and the check that they all serve one model.

An entry is a session id (its profile gives the URL, capture dir, rid prefix and model path, as ``session``
does), the id of a group of replicas (``[server] replicas = N``: every member, by index), or a URL (its
capture dir and rid prefix are read from the process listening on its port, the way
`sessions.extraction.identity` reads them; the spec's ``capture_dir`` where that cannot be read).  Two
servers may not share a capture dir: a sample redone on another server after a failure would meet the first
server's partial dumps of the same rid.

Before the first request every server's identity is read and compared on what changes the hidden states
(`model_identity`: the model config's digest, which holds the hidden size and layer count, the checkpoint
files by name and size, the numerics flags, the capture layers, the chat template and the SGLang version).
Per-server parts (URL, capture dir, rid prefix, model folder path, file times) are not compared.  The odd
server is **left out with the reason**, not the whole job refused: the job goes on with the servers that
agree (the reference is the job's recorded model identity on a resume, else the identity most servers
show, ties to the one listed first), and a refused server rejoins only once it serves the job's model.
"""
from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessions.extraction.spec import JobSpec
    from sessions.home import Home

# The identity parts a server of the job must share with the others (see the module docstring).
MODEL_KEYS = ("model_config", "weights", "numerics", "capture_layers", "chat_template", "sglang_version")


@dataclass(frozen=True)
class ServerEndpoint:
    """One server of a job: ``name`` is what the spec called it (a session id, a group member's session id,
    or the URL)."""

    name: str
    url: str
    capture_dir: Path
    rid_prefix: str
    model_path: Path | None = None
    session: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "capture_dir": str(self.capture_dir),
                "rid_prefix": self.rid_prefix, "session": self.session}


class ServersError(ValueError):
    """The server list cannot be used; the message names the entry and what is wrong."""


def resolve_servers(spec: JobSpec, home: Home, resolve_session: Callable[[str], JobSpec]) -> list[ServerEndpoint]:
    """The job's endpoints: ``servers`` expanded (groups into their members).  ``resolve_session(id)`` is the
    spec as `sessions.extraction.job.resolve_spec` fills it from that session (it raises for a session that
    cannot serve the job); the rest raises `ServersError`."""
    found: list[ServerEndpoint] = []
    for entry in spec.servers:
        if "://" in entry:
            found.append(_url_endpoint(entry, spec))
            continue
        for session_id in _sessions_of(entry, home):
            resolved = resolve_session(session_id)
            assert resolved.server_url is not None and resolved.capture_dir is not None
            found.append(ServerEndpoint(session_id, resolved.server_url, resolved.capture_dir,
                                        resolved.rid_prefix or "", resolved.model_path, session_id))
    _check_distinct(found)
    return found


def _sessions_of(entry: str, home: Home) -> list[str]:
    """A group id → its members' session ids (by index); anything else is taken as one session id."""
    from sessions.server import SessionNotFound
    from sessions.server.session import find_group

    try:
        members = find_group(entry, home)
    except SessionNotFound as exc:
        raise ServersError(f"job.servers: {exc}") from None
    if members is None:
        return [entry]
    if not members:
        raise ServersError(f"job.servers: group {entry} has no members")
    return [m.session_id for m in members]


def _url_endpoint(url: str, spec: JobSpec) -> ServerEndpoint:
    from sessions.capture.plugin.eagle3_capture.spec import DEFAULT_RID_PREFIX
    from sessions.extraction.identity import capture_of_listener

    url = url.rstrip("/")
    capture_dir, rid_prefix = capture_of_listener(url)
    directory = Path(capture_dir) if capture_dir else spec.capture_dir
    if directory is None:
        raise ServersError(f"job.servers: {url}: cannot read its capture dir from the process listening there; "
                           "name a session instead, or set capture_dir (for one URL)")
    return ServerEndpoint(url, url, directory, spec.rid_prefix or rid_prefix or DEFAULT_RID_PREFIX, spec.model_path)


def _check_distinct(endpoints: list[ServerEndpoint]) -> None:
    seen_url: dict[str, str] = {}
    seen_dir: dict[str, str] = {}
    for endpoint in endpoints:
        if endpoint.url in seen_url:
            raise ServersError(f"job.servers: {endpoint.name} and {seen_url[endpoint.url]} are the same server "
                               f"({endpoint.url}); name each server once")
        seen_url[endpoint.url] = endpoint.name
        key = os.path.realpath(endpoint.capture_dir)
        if key in seen_dir:
            raise ServersError(f"job.servers: {endpoint.name} and {seen_dir[key]} capture into the same folder "
                               f"{endpoint.capture_dir}; each server of a job needs its own capture dir (a "
                               "sample redone elsewhere would meet the first server's dumps)")
        seen_dir[key] = endpoint.name


def model_identity(identity: dict[str, Any]) -> dict[str, Any]:
    """The parts of a server identity that every server of one job must share (checkpoint files by name and
    size: copies of one model on two hosts have other modification times)."""
    out = {k: identity.get(k) for k in MODEL_KEYS}
    weights = out.get("weights")
    if isinstance(weights, dict):
        out["weights"] = {name: ([v[0], None] if isinstance(v, list) and v else v) for name, v in weights.items()}
    return out


def model_differences(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """``["model_config: sha256:a → sha256:b", ...]``: what of ``found``'s model identity differs."""
    from sessions.extraction.identity import identity_differences

    return [d for d in identity_differences(model_identity(expected), model_identity(found))
            if d.split(":", 1)[0] in MODEL_KEYS]


def reference_identity(identities: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The model identity the job goes with: the one most reachable servers show (ties: listed first)."""
    shown = [model_identity(i) for i in identities if i is not None]
    if not shown:
        return None
    keys = [repr(sorted(i.items())) for i in shown]
    counts = Counter(keys)
    best = max(counts.values())
    return shown[next(n for n, k in enumerate(keys) if counts[k] == best)]


class ModelAgreement:
    """The one model a job's servers must serve: read from each server before the first request and when it
    comes back, kept in job.json (``model_identity``) so that a resume holds every server to the same one.

    ``check`` is the start-up check over all lanes (the odd one is refused with its differences); ``problem``
    is the prober's check of one lane that answers again (`sessions.extraction.scheduler`)."""

    def __init__(self, meta: dict[str, Any], save: Callable[[], None], log: Callable[[str], None]) -> None:
        self.meta = meta
        self.save = save
        self.log = log

    @property
    def reference(self) -> dict[str, Any] | None:
        known = self.meta.get("model_identity")
        return known if isinstance(known, dict) else None

    def _record(self, identity: dict[str, Any]) -> None:
        self.meta["model_identity"] = identity
        self.save()
        self.log("model identity of the job's servers: " + ", ".join(
            f"{k} {v if k != 'weights' else f'{len(v or {})} checkpoint files'}" for k, v in identity.items()))

    @staticmethod
    def refusal(differences: list[str]) -> str:
        return (f"serves another model than the job's ({'; '.join(differences)}); it rejoins once it serves "
                "the job's")

    async def check(self, urls: list[str]) -> list[tuple[str, str | None]]:
        """(state, reason) for each URL: ``live``, ``down`` (no answer) or ``refused`` (another model)."""
        found = await asyncio.gather(*(self._read(url) for url in urls))
        reference = self.reference
        if reference is None:
            reference = reference_identity([f for f in found if isinstance(f, dict)])
            if reference is not None:
                self._record(reference)
        states: list[tuple[str, str | None]] = []
        for identity in found:
            if isinstance(identity, str):
                states.append(("down", identity))
            elif reference is not None and (differences := model_differences(reference, identity)):
                states.append(("refused", self.refusal(differences)))
            else:
                states.append(("live", None))
        return states

    async def problem(self, url: str) -> str | None:
        """None when the server at ``url`` serves the job's model (the first to answer sets it), else why not."""
        found = await self._read(url)
        if isinstance(found, str):
            return found
        reference = self.reference
        if reference is None:
            self._record(model_identity(found))
            return None
        differences = model_differences(reference, found)
        return self.refusal(differences) if differences else None

    @staticmethod
    async def _read(url: str) -> dict[str, Any] | str:
        """The server's identity, or why it could not be read."""
        from sessions.extraction.identity import IdentityUnavailable, server_identity

        try:
            return await asyncio.to_thread(server_identity, url)
        except IdentityUnavailable as exc:
            return f"unreachable at {url}: {exc}"
