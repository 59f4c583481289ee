"""The main process of the emulated server: SGLang 0.5.23's launch sequence, supervision and shutdown.

Sequence (sglang-facts §1.1-1.6): the ``python -m sglang.launch_server`` UserWarning, ``server_args={...}``,
spawn one scheduler per TP rank and the detokenizer (spawn context, PDEATHSIG, shared process group),
wait until every scheduler reports ready (a rank that died is noticed on a 5 s poll), ``Engine startup
timings``, uvicorn's startup lines, bind the port (only now), warmup (``GET /model_info``, ``POST
/generate``), ``The server is fired up and ready to roll!``.

Signals, as in SGLang (sglang-facts §6, §7):
* SIGQUIT before the first request: ``Received sigquit from a child process. It usually means the child
  failed.`` and the whole tree is SIGKILLed, this process included.  After it: ``SIGQUIT received. ...``,
  the crash diagnostics (5 s settle, py-spy of every scheduler, the 60 s CUDA coredump wait; all scaled
  by the time scale), then the same kill.
* SIGTERM before the first request has no handler: the default action kills this process and the ranks
  die by PDEATHSIG.  After it: drain (``Gracefully exiting... Remaining number of requests N``), send
  ShutdownReq to the schedulers, wait for them, stop the HTTP server, exit 0.
* A child that exits non-zero after startup: ``Subprocess scheduler_3 (pid=...) crashed with exit code
  -15. Triggering SIGQUIT for cleanup...``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from sessions.emulator import pacing
from sessions.emulator.args import (
    EmulatorOptions,
    deprecation_warnings,
    gpu_id,
    log_level_number,
    parse_args,
    resolve_server_args,
)
from sessions.emulator.console import Console
from sessions.emulator.faults import Fault, never_released_barriers
from sessions.emulator.gpu_memory import EmulatedGpuBoard
from sessions.emulator.model_config import load_model_config
from sessions.emulator.nodes import (
    NodeCollectives,
    NodeLink,
    NodeSchedulerClient,
    node_layout,
    rendezvous_address,
    serve_worker_node,
    wire_link,
)
from sessions.emulator.pacing import Pacing
from sessions.emulator.ranks import RankSpec, run_detokenizer_process, run_scheduler_process
from sessions.emulator.scheduler_client import Collectives, SchedulerClient

_WARMUP_PROMPT = "The capital city of France is"


def _warn_entrypoint() -> None:
    # sglang/launch_server.py:51 warns at import, before the flags are even parsed.
    warnings.warn(
        "'python -m sglang.launch_server' is still supported, "
        "but 'sglang serve' is the recommended entrypoint."
        "\n  Example: sglang serve --model-path <model> [options]",
        UserWarning,
        stacklevel=1,
    )


def main(argv: list[str] | None = None, engine_for: Callable[[Any], type[Engine]] | None = None) -> int:
    """``engine_for(ns)``: the Engine class for the parsed flags (``dp.engine_for`` picks the DP controller's
    for ``--dp-size N``; it builds on this module, so it is passed in rather than imported here)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _warn_entrypoint()
    ns, options = parse_args(argv)  # bad flags: argparse exits 2
    engine = (engine_for(ns) if engine_for is not None else Engine)(ns, options, argv)
    try:
        return engine.launch_server()
    except KeyboardInterrupt:
        return 130
    finally:
        # sglang/launch_server.py:84-86: always kill_process_tree(os.getpid(), include_parent=False)
        engine.kill_process_tree(include_parent=False)
        engine.close()


class Engine:
    """One emulated server: its children, its HTTP front and its signal handling."""

    def __init__(self, ns: Any, options: EmulatorOptions, argv: list[str]) -> None:
        self.ns = ns
        self.options = options
        self.argv = argv
        self.pid = os.getpid()
        self.pacing = Pacing(options.time_scale)
        try:
            level = log_level_number(ns.log_level)
            http_level = log_level_number(ns.log_level_http) if ns.log_level_http else level
        except ValueError:
            level = http_level = logging.INFO  # resolve_server_args raises the proper error
        self.console = Console(level=level, http_level=http_level)
        self.processes: dict[str, multiprocessing.process.BaseProcess] = {}  # "scheduler_3" -> process
        self.rank_processes: dict[int, multiprocessing.process.BaseProcess] = {}
        self.aux_conns: list[multiprocessing.connection.Connection] = []
        self.board: EmulatedGpuBoard | None = None
        self.server: Any = None
        self.manager: Any = None
        self.client: SchedulerClient | None = None
        self.gpu_modes: dict[int, str] = {}
        self._wake = threading.Event()
        self._sigterm_received = False
        self._crashing = False
        self.link: NodeLink | None = None  # --nnodes > 1: the rendezvous with the other nodes

    # -- the launch -----------------------------------------------------------------------------------

    def launch_server(self) -> int:
        started = time.time()
        model = load_model_config(self.ns.model_path)
        args = resolve_server_args(self.ns, model, warn=lambda note: self.console.log(note, logging.WARNING))
        self.args, self.model = args, model
        accept = self.options.spec_accept_length
        if accept is not None and args["speculative_num_draft_tokens"] and not (
                1 <= accept <= args["speculative_num_draft_tokens"]):
            raise ValueError(f"--emulate-spec-accept-length {accept} must be between 1 and "
                             f"speculative_num_draft_tokens={args['speculative_num_draft_tokens']}")
        for note in deprecation_warnings(self.ns):
            self.console.log(note, logging.WARNING)
        self.pacing.sleep(pacing.MAIN_RESOLVE_S)
        # One handler per signal for the whole run, dispatching on whether the event loop has started:
        # handlers can only be installed from the main thread, but the first request arrives on another.
        signal.signal(signal.SIGQUIT, self._sigquit_handler)
        signal.signal(signal.SIGTERM, self._sigterm_handler)
        self.console.log(f"server_args={args!r}")
        os.environ["SGLANG_RUN_ID"] = f"sglang-run-{int(time.time())}-{uuid.uuid4().hex[:8]}"
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "8")
        conns = self._start_children(args)
        tokenizer_ready_s = self.pacing.scaled(pacing.TOKENIZER_INIT_S)
        if args["soft_watchdog_timeout"]:
            self.console.log("Watchdog TokenizerManager initialized.")
        ready = self._wait_for_ready(conns)
        if args["node_rank"] >= 1:
            return serve_worker_node(self)  # engine.py:1234-1284: no tokenizer, no API, a dummy health app
        self._log_startup_timings(ready, max(tokenizer_ready_s, 0.0))
        assert self.client is not None
        self.client.start_readers()
        return self._serve(ready, started)

    def _start_children(self, args: dict[str, Any]) -> dict[int, multiprocessing.connection.Connection]:
        # Spawn from the main thread: PDEATHSIG fires when the *thread* that forked the child exits.
        ctx = multiprocessing.get_context("spawn")
        cwd = Path.cwd()
        self.board = EmulatedGpuBoard(cwd, self.pid, self.options.gpus)
        conns: dict[int, multiprocessing.connection.Connection] = {}
        layout = node_layout(args)
        never = never_released_barriers(self.options.fault)
        if layout.is_multi_node:
            last_node = layout.node_rank == layout.nnodes - 1
            self.link = NodeLink(
                layout, rendezvous_address(args), self.console, never,
                connect=not (last_node and self.options.fault is Fault.NODE_NEVER_JOINS),
                source_host=str(args["host"] or ""),
            )
            if layout.node_rank == 0:
                self.link.listen()
            else:
                self.link.start_client()
        for rank in layout.local_ranks:
            parent_end, child_end = ctx.Pipe(duplex=True)
            spec = RankSpec(args, rank, gpu_id(args, rank), self.pid, self.options)
            process = ctx.Process(
                target=run_scheduler_process, args=(spec, child_end), name=f"scheduler_{rank}"
            )
            process.start()
            child_end.close()
            conns[rank] = parent_end
            self.rank_processes[rank] = process
            self.processes[f"scheduler_{rank}"] = process
            self.board.set_rank(rank, process.pid, gpu_id(args, rank))
        titles = ["sglang::detokenizer"] if layout.node_rank == 0 else []  # other nodes run no detokenizer
        if args["attn_dp_size"] > 1 and layout.node_rank == 0:
            titles.append("sglang::data_parallel_controller")
        for title in titles:
            parent_end, child_end = ctx.Pipe(duplex=True)
            process = ctx.Process(
                target=run_detokenizer_process,
                name=title.split("::")[1],
                args=(self.pid, child_end, title, args["log_level"], bool(args["soft_watchdog_timeout"])),
            )
            process.start()
            child_end.close()
            self.aux_conns.append(parent_end)
            self.processes[title.split("::")[1]] = process
        self.board.start()
        if self.link is not None:
            client = NodeSchedulerClient(
                conns, NodeCollectives(layout.local_ranks, never, self.link), self._on_rank_report
            )
            wire_link(self, client, self.link)
            self.client = client
        else:
            self.client = SchedulerClient(conns, Collectives(conns, never), self._on_rank_report)
        return conns

    def _on_rank_report(self, message: tuple[Any, ...]) -> None:
        assert self.board is not None
        if message[0] == "mem":
            self.board.update(message[1], message[2], message[3])
        elif message[0] == "gpu":
            self.gpu_modes[message[1]] = message[2]
            if len(self.gpu_modes) == len(self.rank_processes) and all(
                m == "real" for m in self.gpu_modes.values()
            ):
                self.board.disable()  # NVML shows the real memory

    def _wait_for_ready(
        self, conns: dict[int, multiprocessing.connection.Connection]
    ) -> dict[int, dict[str, Any]]:
        """Read the ranks until all are ready (engine.py wait_for_ready); RuntimeError if one died."""
        assert self.client is not None
        ready: dict[int, dict[str, Any]] = {}
        open_conns = {conn: rank for rank, conn in conns.items()}
        poll_s = self.pacing.poll_interval(pacing.INIT_DEATH_POLL_S, floor_s=0.05)
        next_check = time.monotonic() + poll_s
        while len(ready) < len(conns):
            timeout = max(0.0, next_check - time.monotonic())
            for ready_object in multiprocessing.connection.wait(list(open_conns), timeout):
                # wait() returns some of the objects it was given, all Connections here; typeshed types the
                # result as any waitable (Connection | socket | int).
                conn = cast(multiprocessing.connection.Connection, ready_object)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    open_conns.pop(conn, None)  # the rank is gone; the poll below reports it
                    continue
                if message[0] == "ready":
                    ready[message[1]] = message[2]
                else:
                    self.client.dispatch(message)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + poll_s
                for rank, process in self.rank_processes.items():
                    if process.exitcode is not None:
                        # engine.py:2002-2042
                        raise RuntimeError(
                            f"Rank {rank} scheduler died during initialization "
                            f"(exit code: {process.exitcode}). "
                            "If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. "
                            "Run `dmesg -T | grep -i oom` to check."
                        )
        return ready

    def _log_startup_timings(self, ready: dict[int, dict[str, Any]], tokenizer_s: float) -> None:
        def worst(key: str) -> float:
            return max((info.get(key, 0.0) for info in ready.values()), default=0.0)

        graphs: dict[str, float] = {}
        for info in ready.values():
            for phase, seconds in info.get("cuda_graph_s", {}).items():
                graphs[phase] = max(graphs.get(phase, 0.0), seconds)
        graph_text = ", ".join(f"{phase}={seconds:.2f}" for phase, seconds in graphs.items())
        self.console.log(
            f"Engine startup timings (s): load_weight={worst('load_weight_s'):.2f}, "
            f"kv_cache_allocation={worst('kv_cache_allocation_s'):.2f}, "
            f"scheduler_e2e={worst('scheduler_e2e_s'):.2f}, "
            f"cuda_graph={{{graph_text}}}, tokenizer_e2e={tokenizer_s:.2f}"
        )

    # -- serving --------------------------------------------------------------------------------------

    def _serve(self, ready: dict[int, dict[str, Any]], started: float) -> int:
        from sessions.emulator.http import EmulatorHTTPServer
        from sessions.emulator.tokenizer_manager import TokenizerManager

        assert self.client is not None
        args = self.args
        launch_command = [sys.executable, "-m", "sessions.emulator", *self.argv]
        self.manager = TokenizerManager(
            args, self.model, self.client, self.console, launch_command, ready, started
        )
        self.pacing.sleep(pacing.UVICORN_START_S)
        console = self.console
        console.uvicorn(f"Started server process [{self.pid}]")
        console.uvicorn("Waiting for application startup.")
        console.uvicorn("Application startup complete.")
        host, port = args["host"], args["port"]
        self.server = EmulatorHTTPServer(host, port, self.manager, console)
        try:
            if self.options.fault is Fault.ADDRESS_IN_USE:
                raise OSError(
                    98,
                    f"error while attempting to bind on address ({host!r}, {port}): address already in use",
                )
            self.server.bind()
        except OSError as exc:
            # uvicorn Server.startup: log the error, run the lifespan shutdown, sys.exit(1)
            console.uvicorn(str(exc), logging.ERROR)
            console.uvicorn("Waiting for application shutdown.")
            console.uvicorn("Application shutdown complete.")
            self.server = None
            return 1
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="uvicorn", daemon=True
        ).start()
        url_host = f"[{host}]" if ":" in host else host
        console.uvicorn(f"Uvicorn running on http://{url_host}:{port} (Press CTRL+C to quit)")
        threading.Thread(target=self._wait_and_warmup, name="warmup", daemon=True).start()
        return self._supervise()

    def _local_url(self, path: str) -> str:
        host = self.args["host"]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.args['port']}{path}"

    def _http(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> int:
        # No proxies: the server talks to itself (sglang#9155 is what a proxy does to the warmup).
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        headers = {"content-type": "application/json"}
        if self.args["api_key"]:
            headers["authorization"] = f"Bearer {self.args['api_key']}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self._local_url(path), data=data, headers=headers, method=method)
        with opener.open(request, timeout=timeout_s) as response:
            response.read()
            return response.status

    def _wait_and_warmup(self) -> None:
        """http_server.py:2360-2600: wait for /model_info, send one generation, then declare ready."""
        manager = self.manager
        try:
            for _attempt in range(120):
                try:
                    self._http("GET", "/model_info", None, timeout_s=5)
                    break
                except OSError:
                    time.sleep(1)
            if not self.args["skip_server_warmup"]:
                self.pacing.sleep(pacing.WARMUP_S)  # the first forward: kernel loading, JIT
                body: dict[str, Any] = {"sampling_params": {"temperature": 0, "max_new_tokens": 8}}
                if self.args["skip_tokenizer_init"]:
                    body["input_ids"] = [10, 11, 12]
                else:
                    body["text"] = _WARMUP_PROMPT
                warmup_timeout = float(os.environ.get("SGLANG_WARMUP_TIMEOUT", "-1"))
                status = self._http(
                    "POST", "/generate", body, timeout_s=600 if warmup_timeout < 0 else warmup_timeout
                )
                if status != 200:
                    raise AssertionError(f"warmup /generate answered {status}")
                self._http("POST", "/freeze_gc", {}, timeout_s=30)
        except Exception:  # noqa: BLE001 - any warmup failure ends the server, as in SGLang
            self.console.log(
                f"Initialization failed. warmup error: {traceback.format_exc().rstrip()}", logging.ERROR
            )
            self.kill_process_tree(include_parent=True)
            return
        from sessions.emulator.tokenizer_manager import ServerStatus

        manager.status = ServerStatus.UP
        self.console.log("The server is fired up and ready to roll!")

    def _supervise(self) -> int:
        """The main thread after startup: SubprocessWatchdog, handlers once the loop runs, SIGTERM drain."""
        watchdog_s = self.pacing.poll_interval(pacing.WATCHDOG_POLL_S, floor_s=0.05)
        next_watchdog = time.monotonic() + watchdog_s
        reported: set[str] = set()
        while True:
            if self._sigterm_received:
                return self._drain_and_shutdown()
            if time.monotonic() >= next_watchdog:
                next_watchdog = time.monotonic() + watchdog_s
                for name, process in self.processes.items():
                    code = process.exitcode
                    if code not in (None, 0) and name not in reported:
                        reported.add(name)
                        self.console.log(
                            f"Subprocess {name} (pid={process.pid}) crashed with exit code {code}. "
                            "Triggering SIGQUIT for cleanup...",
                            logging.ERROR,
                        )
                        os.kill(self.pid, signal.SIGQUIT)
            self._wake.wait(max(0.0, next_watchdog - time.monotonic()))
            self._wake.clear()

    # -- signals --------------------------------------------------------------------------------------

    def _loop_started(self) -> bool:
        return self.manager is not None and self.manager.loop_started.is_set()

    def _sigquit_handler(self, signum: int, frame: Any) -> None:
        if self._loop_started():
            self._running_phase_sigquit_handler(signum, frame)
        else:
            self._launch_phase_sigquit_handler(signum, frame)

    def _launch_phase_sigquit_handler(self, signum: int, frame: Any) -> None:
        self.console.log(
            "Received sigquit from a child process. It usually means the child failed.", logging.ERROR
        )
        self.kill_process_tree(include_parent=True)

    def _running_phase_sigquit_handler(self, signum: int, frame: Any) -> None:
        if self._crashing:
            return
        self._crashing = True
        self.console.log(
            f"SIGQUIT received. signum={signum}, frame={frame}. It usually means one child failed.",
            logging.ERROR,
        )
        self._dump_before_crash()
        self.kill_process_tree(include_parent=True)

    def _sigterm_handler(self, signum: int, frame: Any) -> None:
        if not self._loop_started():
            # Before SGLang's event loop runs there is no SIGTERM handler: the default action kills this
            # process, and the ranks follow by PDEATHSIG (sglang-facts §7).
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(self.pid, signal.SIGTERM)
            return
        if self._sigterm_received:
            return
        self.console.log(
            f"SIGTERM received. signum={signum} frame={frame}. Draining requests and shutting down...",
            logging.WARNING,
        )
        self._sigterm_received = True
        self.manager.gracefully_exit = True
        self._wake.set()

    def _dump_before_crash(self) -> None:
        """dump_requests_before_crash (tokenizer_manager.py:3392-3506), its waits scaled."""
        pyspy = os.environ.get("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "1") not in ("0", "false", "False")
        coredump = os.environ.get("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "1") not in ("0", "false", "False")
        if not (pyspy or coredump):
            return
        self.console.log("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
        self.pacing.sleep(pacing.CRASH_SETTLE_S)
        live = self.live_scheduler_pids()
        if not live:
            self.console.log(
                "No live scheduler processes found; skipping py-spy and CUDA coredump.", logging.ERROR
            )
            return
        if pyspy:
            for pid in live:
                self._pyspy_dump(pid)
        if coredump:
            if os.environ.get("CUDA_ENABLE_USER_TRIGGERED_COREDUMP") != "1":
                self.console.log(
                    "CUDA user-triggered coredump is not enabled. Set CUDA_ENABLE_USER_TRIGGERED_COREDUMP=1 "
                    "before CUDA initialization.",
                    logging.ERROR,
                )
            wait_s = float(os.environ.get("SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS", "60"))
            if wait_s > 0:
                self.console.log(f"Waiting {wait_s:.1f} seconds for CUDA coredumps before exiting.")
                self.pacing.sleep(wait_s)

    def live_scheduler_pids(self) -> list[int]:
        """The schedulers still running (the crash dump py-spies each)."""
        return [p.pid for p in self.rank_processes.values() if p.exitcode is None and p.pid is not None]

    def _pyspy_dump(self, pid: int) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        command = [exe, "dump", "--pid", str(pid)]
        shown = f"py-spy dump --pid {pid}"
        try:
            result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.console.log(f"Pyspy failed ({shown}). Error: {exc}", logging.ERROR)
            return
        if result.returncode == 0:
            self.console.log(f"Pyspy dump for PID {pid} ({shown}):\n{result.stdout.rstrip()}")
        else:
            self.console.log(
                f"Pyspy failed ({shown}). Error: {(result.stderr or result.stdout).strip()}", logging.ERROR
            )

    # -- shutdown -------------------------------------------------------------------------------------

    def _drain_and_shutdown(self) -> int:
        """tokenizer_manager.py sigterm_watchdog, then ShutdownReq to the schedulers; exit 0."""
        poll_s = self.pacing.poll_interval(pacing.DRAIN_POLL_S, floor_s=0.02)
        time.sleep(poll_s)
        while True:
            remaining = self.manager.in_flight()
            self.console.log(
                f"Gracefully exiting... Remaining number of requests {len(remaining)}. "
                f"Remaining requests remaining_rids={remaining}."
            )
            if not remaining:
                break
            time.sleep(poll_s)
        assert self.client is not None
        self.client.broadcast("shutdown")
        for conn in self.aux_conns:
            try:
                conn.send(("shutdown",))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + max(1.0, self.pacing.scaled(pacing.SHUTDOWN_WAIT_S))
        for process in self.processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
        alive = [p.pid for p in self.processes.values() if p.exitcode is None]
        if alive:
            self.console.log(
                f"Schedulers still alive 15s after ShutdownReq, killing them before they released: {alive}",
                logging.WARNING,
            )
        self.kill_process_tree(include_parent=False)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.console.uvicorn("Shutting down")
        self.console.uvicorn("Waiting for application shutdown.")
        self.console.uvicorn("Application shutdown complete.")
        self.console.uvicorn(f"Finished server process [{self.pid}]")
        return 0

    def kill_process_tree(self, include_parent: bool) -> None:
        """utils/common.py:2507-2563: SIGKILL every descendant (and this process when asked)."""
        try:
            import psutil

            children = psutil.Process(self.pid).children(recursive=True)
        except Exception:  # noqa: BLE001 - psutil missing or racing: fall back to the children we know
            children = []
        alive = [p for p in self.processes.values() if p.exitcode is None]
        if not (children or alive or include_parent):
            return  # nothing left to kill (the clean shutdown already did it)
        self.console.log(
            f"kill_process_tree called: parent_pid={self.pid}, include_parent={include_parent}, "
            f"pid={self.pid}"
        )
        for child in children:
            with contextlib.suppress(Exception):  # already gone
                child.kill()
        for process in alive:
            try:
                process.kill()
            except OSError:
                pass
        # Reap before going: a SIGKILLed child stays a zombie until its parent waits for it.
        for process in self.processes.values():
            process.join(5)
        for child in children:
            with contextlib.suppress(Exception):  # not our child, or gone
                child.wait(timeout=1)  # our other children (the resource tracker)
        if include_parent:
            os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        if self.board is not None:
            self.board.stop(remove=True)
        if self.server is not None:
            self.server.server_close()
        with contextlib.suppress(Exception):  # already stopped or never started
            from multiprocessing import resource_tracker

            # close its pipe and reap it; _stop is private CPython API that typeshed does not declare
            resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]
