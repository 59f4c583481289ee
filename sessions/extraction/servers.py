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


class ServerIdentityCheck:
    """The identity check of a one-server job: the whole server identity (`sessions.extraction.identity`),
    not only its model, is held to the one recorded on first contact, and ``extract resume JOB
    --accept-server`` lets one change in (kept on the record in job.json and, through ``on_accept``, the
    output's dataset.json).  The same two calls as `ModelAgreement`: ``check`` before the first request,
    ``problem`` when the server answers again."""

    def __init__(self, meta: dict[str, Any], save: Callable[[], None], log: Callable[[str], None], job_id: str,
                 control_path: Path, on_accept: Callable[[], None]) -> None:
        self.meta = meta
        self.save = save
        self.log = log
        self.job_id = job_id
        self.control_path = control_path
        self.on_accept = on_accept

    async def check(self, urls: list[str]) -> list[tuple[str, str | None]]:
        states: list[tuple[str, str | None]] = []
        for url in urls:
            unreachable, problem = await self._problem(url)
            states.append(("live", None) if problem is None else ("down" if unreachable else "refused", problem))
        return states

    async def problem(self, url: str) -> str | None:
        """None when the server at ``url`` is the one the job started with, else the pause reason naming
        what differs."""
        return (await self._problem(url))[1]

    async def _problem(self, url: str) -> tuple[bool, str | None]:
        """(unreachable, reason or None)."""
        from sessions.extraction.identity import (
            IdentityUnavailable,
            identity_differences,
            mismatch_reason,
            server_identity,
        )

        try:
            found = await asyncio.to_thread(server_identity, url)
        except IdentityUnavailable as exc:
            return True, f"server unreachable at {url}: {exc}"
        expected = self.meta.get("server_identity")
        if not isinstance(expected, dict):
            self.meta["server_identity"] = found
            self.save()
            self.log("server identity: " + ", ".join(
                f"{k} {v if k != 'weights' else f'{len(v or {})} checkpoint files'}" for k, v in found.items()))
            return False, None
        differences = identity_differences(expected, found)
        accepted = self._take_acceptance()
        if not differences:
            return False, None
        if not accepted:
            return False, mismatch_reason(url, differences, self.job_id)
        self._accept(found, differences)
        return False, None

    def _take_acceptance(self) -> bool:
        """``--accept-server`` holds for one acceptance, for the server that answers now: a later change
        pauses again, so the flag is cleared as it is read."""
        from sessions.home import atomic_write_json, read_json

        control = read_json(self.control_path, default={}) or {}
        if not control.get("accept_server"):
            return False
        control["accept_server"] = False
        atomic_write_json(self.control_path, control)
        return True

    def _accept(self, found: dict[str, Any], differences: list[str]) -> None:
        """The server that answers now becomes the job's, and the change is kept on the record (job.json, and
        the output's dataset.json: the dataset now holds states of both servers, and whoever trains on it can
        see which changed and when)."""
        import time

        change = {"at": time.time(), "differences": differences, "previous": self.meta.get("server_identity"),
                  "accepted": found, "by": "extract resume --accept-server"}
        self.meta.setdefault("accepted_server_changes", []).append(change)
        self.meta["server_identity"] = found
        self.save()
        self.log(f"server change accepted (--accept-server): {'; '.join(differences)}")
        self.on_accept()
