"""One multi-node server up close, for the TUI's multi-node view: every node's GPUs, and every node's log
mirrored to this machine, plus one merged log (issue 26: "a GPU panel per node, the log per node, and one
merged log").

Nothing new runs on the nodes: each node is asked with our own CLI over its link (`NodeEndpoint`), each in
its own thread, so a lost or hung host holds only its own panel and log:

* GPUs: ``gpus --json`` (that host's reading) and ``status SID --json --no-http`` (the pids of the node's
  ranks, so a process is labelled with its global TP rank: node 1 of a TP8 over 2 nodes holds TP4-7), every
  ``interval_s``.  A failed call keeps the last reading, marked with why and how old it is.
* Logs: ``logs SID -f`` streamed over the link, every line appended to ``<state>/nodes-view/ID/nodeR.log``
  (0600 in a 0700 folder; the remote CLI redacts, the local view redacts again).  When the stream ends (a
  lost host, or a server that exited) it is started again with a backoff, skipping the lines it already
  has: the log is append-only, so line K is line K.
* The merged log ``merged.log``: the lines of all nodes in time order, each prefixed ``nR `` (``n0``,
  ``n1``).  A line without a timestamp (a traceback, a progress bar) keeps the time of the line before it
  on its node, so it stays with its line.  Lines wait in a buffer until every streaming node has logged
  something as late (the watermark), or `MERGE_GRACE_S` at most, so that one quiet or lost node never
  holds the others' lines; before a node's first answer (its ssh still connecting, its whole log still to
  come) nothing goes, for `FIRST_GRACE_S` at most.  Hosts' clocks are taken as they are (multi-node hosts run NTP).

The files are only this view's copy: they are rewritten each time a view opens and never read by anything
but the log pane.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sessions.gpus import GpuSnapshot, snapshot_from_json
from sessions.home import Home, ensure_private_dir
from sessions.logs import PREFIX_RE
from sessions.remote.client import SSH_FAILED, ssh_reason
from sessions.server.nodes import INIT_LINE_RE, MultiNodeRecord, NodeEndpoint, NodeResolver

VIEW_DIR = "nodes-view"
GPU_INTERVAL_S = 2.0
CALL_TIMEOUT_S = 20.0
MERGE_GRACE_S = 1.5  # a line waits at most this long for the other nodes before it goes to merged.log
FIRST_GRACE_S = 30.0  # ... or this long while a node has not answered at all yet (ssh connecting)
MERGE_TICK_S = 0.2
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
MERGED = -1  # the "node" of the merged log, for the view's log switch


@dataclass(frozen=True)
class NodeGpus:
    """One node's latest GPU reading and the labels of its ranks' processes (immutable)."""

    rank: int
    host: str
    tp_ranks: tuple[int, ...]
    gpus: GpuSnapshot | None = None
    owners: dict[int, str] = field(default_factory=dict)  # pid -> "TP5" (global TP rank), "main"
    error: str | None = None  # why the last ask failed (the reading shown is older)
    answered_at: float | None = None  # time.time() of the last good reading


@dataclass(frozen=True)
class NodeLog:
    """Where one node's mirrored log stands."""

    rank: int
    host: str
    path: Path
    lines: int = 0
    streaming: bool = False
    error: str | None = None  # why the stream is down (ssh's reason, the exit status), None while it runs
    # global TP rank -> (time of "Init parallel begin.", time of "Init parallel ends" or None), from its log
    arrivals: tuple[tuple[int, str, str | None], ...] = ()


def view_dir(home: Home, node_id: str) -> Path:
    return home.state_root / VIEW_DIR / node_id


def _sort_key(line: str, previous: str) -> str:
    match = PREFIX_RE.match(line)
    return match.group("ts").replace("T", " ").replace(",", ".") if match else previous


class _Merger:
    """merged.log's writer: lines of every node in time order (see the module docstring)."""

    def __init__(self, path: Path, nodes: int) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.buffer: list[tuple[str, int, int, float, str]] = []  # (time key, node, seq, received, text)
        self.latest: list[str | None] = [None] * nodes  # each node's latest time key
        self.streaming = [False] * nodes
        self.answered = [False] * nodes  # its stream gave a line, or ended, at least once
        self.seq = 0
        self.written = 0
        self.out: IO[str] = open(path, "a", encoding="utf-8", opener=_private_opener)  # noqa: SIM115

    def add(self, node: int, key: str, text: str) -> None:
        with self.lock:
            self.seq += 1
            self.buffer.append((key, node, self.seq, time.monotonic(), text))
            self.latest[node] = key
            self.answered[node] = True

    def answer(self, node: int) -> None:
        """``node``'s stream ended or failed: it no longer holds the others' lines back."""
        with self.lock:
            self.answered[node] = True

    def flush(self, force: bool = False) -> None:
        with self.lock:
            if not self.buffer:
                return
            # A node that never answered may still bring older lines (its ssh is connecting): nothing goes
            # before its first answer (up to FIRST_GRACE_S); after that, the latest time of every node
            # still streaming is the watermark.
            marks = [k for k, on in zip(self.latest, self.streaming, strict=True) if on and k is not None]
            waiting = not all(self.answered)
            watermark = None if waiting else (min(marks) if marks else None)
            grace = FIRST_GRACE_S if waiting else MERGE_GRACE_S
            now = time.monotonic()
            self.buffer.sort()
            cut = 0
            for key, _node, _seq, received, _text in self.buffer:
                if force or (watermark is not None and key <= watermark) or now - received > grace:
                    cut += 1
                else:
                    break
            ready, self.buffer = self.buffer[:cut], self.buffer[cut:]
            if ready:
                self.out.write("".join(f"n{node} {text}\n" for _k, node, _s, _r, text in ready))
                self.out.flush()
                self.written += len(ready)

    def close(self) -> None:
        self.flush(force=True)
        with self.lock:
            self.out.close()


def _private_opener(path: str, flags: int) -> int:
    import os

    return os.open(path, flags, 0o600)


class NodesDetail:
    """The threads of one multi-node view; `gpus()` and `logs()` return the latest state at once."""

    def __init__(self, home: Home, record: MultiNodeRecord, resolver: NodeResolver,
                 interval_s: float = GPU_INTERVAL_S) -> None:
        from sessions.server.nodes import ranks_of_node

        self.home = home
        self.record = record
        self.resolver = resolver
        self.interval_s = interval_s
        self.folder = view_dir(home, record.node_id)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        n = len(record.nodes)
        self._gpus = [NodeGpus(e.rank, e.host, tuple(ranks_of_node(record.tp_size, n, e.rank)))
                      for e in record.nodes]
        self._logs = [NodeLog(e.rank, e.host, self.folder / f"node{e.rank}.log") for e in record.nodes]
        self._procs: dict[int, subprocess.Popen[str]] = {}
        self._threads: list[threading.Thread] = []
        self.merger: _Merger | None = None

    @property
    def merged_path(self) -> Path:
        return self.folder / "merged.log"

    def log_path(self, rank: int) -> Path:
        return self.merged_path if rank == MERGED else self._logs[rank].path

    def start(self) -> NodesDetail:
        if self.folder.exists():  # this view's copy from an earlier opening: mirrored afresh
            shutil.rmtree(self.folder, ignore_errors=True)
        ensure_private_dir(self.folder.parent)
        ensure_private_dir(self.folder)
        for log in self._logs:
            open(log.path, "w", opener=_private_opener).close()
        self.merger = _Merger(self.merged_path, len(self._logs))
        targets = [(self._gpu_loop, e.rank) for e in self.record.nodes]
        targets += [(self._log_loop, e.rank) for e in self.record.nodes]
        for target, rank in targets:
            thread = threading.Thread(target=target, args=(rank,), daemon=True,
                                      name=f"nodes-view-{target.__name__}-{rank}")
            self._threads.append(thread)
            thread.start()
        merge = threading.Thread(target=self._merge_loop, daemon=True, name="nodes-view-merge")
        self._threads.append(merge)
        merge.start()
        return self

    def close(self) -> None:
        """End the streams (the ssh or CLI children this view started, by their Popen) and the threads."""
        self._stop.set()
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            _end(proc)
        for thread in self._threads:
            thread.join(timeout=5)

    def gpus(self) -> tuple[NodeGpus, ...]:
        with self._lock:
            return tuple(self._gpus)

    def logs(self) -> tuple[NodeLog, ...]:
        with self._lock:
            return tuple(self._logs)

    def _endpoint(self, rank: int) -> NodeEndpoint:
        return self.resolver(self.record.nodes[rank].host)

    # -- GPUs -----------------------------------------------------------------------------------------------

    def _gpu_loop(self, rank: int) -> None:
        entry = self.record.nodes[rank]
        while not self._stop.is_set():
            # The reading first, shown at once; then the labels of the node's ranks (a slow status call must
            # not hold the GPUs back, and a failed one keeps the last labels).
            try:
                reading = snapshot_from_json(_ask_json(self._endpoint(rank), ["gpus", "--json"]))
                self._set_gpus(rank, gpus=reading, error=None, answered_at=time.time())
                if entry.session_id is not None:
                    status = _ask_json(self._endpoint(rank), ["status", entry.session_id, "--json", "--no-http"])
                    status = status[0] if isinstance(status, list) and status else status
                    self._set_gpus(rank, owners=_owners(status if isinstance(status, dict) else {}))
            except subprocess.TimeoutExpired as exc:
                self._set_gpus(rank, error=f"no answer within {exc.timeout:g} s")
            except Exception as exc:  # noqa: BLE001 - a lost host is this node's state; the others go on
                self._set_gpus(rank, error=str(exc))
            self._stop.wait(self.interval_s)

    def _set_gpus(self, rank: int, **changes: object) -> None:
        with self._lock:
            self._gpus[rank] = dataclasses.replace(self._gpus[rank], **changes)  # type: ignore[arg-type]

    # -- logs -----------------------------------------------------------------------------------------------

    def _set_log(self, rank: int, **changes: object) -> None:
        with self._lock:
            self._logs[rank] = dataclasses.replace(self._logs[rank], **changes)  # type: ignore[arg-type]
        if self.merger is not None and "streaming" in changes:
            with self.merger.lock:
                self.merger.streaming[rank] = bool(changes["streaming"])

    def _log_loop(self, rank: int) -> None:
        entry = self.record.nodes[rank]
        if entry.session_id is None:
            self._set_log(rank, error="never launched")
            if self.merger is not None:
                self.merger.answer(rank)
            return
        have = 0  # lines mirrored so far: a restarted stream skips these
        key = ""
        arrivals: dict[int, tuple[str, str | None]] = {}
        backoff = BACKOFF_FIRST_S
        with open(self._logs[rank].path, "a", encoding="utf-8") as out:
            while not self._stop.is_set():
                try:
                    proc = self._endpoint(rank).link.popen(["logs", entry.session_id, "-f"])
                except Exception as exc:  # noqa: BLE001 - no ssh, a bad host: said, retried
                    self._set_log(rank, streaming=False, error=str(exc))
                    if self.merger is not None:
                        self.merger.answer(rank)
                    self._stop.wait(backoff)
                    backoff = min(BACKOFF_MAX_S, backoff * 2)
                    continue
                with self._lock:
                    self._procs[rank] = proc
                self._set_log(rank, streaming=True, error=None)
                seen = 0
                assert proc.stdout is not None
                for raw in proc.stdout:
                    seen += 1
                    if seen <= have:
                        continue
                    text = raw.rstrip("\n")
                    out.write(text + "\n")
                    out.flush()
                    have += 1
                    key = _sort_key(text, key)
                    if self.merger is not None:
                        self.merger.add(rank, key, text)
                    changes: dict[str, object] = {"lines": have}
                    for match in INIT_LINE_RE.finditer(text):
                        tp = int(match["rank"])
                        begun = arrivals.get(tp, (key, None))[0]
                        arrivals[tp] = (begun, key if match["what"] == "ends" else None)
                        changes["arrivals"] = tuple((r, b, e) for r, (b, e) in sorted(arrivals.items()))
                    self._set_log(rank, **changes)
                    backoff = BACKOFF_FIRST_S
                code = _end(proc)
                stderr = proc.stderr.read() if proc.stderr is not None else ""
                with self._lock:
                    self._procs.pop(rank, None)
                if self._stop.is_set():
                    break
                why = (f"unreachable: {ssh_reason(stderr)}" if code == SSH_FAILED
                       else f"the log stream ended (exit {code}); asking again in {backoff:.0f} s")
                self._set_log(rank, streaming=False, error=why)
                if self.merger is not None:
                    self.merger.answer(rank)
                self._stop.wait(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)

    def _merge_loop(self) -> None:
        while not self._stop.wait(MERGE_TICK_S):
            if self.merger is not None:
                self.merger.flush()
        if self.merger is not None:
            self.merger.close()


def _end(proc: subprocess.Popen[str]) -> int:
    """End a stream this view started (its own child, by its Popen) and reap it; its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def _ask_json(node: NodeEndpoint, args: list[str]) -> object:
    result = node.call(args, CALL_TIMEOUT_S)
    if result.returncode == SSH_FAILED:
        raise ConnectionError(f"unreachable: {ssh_reason(result.stderr)}")
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise ValueError(f"{' '.join(args)} on {node.name} printed no JSON (exit {result.returncode}): "
                         f"{ssh_reason(result.stderr)}") from None


def _owners(status: dict) -> dict[int, str]:
    """pid -> label of a node's session, from its ``status --json``: "TP5" (the node's log names global
    ranks), "detok", "main"."""
    owners: dict[int, str] = {}
    for row in status.get("ranks") or []:
        if not isinstance(row, dict) or not isinstance(row.get("pid"), int):
            continue
        if row.get("rank") is not None:
            dp = row.get("dp_rank")
            owners[row["pid"]] = f"TP{row['rank']}" if dp is None else f"DP{dp} TP{row['rank']}"
        else:
            owners[row["pid"]] = "detok" if row.get("role") == "detokenizer" else str(row.get("role") or "proc")
    if isinstance(status.get("pid"), int):
        owners.setdefault(status["pid"], "main")
    return owners


__all__ = ["MERGED", "NodeGpus", "NodeLog", "NodesDetail", "view_dir"]
