"""Shared fixtures: a private home, free ports, emulator model dirs and profiles, and launched sessions.

* ``home`` - a fresh ``EAGLE3_TUI_HOME`` under ``tmp_path`` (set with monkeypatch, so CLI subprocesses
  started with ``os.environ`` see it too); returns the ensured `Home`.
* ``free_port`` - a TCP port that was free on 127.0.0.1 a moment ago (bind port 0, read it, close).
* ``emulator_model_dir`` / ``small_model_dir`` - config-only model dirs: Kimi-like (DeepseekV3ForCausalLM,
  61 layers, hidden 7168) and a small one (8 layers, hidden 256).  ``make_model_dir(name, **config)``
  makes others.
* ``make_emulator_profile(name, tp=4, fault="none", time_scale=0.003, **overrides)`` - writes
  ``<profiles_dir>/<name>.toml`` with ``launcher = "emulator"`` and loads it.  An override whose value is a
  dict updates that TOML section (``emulator={"gpu_memory_gb": 1}``, ``watch={...}``); ``env={...}`` is
  ``[server.env]``; any other value goes to ``[server]`` (``port=..., cuda_graph=False``).
* ``launched`` - launches and tracks sessions, and ALWAYS stops them at teardown: ``stop()`` first, then
  SIGKILL of every (pid, create_time) it ever saw, then of anything left in the session's process group
  or carrying the session's env id.
  Use ``launched.launch(profile)``, ``launched.track(session_id)`` for sessions a CLI subprocess started,
  and ``launched.remember(session)`` after the ranks are up.
* ``demo_tiny_models`` - (session) the demo's tiny model and EAGLE-3 draft, written once by
  `ensure_demo_home` into a template home; ``seed_demo_models(home)`` copies them into a fresh demo home
  before a test's own `ensure_demo_home`, which then skips the torch child process that writes them (the
  files are seeded, so the copies equal what it would write) and makes everything else itself, with this
  home's paths.  Tests of the writing itself (test_demo_entry, test_demo_answers) do not seed.
* ``tp4_holding_gpus_0_to_3`` - a launched TP4 emulator session (hung after its weights) whose ranks hold
  emulated memory on GPUs 0-3, for launches that must meet GPUs in use.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from sessions.demo import KIMI_K25_CONFIG
from tests._tui_support import install_message_waits

install_message_waits()  # TUI tests wait on the app's messages (tests/_tui_support.wait_until)

REPO_ROOT = Path(__file__).resolve().parent.parent

# A flat DeepSeek-V3 config: the text model of the demo's Kimi-K2.5 config, without the multimodal wrapper.
KIMI_LIKE_CONFIG = KIMI_K25_CONFIG["text_config"] | {"model_type": "deepseek_v3"}
SMALL_CONFIG = KIMI_LIKE_CONFIG | {
    "num_hidden_layers": 8,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
}


_IGNORED_SIGNALS_ENV = "EAGLE3_TESTS_IGNORED_SIGNALS"


def _keep_ignoring(signum: int, frame: object) -> None:
    """Ignore the signal here, as the run was told to; unlike SIG_IGN, a caught signal is not inherited."""


def _interrupt_on_signal(signum: int, frame: object) -> None:
    """SIGTERM/SIGHUP (``timeout``, CI's limit, a closed terminal) become a Ctrl-C: pytest then runs every
    fixture's teardown (`launched`, `emulators`, ...), so the servers the tests started do not outlive the run."""
    signal.signal(signum, signal.SIG_DFL)  # a second signal ends the process at once
    raise KeyboardInterrupt(f"pytest got signal {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    """The run's signals, in the controller and in each xdist worker (each runs this hook).

    * SIGTERM and SIGHUP at their default end the run through its teardowns (`_interrupt_on_signal`).
    * A run started with SIGHUP or SIGINT ignored (``nohup``, a script's background job) would hand that to
      every process a test starts, since SIG_IGN survives exec: the CLI under test then ignores the hangup
      or the Ctrl-C that the test sends it (test_server's SIGHUP and Ctrl-C tests failed so).  Such a
      signal is caught and ignored instead, which exec resets to the default in the children, while pytest
      stays as immune as it was started.  xdist workers learn it from the environment: they are started by
      the controller, after which they no longer see the SIG_IGN themselves."""
    ignored = set(filter(None, os.environ.get(_IGNORED_SIGNALS_ENV, "").split(",")))
    for signum in (signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(signum) == signal.SIG_IGN:
            ignored.add(signal.Signals(signum).name)
    if ignored:
        os.environ[_IGNORED_SIGNALS_ENV] = ",".join(sorted(ignored))
    for name in ignored:
        signal.signal(signal.Signals[name], _keep_ignoring)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, _interrupt_on_signal)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the modules holding ``slow`` tests first, each module kept whole and in its own order.

    pytest-xdist (``-n 2``) hands tests out in this order: a minutes-long end-to-end test that comes late
    keeps one worker busy after the other has run out of work, which CI's wall clock pays in full.  With the
    long ones first, the many short tests fill in around them and both workers end together.  Every worker
    sorts the same collection the same way (a stable sort), as xdist requires."""
    slow_modules = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_modules)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A private eagle3-tui home for this test (EAGLE3_TUI_HOME), created with its folders."""
    from sessions.home import HOME_ENV, resolve_home

    monkeypatch.setenv(HOME_ENV, str(tmp_path / "eagle3-home"))
    monkeypatch.delenv("EAGLE3_TUI_DEMO", raising=False)
    return resolve_home().ensure()


def get_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    return get_free_port()


@pytest.fixture
def make_model_dir(tmp_path: Path) -> Callable[..., Path]:
    """``make_model_dir(name, **config_overrides)``: a model dir holding only a Kimi-like config.json."""

    def make(name: str = "kimi-like", **config: Any) -> Path:
        model_dir = tmp_path / "models" / name
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps(KIMI_LIKE_CONFIG | config, indent=2))
        return model_dir

    return make


@pytest.fixture
def emulator_model_dir(make_model_dir) -> Path:
    return make_model_dir("kimi-like")


@pytest.fixture
def small_model_dir(make_model_dir) -> Path:
    return make_model_dir("small", **SMALL_CONFIG)


@pytest.fixture
def make_emulator_profile(home, emulator_model_dir: Path) -> Callable[..., Any]:
    """Write and load an emulator profile (see the module docstring); each call gets its own free port."""
    import tomli_w

    from sessions.profiles import load_profile

    def make(name: str = "emu", tp: int = 4, fault: str = "none", time_scale: float = 0.003, **overrides: Any):
        doc: dict[str, dict[str, Any]] = {
            "server": {
                "launcher": "emulator",
                "python": sys.executable,
                "model_path": str(emulator_model_dir),
                "tp_size": tp,
                "host": "127.0.0.1",
                "port": get_free_port(),
            },
            "watch": {"stall_after_s": 300},
            "emulator": {"time_scale": time_scale, "fault": fault},
        }
        for key, value in overrides.items():
            if key == "env":
                doc["server"]["env"] = dict(value)
            elif isinstance(value, dict):
                doc.setdefault(key, {}).update(value)
            else:
                doc["server"][key] = value
        path = home.profiles_dir / f"{name}.toml"
        path.write_text(tomli_w.dumps(doc))
        return load_profile(path)

    return make


class LaunchedSessions:
    """Sessions a test started; `cleanup()` makes sure nothing of them outlives the test."""

    def __init__(self, home) -> None:
        self.home = home
        self.sessions: list[Any] = []
        self.identities: set[tuple[int, float]] = set()

    def launch(self, profile):
        from sessions.server import ServerSession

        return self.track(ServerSession.launch(profile, self.home))

    def track(self, session_or_id):
        """Register a session (or the id a CLI subprocess printed) for teardown."""
        from sessions.server import ServerSession

        session = session_or_id
        if isinstance(session_or_id, str):
            session = ServerSession.load(session_or_id.strip(), self.home)
        if all(s.session_id != session.session_id for s in self.sessions):
            self.sessions.append(session)
        self.remember(session)
        return session

    def remember(self, session) -> None:
        """Record the (pid, create_time) of the main process and of every process of its tree now."""
        from sessions import probes

        rec = session.state_record
        if rec.get("pid"):
            self.identities.add((rec["pid"], rec["create_time"]))
            for info in probes.process_tree(rec["pid"], rec["create_time"]):
                self.identities.add(info.identity)

    def cleanup(self) -> None:
        from sessions import probes
        from sessions.server import SESSION_ENV

        # Newest first: a test that kills a server and starts another on its port leaves the old sessions'
        # port held by the newest one, and each old stop() would wait its 2 s for that port to free.
        for session in reversed(self.sessions):
            try:
                self.remember(session)
                session.stop(grace_s=5.0)
            except Exception as exc:  # noqa: BLE001 - keep going: the kills below are the last resort
                print(f"cleanup: stop({session.session_id}) failed: {exc!r}", file=sys.stderr)
        for pid, create_time in self.identities:
            probes.kill_identity(pid, create_time, signal.SIGKILL)
        for session in self.sessions:
            rec = session.state_record
            strays = probes.processes_with_env(SESSION_ENV, session.session_id)
            if rec.get("pid"):
                strays += probes.processes_in_group(rec["pid"], rec["create_time"])
            for proc in strays:
                with contextlib.suppress(psutil.Error):
                    proc.kill()


@pytest.fixture
def launched(home):
    registry = LaunchedSessions(home)
    try:
        yield registry
    finally:
        registry.cleanup()


@pytest.fixture(scope="session")
def demo_tiny_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model and draft dirs of a template demo home made once per worker (see the docstring)."""
    from sessions.demo import ensure_demo_home, tiny_draft_dir, tiny_model_dir
    from sessions.home import HOME_ENV, resolve_home

    root = tmp_path_factory.mktemp("demo-template")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HOME_ENV, str(root / "eagle3-home"))
        mp.delenv("EAGLE3_TUI_DEMO", raising=False)
        template = ensure_demo_home(resolve_home(demo=True))
    model, draft = tiny_model_dir(template), tiny_draft_dir(template)
    assert (model / "model.safetensors").is_file() and (draft / "model.safetensors").is_file(), \
        "the template demo home has no tiny model (torch & co. missing?)"
    return model, draft


@pytest.fixture
def seed_demo_models(demo_tiny_models: tuple[Path, Path]) -> Callable[[Any], None]:
    """``seed_demo_models(home)``: copy the template's tiny model and draft into ``home``'s demo root."""
    import shutil

    from sessions.demo import tiny_draft_dir, tiny_model_dir
    from sessions.home import ensure_private_dir, resolve_home

    def seed(home: Any = None) -> None:
        target_home = (home if home is not None else resolve_home(demo=True)).ensure()
        for made, target in zip(demo_tiny_models, (tiny_model_dir(target_home), tiny_draft_dir(target_home))):
            if not (target / "model.safetensors").is_file():
                ensure_private_dir(target.parent)
                shutil.copytree(made, target, dirs_exist_ok=True)

    return seed


@pytest.fixture
def tp4_holding_gpus_0_to_3(launched, make_emulator_profile, home):
    """A TP4 emulator session whose ranks publish emulated memory on GPUs 0-3 (the demo's GPUs)."""
    session = launched.launch(make_emulator_profile("holder", tp=4, fault="hang-after-weights",
                                                    watch={"stall_after_s": 600}))
    from sessions.gpus import EmulatedSource
    from tests._extract_support import wait_for

    def held() -> bool:
        snap = EmulatedSource(home).snapshot()
        return sum(1 for s in snap.samples if s.index < 4 and s.processes) == 4

    wait_for(held, "emulated memory on GPUs 0-3", 90, interval_s=0.1)
    launched.remember(session)
    return session


@pytest.fixture
def cli_env(home) -> dict[str, str]:
    """The environment for `python -m app ...` subprocesses: this test's home, our checkout importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    return env


@pytest.fixture
def ssh_hosts(tmp_path: Path, home):
    """Two real sshd "hosts" (h2, h3) of this test's home, each with its own home (tests/_ssh_support.py)."""
    from tests._ssh_support import SshHosts

    hosts = SshHosts(tmp_path / "ssh", home)
    try:
        yield hosts.start()
    finally:
        hosts.stop()


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    """Config-only model dirs for the emulator tests (tests/_emulator_support.py): Kimi-like, small, and
    Kimi-K2.5's nested config."""
    from _emulator_support import write_model_dir

    kimi_k25 = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {k: v for k, v in KIMI_LIKE_CONFIG.items() if k != "architectures"},
        "vision_config": {"model_type": "moonvit", "hidden_size": 1152},
    }
    return {
        "kimi": write_model_dir(tmp_path / "models", "kimi-like", KIMI_LIKE_CONFIG),
        "small": write_model_dir(tmp_path / "models", "small", SMALL_CONFIG),
        "kimi_k25": write_model_dir(tmp_path / "models", "kimi-k25", kimi_k25),
    }


@pytest.fixture
def emulators():
    """The `Emulator`s a test appends here are killed (by pid) at its teardown."""
    from _emulator_support import Emulator

    started: list[Emulator] = []
    try:
        yield started
    finally:
        for emulator in started:
            emulator.kill()
