"""The log core (sessions/logs/): the rank rule over every SGLang prefix form, the cleaning rule, the one
filter, special files refused at once, the `logs` CLI's grep-like exit codes, and the old readers gone.

The rank table is made of real lines from the SGLang logs in the fixture set (copied here: file and
version in the comment), plus the prefix forms SGLang's scheduler can print that those logs lack.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sessions.logs import MAIN_RANK, LogFile, LogFileError, LogFilter, clean, open_log, rank_of, read_tail
from sessions.logs.lines import lines_of_text

REPO_ROOT = Path(__file__).resolve().parent.parent
CLI_TIMEOUT_S = 60  # a special file must be answered at once; this only stops a hang from hanging CI

RANK_TABLE = [
    # 0.4.x, 01-qwq32b-4xl4-tp4-ready.log
    ("[2025-03-08 12:29:04] server_args=ServerArgs(model_path='/home/model/Qwen/QwQ-32B')", None),
    # 0.4.x tp32, 02-r1-4x8a100-tp32-stops-after-load-weight-end.log
    ("[2025-02-22 08:19:45 TP31] Load weight begin. avail mem=78.41 GB", 31),
    # 0.3/0.4 time-only prefix, 10-deepseek-v25-tp8-capture-exception.log
    ("[23:17:01 TP7] Load weight end. type=DeepseekV2ForCausalLM, dtype=torch.bfloat16, avail mem=22.01 GB", 7),
    ("[23:17:08 TP4] Exception in run_tp_server:", 4),
    # torch.distributed's own prefix, 12-multinode-gloo-connectfullmesh-failed.log
    ("[rank10]:[E130 18:11:34.707542570 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed with", 10),
    # DP attention, 14-r1-mi300-rocm-negative-kv-token-budget.log
    ("[2025-07-02 07:41:58 DP0 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16", 0),
    ("[2025-07-02 07:41:59 DP7 TP7] max_total_tokens=131072 is larger than the profiled value -561981.", 7),
    # 0.5.8, 23-glm5-fp8-mi355x-tp8-0.5.8post1-capture-typeerror.log
    ("[2026-02-26 05:35:13 TP7] Scheduler hit an exception: Traceback (most recent call last):", 7),
    ("[Gloo] Rank 0 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7", None),
    ("[aiter] import [module_aiter_enum] under /sgl-workspace/aiter/aiter/jit/module_aiter_enum.so", None),
    ("Loading safetensors checkpoint shards:   3% Completed | 4/142 [00:00<00:04, 33.56it/s]", 0),
    # 05-capturing-batches-stuck-flashinfer-jit.log: python logging without SGLang's prefix, a bar
    ("2025-06-25 11:25:58,633 - INFO - flashinfer.jit: Prebuilt kernels not found, using JIT backend", None),
    ("  0%|          | 0/17 [00:00<?, ?it/s]", 0),
    # forms of SGLang 0.5.x's scheduler prefix (scheduler.py: a subset of DP PP ATTN_CP MOE_DP TP EP)
    ("[2025-01-01 10:00:00 DP1 TP3 EP3] Prefill batch", 3),
    ("[2025-01-01 10:00:00.123 DP0 PP1 ATTN_CP0 MOE_DP0 TP5 EP5] Decode batch", 5),
    ("[2025-01-01 10:00:00 PP1 TP2] Load weight end.", 2),
    ("[2025-01-01 10:00:00 DP1] x", 0),  # a DP replica of tp_size 1: its only TP rank
    ("[2025-01-01 10:00:00 PP3] x", 0),
    ("[2025-01-01T10:00:00,456 TP6] x", 6),
    ("[2025-01-01 10:00:00 DP2 TP12 EP12 PP1] x", 12),
    # a docker compose prefix in front (coloured, as compose paints it)
    ("\x1b[36msglang-1  |\x1b[0m [2025-01-01 10:00:00 TP4] Load weight begin.", 4),
    # a bar cut by another rank's line: the line counts
    ("\rMulti-thread loading shards:   0% Completed | 0/64 [00:00<?, ?it/s][2026-11-30 05:12:06 TP7] Init", 7),
    ("uvicorn INFO: Started server process [12]", None),
]


@pytest.mark.parametrize("raw, rank", RANK_TABLE)
def test_the_rank_rule_reads_every_prefix_form(raw, rank):
    assert rank_of(clean(raw), previous=5) == rank  # an own rank never depends on the line before


def test_continuation_lines_take_the_rank_of_the_line_before_and_stamped_lines_end_them():
    text = "\n".join([  # noqa: FLY002 - one line per log line reads better
        "[2026-02-26 05:35:13 TP7] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 3096, in run_scheduler_',
        "    scheduler = Scheduler(",
        "",
        "During handling of the above exception, another exception occurred:",
        "TypeError: unsupported operand type(s)",
        "[2026-02-26 05:20:21 TP4] HTTP Request: HEAD https://huggingface.co/zai-org/GLM-5-FP8/resolve/main/m",
        "Warning: You are sending unauthenticated requests to the HF Hub. Please set a HF_TOKEN",
        "[2026-02-26 05:35:14] Received sigquit from a child process. It usually means the child failed.",
        "  indented, after the main process",
    ]) + "\n"
    assert [line.rank for line in lines_of_text(text)] == [7, 7, 7, 7, 7, 7, 4, 4, None, None]


def test_a_window_read_out_of_order_ranks_continuations_from_the_lines_before(tmp_path):
    path = tmp_path / "server.log"
    body = [f"[2026-11-01 10:00:00 TP{i % 8}] line {i}" for i in range(2000)]
    body[1500:1500] = ["[2026-11-01 10:00:09 TP3] Traceback (most recent call last):", '  File "x.py", line 1']
    path.write_text("\n".join(body) + "\n")
    with LogFile(path) as log:
        frame = log.lines(1502, 1)[0]  # read alone: its rank comes from the file before it
        assert frame.text.startswith("  File") and frame.rank == 3
        assert [line.rank for line in log.tail_lines(3)] == [(1997 % 8), (1998 % 8), (1999 % 8)]


def test_the_cleaning_rule_strips_ansi_cr_and_control_characters_and_expands_tabs():
    assert clean("\x1b[1;33mWARNING\x1b[0m a\tb\x00\x07c") == "WARNING a   bc"
    assert clean("\r 10%|#  | 1/10\r 100%|###| 10/10\r") == " 100%|###| 10/10"
    assert clean("\x1b]0;title\x07text") == "text"  # an OSC title sequence too


@pytest.mark.parametrize(
    "typed, rank, line, rank_of_line, keep",
    [
        ("load weight", None, "[2025 TP3] Load Weight end", 3, True),
        ("/weight (begin|end)/", None, "[x] Load weight end", 3, True),
        ("re:weight (begin|end)", None, "[x] Load weight end", 3, True),
        ("re:^x$", None, "[x] Load weight end", 3, False),
        ("", 3, "anything", 3, True),
        ("", 3, "anything", 2, False),
        ("", MAIN_RANK, "uvicorn", None, True),
        ("", MAIN_RANK, "tagged", 0, False),
        ("end", 2, "Load weight end", 3, False),
    ],
)
def test_the_filter_matches_text_regex_and_rank(typed, rank, line, rank_of_line, keep):
    from sessions.logs import LogLine

    assert LogFilter.parse(typed, rank).matches(LogLine(1, line, line, rank_of_line)) is keep


def test_a_bad_regex_names_the_filter():
    with pytest.raises(ValueError, match=r"bad regular expression"):
        LogFilter.parse("re:[unclosed")


# --- special files: answered at once, never waited on ------------------------------------------------------


@pytest.fixture
def special_files(tmp_path):
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock.log"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    folder = tmp_path / "dir.log"
    folder.mkdir()
    yield {"fifo": (fifo, "FIFO"), "socket": (sock_path, "socket"), "directory": (folder, "directory"),
           "zero": (Path("/dev/zero"), "device"), "urandom": (Path("/dev/urandom"), "device")}
    sock.close()


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory", "zero", "urandom"])
def test_open_log_refuses_anything_but_a_regular_file(special_files, kind):
    path, word = special_files[kind]
    with pytest.raises(LogFileError, match=word) as info:
        open_log(path)
    assert str(path) in str(info.value)
    with pytest.raises(LogFileError):
        read_tail(path, 1 << 20)
    with pytest.raises(LogFileError):
        LogFile(path)


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT), "EAGLE3_TUI_HOME": str(home)}
    env.pop("EAGLE3_TUI_DEMO", None)
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, env=env,
        stdin=subprocess.DEVNULL, timeout=CLI_TIMEOUT_S, check=False,
    )


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory", "zero", "urandom"])
@pytest.mark.parametrize("command", [("inspect-log",), ("inspect-log", "--json"), ("logs",), ("logs", "-f")])
def test_inspect_log_and_logs_answer_a_special_file_with_exit_2(special_files, kind, command, tmp_path):
    path, word = special_files[kind]
    name, *rest = command
    proc = _cli(name, str(path), *rest, home=tmp_path / "home")
    assert proc.returncode == 2, proc.stderr
    assert str(path) in proc.stderr and word in proc.stderr and "Traceback" not in proc.stderr


def test_a_session_whose_server_log_is_a_fifo_is_diagnosed_without_waiting(tmp_path):
    from sessions.diagnosis.evidence import _tail_texts
    from sessions.phases import summarize_file

    fifo = tmp_path / "server.log"
    os.mkfifo(fifo)
    assert "FIFO" in _tail_texts(fifo, 1 << 20)[0]
    with pytest.raises(LogFileError):
        summarize_file(fifo)


# --- `logs PATH`: grep's exit codes --------------------------------------------------------------------------

_LOG = "\n".join([  # noqa: FLY002 - one line per log line reads better
    "[2026-11-01 10:00:01 TP0] Load weight begin. avail mem=80.00 GB",
    "[2026-11-01 10:00:01 TP1] Load weight begin. avail mem=80.00 GB",
    "[2026-11-01 10:00:09 TP1] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl/sglang/srt/model_loader/loader.py", line 3, in load_model',
    "RuntimeError: shard broken, token hf_abcdefghijklmnopqrstuvwxyz1234",
    "[2026-11-01 10:00:10] Received sigquit from a child process.",
]) + "\n"


@pytest.mark.parametrize(
    "args, code, lines",
    [
        ((), 0, [0, 1, 2, 3, 4, 5]),
        (("--rank", "1"), 0, [1, 2, 3, 4]),
        (("--rank", "TP0"), 0, [0]),
        (("--rank", "main"), 0, [5]),
        (("--rank", "7"), 1, []),
        (("--grep", "LOAD WEIGHT"), 0, [0, 1]),
        (("--grep", "/sigquit|shard/"), 0, [4, 5]),
        (("--grep", "re:^\\s+File"), 0, [3]),
        (("--grep", "nothing like this"), 1, []),
        (("--grep", "weight", "--rank", "1"), 0, [1]),
        (("--rank", "1", "-n", "2"), 0, [3, 4]),
        (("-n", "2"), 0, [4, 5]),
        (("--grep", "/[bad/"), 2, []),
        (("--rank", "x"), 2, []),
    ],
)
def test_logs_on_a_path_filters_and_exits_like_grep(tmp_path, args, code, lines):
    path = tmp_path / "server.log"
    path.write_text(_LOG)
    proc = _cli("logs", str(path), *args, home=tmp_path / "home")
    assert proc.returncode == code, proc.stderr
    want = [re.sub(r"hf_\w+", "***", x) for x in _LOG.splitlines()]
    assert proc.stdout.splitlines() == [want[i] for i in lines]
    assert "hf_abc" not in proc.stdout  # redacted on the way out


def test_logs_on_a_missing_path_or_session_is_bad_input(tmp_path):
    assert _cli("logs", str(tmp_path / "nope.log"), home=tmp_path / "home").returncode == 2
    assert _cli("logs", "no-such-session", home=tmp_path / "home").returncode == 2


# --- one route: the old readers and rank functions are gone ----------------------------------------------------


def _sources() -> dict[str, str]:
    return {
        str(p.relative_to(REPO_ROOT)): p.read_text()
        for folder in ("sessions", "widgets", "app")
        for p in (REPO_ROOT / folder).rglob("*.py")
    }


def test_there_is_one_ansi_regex_and_one_rank_rule_in_the_tree():
    ansi = [name for name, text in _sources().items() if re.search(r"re\.compile\(r?[\"']\\x1b", text)]
    assert ansi == ["sessions/logs/lines.py"]
    for name, text in _sources().items():
        if name.startswith("sessions/logs/") or name == "sessions/snapshots.py":
            continue
        for gone in ("def line_rank", "def _is_continuation", "def attributed_rank", "def clean_line",
                     "def _hint_lines", "def _tail_offset", "def read_tail", "def display_text",
                     "class LogFilter", "class LogChunk"):
            assert gone not in text, f"{name} still has {gone!r}"


def test_the_log_readers_open_logs_only_through_the_core():
    # Every place that reads a server log: none opens it itself (open(), os.open, Path.read_*).
    phases = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "sessions" / "phases").glob("*.py"))
    assert phases, "sessions/phases/ holds the tracker"
    diagnosis_files = sorted(str(p.relative_to(REPO_ROOT))
                             for p in (REPO_ROOT / "sessions" / "diagnosis").glob("*.py"))
    assert diagnosis_files, "sessions/diagnosis/ holds the diagnosis"
    for name in (*diagnosis_files, "app/cli_logs.py", "app/feed.py", "app/cli_server.py",
                 *phases, "widgets/log_view.py"):
        text = (REPO_ROOT / name).read_text()
        assert not re.search(r"open\([^)]*log", text, re.IGNORECASE), name
    import sessions.logs as core
    from sessions.diagnosis import evidence

    assert evidence.read_tail is core.read_tail


def test_widgets_import_nothing_from_app():
    for path in (REPO_ROOT / "widgets").rglob("*.py"):
        assert not re.search(r"^\s*(from|import) app\b", path.read_text(), re.MULTILINE), path.name


# --- `logs` prints a bar once, in its last state (issue 21 item 9) -------------------------------------------

def _bar_frames(desc: str, total: int) -> str:
    """tqdm's frames of one bar as SGLang writes them: each redraw after a ``\\r``, a newline at the end."""
    frames = [f"{desc}: {100 * i // total:3d}%|{'█' * i:<10}| {i}/{total} [00:0{i}<00:00,  1.00it/s]"
              for i in range(total + 1)]
    return "\r".join(frames) + "\n"


_TP1_LOG = (  # a TP1 server: SGLang tags no line with its rank, the bars are TP0's
    "[2026-11-01 10:00:01] Load weight begin. avail mem=80.00 GB\n"
    + _bar_frames("Loading safetensors checkpoint shards", 8)
    + "[2026-11-01 10:00:05] Load weight end. elapsed=4.00 s, type=LlamaForCausalLM, avail mem=70.00 GB\n"
    + _bar_frames("Capturing batches (bs=1 avail_mem=60.00 GB)", 9)
    + "[2026-11-01 10:00:09] The server is fired up and ready to roll!\n"
)


@pytest.mark.parametrize("args", [(), ("--rank", "0"), ("-n", "4"), ("--grep", "capturing"), ("--grep", "/shards/")])
def test_logs_prints_each_bar_once_in_its_last_state_as_the_tui_shows_it(tmp_path, args):
    from sessions.logs.lines import lines_of_text

    path = tmp_path / "server.log"
    path.write_text(_TP1_LOG)
    proc = _cli("logs", str(path), *args, home=tmp_path / "home")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out and all("\r" not in line and len(line) < 200 for line in out)
    tui = {line.text: line.rank for line in lines_of_text(_TP1_LOG)}  # the log pane's text and rank
    assert all(line in tui for line in out)
    bars = [line for line in out if "it/s]" in line]
    assert all(re.search(r"100%\|[█ ]+\| (\d+)/\1 ", bar) for bar in bars)  # the last frame of each bar
    if args[:1] == ("--rank",):
        assert len(bars) == 2 and all(tui[bar] == 0 for bar in bars)
