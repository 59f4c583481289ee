"""The SGLang emulator as a real server, for the tests that start one: ``Emulator`` (a real
``python -m sessions.emulator`` process tree in its own session, cwd in tmp_path, stderr and stdout to
separate files, killed by pid), the log-line regexes of sglang-facts §1.3-1.5 (the 0.5.23 formats), HTTP
helpers and model dirs.  The ``models`` and ``emulators`` fixtures are in conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from _extract_support import wait_for

REPO_ROOT = Path(__file__).resolve().parent.parent
SCALE = "0.002"
WAIT_S = 90.0  # a hang guard for slow CI machines, not a speed assertion
# sglang-facts §1.3: the generic line regex
LINE_RE = re.compile(
    r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?)"
    r"(?P<ranks>(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)\] "
    r"(?P<msg>.*)$"
)
LOAD_WEIGHT_END_RE = re.compile(
    r"^Load weight end\. elapsed=(?P<s>[\d.]+) s, type=(?P<cls>\w+), (?:(?P<quant>quant=.*?), )?"
    r"avail mem=(?P<avail>[\d.]+) GB, mem usage=(?P<use>[\d.]+) GB\.$"
)
WEIGHT_BAR_RE = re.compile(
    r"(?P<desc>Multi-thread loading shards):\s+(?P<pct>\d+)% Completed \| (?P<n>\d+)/(?P<total>\d+) "
    r"\[(?P<elapsed>[^<]+)<(?P<remaining>[^,]+),"
)
DECODE_BAR_RE = re.compile(
    r"Capturing batches \(bs=(?P<bs>\d+) avail_mem=(?P<gb>[\d.]+) GB\):\s+(?P<pct>\d+)%\|.*?\| "
    r"(?P<n>\d+)/(?P<total>\d+)"
)
STARTUP_TIMINGS_RE = re.compile(
    r"^Engine startup timings \(s\): load_weight=([\d.]+), kv_cache_allocation=([\d.]+), "
    r"scheduler_e2e=([\d.]+), "
    r"cuda_graph=\{([^}]*)\}, tokenizer_e2e=([\d.]+)$"
)
KV_RE = re.compile(r"^(?:.+ )?KV Cache (?:is allocated|VA upper bound)\. dtype: (\S+), #tokens: (\d+), ")



# -- helpers ---------------------------------------------------------------------------------------------


def get_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, deadline_s: float = WAIT_S, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value (a hang guard, not a speed assertion)."""
    return wait_for(predicate, what, deadline_s, interval_s=0.05)


def write_model_dir(root: Path, name: str, config: dict[str, Any]) -> Path:
    model_dir = root / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config))
    return model_dir


class Emulator:
    """One ``python -m sessions.emulator`` process tree, started in its own session."""

    def __init__(
        self,
        workdir: Path,
        model_dir: Path,
        *flags: str,
        tp: int = 2,
        fault: str = "none",
        scale: str = SCALE,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = get_free_port()
        self.err_path, self.out_path = workdir / "stderr.log", workdir / "stdout.log"
        self.argv = [
            sys.executable,
            "-m",
            "sessions.emulator",
            "--model-path",
            str(model_dir),
            "--tp-size",
            str(tp),
            "--port",
            str(self.port),
            "--time-scale",
            scale,
            "--emulate-fault",
            fault,
            *flags,
        ]
        run_env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), **(env or {}))
        with open(self.err_path, "wb") as err, open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=workdir,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=run_env,
            )
        self.known: dict[int, float] = {}  # pid -> create_time of everything seen in the tree
        self.remember()

    @property
    def stderr(self) -> str:
        return self.err_path.read_bytes().decode(errors="replace")  # bytes: keep tqdm's \r as it is

    @property
    def stdout(self) -> str:
        return self.out_path.read_bytes().decode(errors="replace")

    def lines(self) -> list[str]:
        """stderr split the way a log reader must split it: on \\n, on tqdm's \\r, and where another rank's
        line starts right after a bar render that has no newline yet (as in fixture 27)."""
        return [
            line
            for line in re.split(r"[\r\n]|(?=\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})", self.stderr)
            if line
        ]

    def messages(self, ranks: str | None = None) -> list[tuple[str, str]]:
        """(rank prefix, message) of every prefixed log line."""
        out = []
        for line in self.lines():
            match = LINE_RE.match(line)
            if match and (ranks is None or match["ranks"].strip() == ranks):
                out.append((match["ranks"].strip(), match["msg"]))
        return out

    def remember(self) -> None:
        try:
            main = psutil.Process(self.proc.pid)
            for proc in [main, *main.children(recursive=True)]:
                self.known.setdefault(proc.pid, proc.create_time())
        except psutil.Error:
            pass

    def children(self) -> list[psutil.Process]:
        self.remember()
        return psutil.Process(self.proc.pid).children(recursive=True)

    def wait_for(self, text: str | re.Pattern[str], count: int = 1, deadline_s: float = WAIT_S) -> str:
        """Wait until stderr holds ``text`` ``count`` times; fail if the server exits first."""
        end = time.monotonic() + deadline_s
        while True:
            log = self.stderr
            found = len(re.findall(text, log)) if isinstance(text, re.Pattern) else log.count(text)
            if found >= count:
                self.remember()
                return log
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"emulator exited {self.proc.returncode} before {text!r}:\n{log[-3000:]}"
                )
            if time.monotonic() > end:
                raise AssertionError(f"no {text!r} after {deadline_s}s:\n{log[-3000:]}")
            time.sleep(0.02)

    def wait_ready(self) -> None:
        self.wait_for("The server is fired up and ready to roll!")

    def wait_exit(self, deadline_s: float = WAIT_S) -> int:
        try:
            return self.proc.wait(deadline_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"emulator still running after {deadline_s}s:\n{self.stderr[-3000:]}"
            ) from None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def kill(self) -> None:
        """SIGKILL every process of the tree that we saw, by (pid, create_time), and reap the main one."""
        self.remember()
        for pid, created in self.known.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created:
                    proc.kill()
            except psutil.Error:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def gone(pid: int, created: float) -> bool:
    """The process no longer runs (reaped, or a zombie waiting for its new parent to reap it)."""
    try:
        proc = psutil.Process(pid)
        return proc.create_time() != created or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(identities: dict[int, float], deadline_s: float = WAIT_S) -> list[int]:
    """Pids still running after the deadline (empty when every process ended)."""
    end = time.monotonic() + deadline_s
    while True:
        alive = [pid for pid, created in identities.items() if not gone(pid, created)]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.05)


def http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None, timeout_s: float = 30.0
) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_json(method: str, url: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
    status, raw = http(method, url, body, **kwargs)
    return status, json.loads(raw) if raw else None


def port_refuses(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2.0)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def pyspy_stack(pid: int, needle: str) -> str:
    """py-spy's dump of ``pid`` once it shows ``needle`` (a rank may still be a step before its block)."""
    exe = Path(sys.executable).with_name("py-spy")
    end = time.monotonic() + WAIT_S
    while True:
        result = subprocess.run(
            [str(exe), "dump", "--pid", str(pid)], check=False, capture_output=True, text=True, timeout=60
        )
        if result.returncode != 0 and "ermission" in (result.stderr + result.stdout):
            pytest.skip(f"py-spy may not attach here (ptrace not permitted): {result.stderr.strip()[:200]}")
        assert result.returncode == 0, result.stderr
        if needle in result.stdout or time.monotonic() > end:
            return result.stdout
        time.sleep(0.1)


def titled(emulator: Emulator) -> dict[str, psutil.Process]:
    out = {}
    for proc in emulator.children():
        try:
            out[" ".join(proc.cmdline()).strip()] = proc
        except psutil.Error:
            pass
    return out
