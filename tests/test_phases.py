"""StartupTracker: phases, progress, per-rank arrival, errors and outcome from SGLang logs (DESIGN §3).

Synthetic logs use the exact 0.5.23 line formats of sglang-facts §1.4-1.5 (tests/_logs_support.py records
where it wrote each marker); older spellings come from the 0.4.x fixtures' formats.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions.logs.lines import lines_of_text
from sessions.phases import (
    StartupPhase,
    StartupTracker,
    collapse_cr,
    strip_ansi,
    summarize_bytes,
    summarize_file,
    summarize_text,
)
from tests._logs_support import LogBuilder

P = StartupPhase


def _assert_matches_build(summary, built, tp: int) -> None:
    expected_events = sorted(built.first_line.items(), key=lambda kv: kv[0].order)
    assert [(e.phase, e.line_no) for e in summary.events] == expected_events
    assert summary.phase == built.furthest
    for marker, ranks in built.arrivals.items():
        assert summary.rank_arrival.get(marker) == tuple(sorted(ranks)), marker
    assert summary.ranks_expected == tp
    assert summary.line_count == len(built.lines)


# --- the 0.5.23 startup, every phase ------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"tp": 8},
        {"tp": 1},
        {"tp": 4, "ms": True},
        {"tp": 8, "dp_attention": True, "ep": True},
        {"tp": 8, "ep": True},
        {"tp": 8, "docker": "sglang-1"},
        {"tp": 8, "docker": "sglang_server_1", "ansi": True},
        {"tp": 4, "ansi": True},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
@pytest.mark.parametrize("startup", [{}, {"deepgemm": True}, {"prefill_graph": False}, {"decode_graph": False}],
                         ids=["plain", "deepgemm", "no-prefill-graph", "no-decode-graph"])
def test_a_full_0523_startup_reaches_ready_through_every_phase(options, startup):
    built = LogBuilder(**options).startup(**startup).build()
    summary = summarize_text(built.text)
    assert summary.outcome == "ready"
    assert summary.error is None and summary.error_line is None
    _assert_matches_build(summary, built, options["tp"])
    assert summary.ranks_loaded == tuple(range(options["tp"]))
    assert summary.last_log_time is not None and summary.last_log_time.startswith("2026-11-01 10:")


@pytest.mark.parametrize("stop", [P.DIST_INIT, P.LOADING_WEIGHTS, P.WEIGHTS_LOADED, P.KV_CACHE, P.CUDA_GRAPH, P.WARMUP])
def test_a_start_cut_short_is_incomplete_in_the_phase_it_reached(stop):
    built = LogBuilder(tp=4).startup(stop_after=stop).build()
    summary = summarize_text(built.text)
    assert summary.outcome == "incomplete"
    assert summary.phase == stop == built.furthest
    _assert_matches_build(summary, built, 4)


def test_ranks_that_never_logged_load_weight_end_show_in_the_arrival_not_in_the_phase():
    built = LogBuilder(tp=8).startup(missing_load_end=[3, 6]).build()
    summary = summarize_text(built.text)
    assert summary.phase == P.WEIGHTS_LOADED
    assert summary.ranks_loaded == (0, 1, 2, 4, 5, 7)
    assert summary.rank_arrival["load_weight_begin"] == tuple(range(8))
    assert summary.ranks_seen == tuple(range(8))


def test_the_furthest_rank_sets_the_phase_even_when_others_lag():
    text = (
        "[2026-11-01 10:00:01 TP0] Load weight begin. avail mem=10.00 GB\n"
        "[2026-11-01 10:00:01 TP1] Load weight begin. avail mem=10.00 GB\n"
        "[2026-11-01 10:00:09 TP1] Load weight end. elapsed=8.00 s, type=X, avail mem=2.00 GB, mem usage=8.00 GB.\n"
        "\rMulti-thread loading shards:  50% Completed | 4/8 [00:04<00:04,  1.00it/s]"
    )
    summary = summarize_text(text)
    assert summary.phase == P.WEIGHTS_LOADED
    assert summary.ranks_loaded == (1,)
    assert summary.progress is not None and (summary.progress.label, summary.progress.done) == ("shards", 4)


# --- progress ----------------------------------------------------------------------------------------


def test_a_weight_bar_still_being_drawn_shows_its_shard_count():
    b = LogBuilder(tp=2)
    b.startup(stop_after=P.DIST_INIT)
    b.each_rank("Load weight begin. avail mem=138.42 GB", P.LOADING_WEIGHTS)
    built = b.build()
    live = built.text + "\rMulti-thread loading shards:   0% Completed | 0/64 [00:00<?, ?it/s]" \
        "\rMulti-thread loading shards:  19% Completed | 12/64 [00:07<00:31,  1.60it/s]"
    tracker = StartupTracker()
    tracker.feed_text(live)
    progress = tracker.summary().progress
    assert (progress.label, progress.done, progress.total) == ("shards", 12, 64)
    assert tracker.summary().phase == P.LOADING_WEIGHTS


def test_older_weight_bars_count_too():
    text = "Loading safetensors checkpoint shards:  43% Completed | 6/14 [00:03<00:04,  1.75it/s]\n"
    progress = summarize_text(text).progress
    assert (progress.label, progress.done, progress.total) == ("shards", 6, 14)


@pytest.mark.parametrize(
    "desc, label",
    [
        ("Capturing batches (bs=256 avail_mem=20.51 GB)", "cuda graph bs"),
        ("Capturing batches (avail_mem=7.08 GB)", "cuda graph bs"),  # 0.4.x, no bs
        ("Capturing prefill shape (num_tokens=2048 avail_mem=17.40 GB)", "cuda graph prefill"),
        ("Capturing num tokens (num_tokens=7680 avail_mem=102.07 GB)", "cuda graph tokens"),
        ("DeepGEMM warmup", "deepgemm warmup"),
    ],
)
def test_graph_and_deepgemm_bars_give_progress_inside_the_phase(desc, label):
    text = f"\r  0%|          | 0/52 [00:00<?, ?it/s]\r{desc}:   6%|▌         | 3/52 [00:02<00:40,  1.20it/s]"
    tracker = StartupTracker()
    tracker.feed_text(text)
    progress = tracker.summary().progress
    assert (progress.label, progress.done, progress.total) == (label, 3, 52)
    tracker.flush()
    assert tracker.summary().progress == progress


def test_deepgemm_jit_lines_count_the_kernels_being_compiled():
    built = LogBuilder(tp=2).startup(stop_after=P.KV_CACHE, deepgemm=True).build()
    lines = built.text.split("\n")[:-1]
    assert "DeepGEMM warmup" in lines[-1]
    text = "\n".join(lines[:-1]) + "\n"  # without the warmup bar
    progress = summarize_text(text).progress
    assert progress.label == "deepgemm jit" and progress.done == 1 and "GEMM_NT_F8F8BF16" in progress.detail


def test_a_bar_glued_to_the_next_log_line_is_read_as_both():
    text = (
        "[2025-03-08 12:29:21 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=1.45 GB\n"
        "  0%|          | 0/13 [00:00<?, ?it/s][2025-03-08 12:29:21 TP1] Capture cuda graph begin. This can take "
        "up to several minutes. avail mem=1.45 GB\n"
    )
    summary = summarize_text(text)
    assert summary.rank_arrival["cuda_graph_begin"] == (0, 1)
    assert summary.phase == P.CUDA_GRAPH


# --- errors ----------------------------------------------------------------------------------------------

_CUDA_GRAPH_FRAMES = [
    ("/sgl/python/sglang/srt/managers/scheduler.py", "run_scheduler_process"),
    ("/sgl/python/sglang/srt/model_executor/model_runner.py", "init_cuda_graphs"),
    ("/sgl/python/sglang/srt/model_executor/cuda_graph_runner.py", "capture"),
]


def test_a_scheduler_exception_is_the_error_and_its_exception_line_the_detail():
    b = LogBuilder(tp=4).startup(stop_after=P.KV_CACHE)
    b.scheduler_exception(2, _CUDA_GRAPH_FRAMES, "TypeError: cannot unpack non-iterable ForwardMetadata object")
    built = b.build()
    summary = summarize_text(built.text)
    assert summary.outcome == "crashed"
    first = next(e for e in summary.errors if e.fatal)
    assert (first.line_no, first.text) == (built.error_line, built.error_text)  # the error line ...
    assert first.kind == "scheduler_exception" and first.rank == 2
    assert first.detail == "TypeError: cannot unpack non-iterable ForwardMetadata object"
    # ... and the summary's error is the exception that raised it, with its line and rank (issue 21)
    lines = built.text.split("\n")
    assert summary.error == first.detail and lines[summary.error_line - 1] == first.detail
    assert summary.error_rank == 2 and summary.error_cause is None
    assert summary.phase == P.CUDA_GRAPH  # from the frames: no capture marker was logged
    assert any(e.kind == "sigquit" for e in summary.errors)


@pytest.mark.parametrize(
    "func, path, phase",
    [
        ("init_torch_distributed", "sglang/srt/model_executor/model_runner.py", P.DIST_INIT),
        ("initialize_model_parallel", "sglang/srt/distributed/parallel_state.py", P.DIST_INIT),
        ("load_model", "sglang/srt/model_executor/model_runner.py", P.LOADING_WEIGHTS),
        ("load_weights", "sglang/srt/models/deepseek_v2.py", P.LOADING_WEIGHTS),
        ("init_memory_pool", "sglang/srt/model_executor/model_runner.py", P.KV_CACHE),
        ("profile_max_num_token", "sglang/srt/model_executor/model_runner.py", P.KV_CACHE),
        ("__init__", "sglang/srt/model_executor/cuda_graph_runner.py", P.CUDA_GRAPH),
        ("capture", "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py", P.CUDA_GRAPH),
        ("_wait_and_warmup", "sglang/srt/entrypoints/http_server.py", P.WARMUP),
    ],
)
def test_a_log_without_markers_gets_its_phase_from_the_traceback_frames(func, path, phase):
    text = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/threading.py", line 1016, in run\n'
        "    self._target(*self._args)\n"
        f'  File "/sgl/python/{path}", line 321, in {func}\n'
        "    do_it()\n"
        "RuntimeError: something broke\n"
    )
    summary = summarize_text(text)
    assert summary.phase == phase
    assert summary.outcome == "crashed"
    assert summary.error_line == 6 and summary.error == "RuntimeError: something broke"


def test_an_excerpt_that_starts_mid_traceback_still_finds_the_exception_line():
    text = (
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 216, in initialize\n'
        "    self.init_cuda_graphs()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    summary = summarize_text(text)
    assert summary.error_line == 3 and summary.errors[0].kind == "oom"
    assert summary.phase == P.CUDA_GRAPH


@pytest.mark.parametrize(
    "line, kind",
    [
        (("[rank6]:[E207 08:21:43.123456789 ProcessGroupNCCL.cpp:616] [Rank 6] Watchdog caught collective operation "
         "timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 "
         "milliseconds before timing out."), "nccl_watchdog"),
        (("[rank10]:[E130 18:11:34.707542570 ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed with "
         "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"), "gloo"),
        ("[E ProcessGroupNCCL.cpp:475] [Rank 3] NCCL communicator was aborted.", "nccl"),
        ("[2026-11-01 10:00:09 TP3] Scheduler hit an exception: Traceback (most recent call last):",
         "scheduler_exception"),
        ("[2026-11-01 10:00:09] Received sigquit from a child process. It usually means the child failed.", "sigquit"),
        (("[2026-11-01 10:00:09] RuntimeError: Rank 3 scheduler died during initialization (exit code: -9). If exit "
         "code is -9 (SIGKILL), a common cause is the OS OOM killer."), "scheduler_died"),
        ("[2026-11-01 10:00:09] Initialization failed. warmup error: Traceback (most recent call last):", "warmup"),
        ("[2026-11-01 10:00:09 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
         "watchdog"),
        (("[2026-11-01 10:00:09] ERROR:    [Errno 98] error while attempting to bind on address "
         "('127.0.0.1', 30000): address already in use"), "address_in_use"),
        ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB.", "cuda_graph"),
        (("[2025-07-02 07:41:59 DP0 TP0] max_total_tokens=131072 is larger than the profiled value -561981. "
         "Use the profiled value instead."), "negative_kv"),
        ("Killed", "killed"),
        ("sglang-1 exited with code 137", "exit"),
        ("sglang.launch_server: error: unrecognized arguments: --cuda-graph-max-bs 64", "bad_args"),
    ],
)
def test_each_fatal_error_kind_is_found_on_its_line(line, kind):
    b = LogBuilder(tp=4).startup(stop_after=P.WEIGHTS_LOADED)
    line_no = b.raw(line)
    summary = summarize_text(b.build().text)
    assert summary.outcome == "crashed"
    assert summary.error_line == line_no
    assert summary.error == line
    assert summary.errors[0].kind == kind


def test_warnings_that_mention_errors_are_not_errors():
    b = LogBuilder(tp=2)
    b.server_args(", 'custom_sigquit_handler': None, 'soft_watchdog_timeout': None")
    b.each_rank("Failed to import amdsmi with ModuleNotFoundError(\"No module named 'amdsmi'\")")
    b.each_rank("The following error message 'operation scheduled before its operands' can be ignored.")
    b.log("Unexpected error during package walk: cutlass.cute.experimental")
    b.each_rank("Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=True)")  # soft: dump only
    b.startup()
    summary = summarize_text(b.build().text)
    assert summary.outcome == "ready"
    assert summary.error is None


def test_an_error_before_ready_did_not_stop_the_server():
    b = LogBuilder(tp=2).startup(stop_after=P.KV_CACHE)
    b.raw("Traceback (most recent call last):")
    b.raw('  File "/x/y.py", line 3, in f')
    b.raw("ImportError: optional kernel not found")
    b.startup()
    summary = summarize_text(b.build().text)
    assert summary.outcome == "ready" and summary.error is None
    assert any(not e.fatal for e in summary.errors)


def test_after_ready_a_request_traceback_is_survived_but_a_scheduler_crash_is_not():
    b = LogBuilder(tp=2).startup()
    b.log("Exception in ASGI application: Traceback (most recent call last):")
    b.raw('  File "/x/starlette/routing.py", line 3, in app')
    b.raw("ValueError: bad request")
    survived = summarize_text(b.build().text)
    assert survived.outcome == "ready"
    line_no = b.scheduler_exception(1, [("/x/scheduler.py", "event_loop_normal")], "RuntimeError: CUDA error")
    crashed = summarize_text(b.build().text)
    first = next(e for e in crashed.errors if e.fatal)
    assert crashed.outcome == "crashed" and first.line_no == line_no
    assert crashed.error == "RuntimeError: CUDA error" and crashed.error_rank == 1
    assert crashed.phase == P.READY


def test_a_negative_budget_followed_by_graph_capture_was_not_fatal():
    text = (
        "[2026-02-11 06:45:01] max_total_tokens=20480 is larger than the profiled value -89624. Use the profiled "
        "value instead.\n"
        "  0%|          | 0/4 [00:00<?, ?it/s]Capturing batches (bs=4 avail_mem=1.85 GB):   0%|          | 0/4 "
        "[00:00<?, ?it/s]\n"
    )
    assert summarize_text(text).outcome == "incomplete"
    assert summarize_text(text.splitlines()[0]).outcome == "crashed"


# --- settings, ranks, capture ------------------------------------------------------------------------


def test_ranks_expected_comes_from_tp_size_in_either_server_args_form():
    repr_form = ("[2025-03-08 12:29:04] server_args=ServerArgs(model_path='/m', tp_size=4, attn_tp_size=8, "
                 "moe_dense_tp_size=None, dp_size=1)\n")
    dict_form = "[2026-11-01 10:00:00] server_args={'model_path': '/m', 'attn_tp_size': 2, 'tp_size': 16}\n"
    warning = "[2026-02-26 05:19:58] WARNING server_args.py:1245: DSA with TP mode is active, tp_size=8, ok\n"
    assert summarize_text(repr_form).ranks_expected == 4
    assert summarize_text(dict_form).ranks_expected == 16
    assert summarize_text(warning).ranks_expected is None


def test_pipeline_and_plain_data_parallel_prefixes_map_to_global_ranks():
    pp = ("[t] server_args={'tp_size': 4, 'pp_size': 2}\n".replace("[t]", "[2026-11-01 10:00:00]")
          + "[2026-11-01 10:00:01 PP1 TP2] Load weight end. elapsed=1.00 s, type=X, avail mem=1.00 GB, "
            "mem usage=1.00 GB.\n")
    s = summarize_text(pp)
    assert s.ranks_loaded == (6,) and s.ranks_expected == 8
    dp = ("[2026-11-01 10:00:00] server_args={'tp_size': 4, 'dp_size': 2}\n"
          "[2026-11-01 10:00:01 DP1 TP2] Load weight end. elapsed=1.00 s, type=X, avail mem=1.00 GB, "
          "mem usage=1.00 GB.\n")
    assert summarize_text(dp).ranks_loaded == (6,)
    dp_attention = dp.replace("'dp_size': 2", "'dp_size': 2, 'enable_dp_attention': True")
    assert summarize_text(dp_attention).ranks_loaded == (2,)


def test_a_line_without_a_rank_prefix_counts_as_rank_0():
    text = "[2026-04-05 16:48:12] Load weight end. elapsed=0.75 s, type=Qwen2ForCausalLM, avail mem=1.0 GB, " \
           "mem usage=0.99 GB.\n"
    assert summarize_text(text).ranks_loaded == (0,)


_NOISE = ("[2026-11-01 10:00:09 TP5] Decode batch, #running-req: 3, #token: 9, token usage: 0.01, cuda graph: "
          "True, gen throughput (token/s): 1.00, #queue-req: 0, ")


@pytest.mark.parametrize(
    "lines, rank",
    [
        # a bare traceback takes the rank of the line before it, header or not (the core's continuation rule)
        (["[2026-11-01 10:00:08 TP3] Load weight begin. avail mem=1.00 GB", "Traceback (most recent call last):",
          '  File "/sgl/x.py", line 1, in f', "RuntimeError: boom"], 3),
        # ... also when that line is runtime noise the tracker skips unread
        ([_NOISE, "Traceback (most recent call last):", '  File "/sgl/x.py", line 1, in event_loop_normal',
          "RuntimeError: boom"], 5),
        # a lone `Exception: ...` line is a continuation too
        (["[2026-11-01 10:00:08 TP2] Capture cuda graph begin. This can take up to several minutes.",
          "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB."], 2),
        # torch's `[rankN]:` is the line's own tag
        (["[2026-11-01 10:00:08 TP1] Load weight begin. avail mem=1.00 GB",
          "[rank6]:[E207 08:21:43.123 ProcessGroupNCCL.cpp:616] [Rank 6] Watchdog caught collective operation timeout"],
         6),
        # a stamped line without ranks is the main process, never a continuation
        (["[2026-11-01 10:00:08 TP1] Load weight begin. avail mem=1.00 GB",
          "[2026-11-01 10:00:09] Received sigquit from a child process. It usually means the child failed."], None),
    ],
)
def test_an_errors_rank_is_the_log_cores_rank_of_its_line(lines, rank):
    text = "\n".join(lines) + "\n"
    error = next(e for e in summarize_text(text).errors if e.fatal)
    assert error.rank == rank
    assert lines_of_text(text)[error.line_no - 1].rank == rank  # the one rank rule, not a second copy
    # the same wherever a chunk ends (the line before may sit in the previous chunk, skipped unread)
    data = text.encode()
    for cut in range(1, len(data)):
        tracker = StartupTracker()
        tracker.feed_bytes(data[:cut])
        tracker.feed_bytes(data[cut:])
        tracker.flush()
        assert next(e for e in tracker.summary().errors if e.fatal).rank == rank, cut


def test_the_capture_plugin_line_gives_the_capture_layers():
    text = ("[2026-11-01 10:00:05 TP0] eagle3-capture active: layers_to_capture=[2, 30, 58], dir=/data/cap run, "
            "rid_prefix=eagle3-\n")
    summary = summarize_text(text)
    assert summary.capture_layers == (2, 30, 58)
    assert summary.capture_dir == "/data/cap run"


def test_0_4_markers_and_time_only_prefixes_are_read():
    text = (
        "[12:00:01 TP0] Init torch distributed begin.\n"
        "[12:00:02 TP0] Init torch distributed ends. mem usage=0.13 GB\n"
        "[12:00:03 TP0] Load weight begin. avail mem=21.63 GB\n"
        "[12:00:09 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=6.09 GB\n"
        "[12:00:09 TP0] Memory pool end. avail mem=2.09 GB\n"
        "[12:00:09 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
        "[12:00:12 TP0] Capture cuda graph end. Time elapsed: 2.19 s\n"
        "[12:00:13] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)\n"
        "[12:00:15] The server is fired up and ready to roll!\n"
    )
    summary = summarize_text(text)
    assert [e.phase for e in summary.events] == list(P)[1:]
    assert summary.events[-1].log_time == "12:00:15"
    assert summary.outcome == "ready"


# --- robustness ------------------------------------------------------------------------------------------


def test_a_huge_line_keeps_memory_bounded_and_line_numbers_right():
    tracker = StartupTracker()
    tracker.feed_text("[2026-11-01 10:00:00 TP0] Init parallel begin.\n")
    for _ in range(50):  # a 50 MB line in 1 MB pieces, never kept whole
        tracker.feed_bytes(b"x" * (1 << 20))
        assert len(tracker._pending) < 256 * 1024
    tracker.feed_text("\n[2026-11-01 10:00:01 TP0] Load weight begin. avail mem=1.00 GB\n")
    summary = tracker.summary()
    assert summary.events[-1] .line_no == 3 and summary.line_count == 3


def test_binary_junk_and_windows_line_endings_are_read_without_error():
    junk = random.Random(7).randbytes(200_000)
    summarize_bytes(junk)
    crlf = LogBuilder(tp=2).startup().build().text.replace("\n", "\r\n")
    assert summarize_text(crlf).outcome == "ready"


def test_summarize_file_reads_in_chunks_with_the_same_result(tmp_path):
    b = LogBuilder(tp=8).startup(stop_after=P.KV_CACHE)
    b.runtime_noise(2000)
    b.scheduler_exception(5, _CUDA_GRAPH_FRAMES, "RuntimeError: boom")
    built = b.build()
    path = tmp_path / "server.log"
    path.write_text(built.text)
    assert summarize_file(path) == summarize_text(built.text)
    assert next(e for e in summarize_file(path).errors if e.fatal).line_no == built.error_line


def test_ansi_and_carriage_returns_are_stripped_for_display():
    assert strip_ansi("\x1b[1;33mWarning\x1b[0m: x") == "Warning: x"
    assert collapse_cr("\r 0%|\r 50%|\r") == " 50%|"


# --- fuzzing ------------------------------------------------------------------------------------------------

_POOL = LogBuilder(tp=4, docker=None).startup(deepgemm=True).build().lines + [
    "Traceback (most recent call last):",
    '  File "/sgl/sglang/srt/model_executor/model_runner.py", line 9, in init_memory_pool',
    "    x()",
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    "[2026-11-01 10:00:09 TP1] Scheduler hit an exception: Traceback (most recent call last):",
    "[rank6]:[E207 08:21:43.123 ProcessGroupNCCL.cpp:616] [Rank 6] Watchdog caught collective operation timeout",
    "Killed",
    "\x1b[31mcolour\x1b[0m",
    "sglang-1  | [2026-11-01 10:00:02 TP3] Load weight end. elapsed=1.0 s, type=X, avail mem=1.0 GB, mem usage=1.0 GB.",
    "\u00e9\u4e2d\ufffd",
    "",
]


@st.composite
def _log_texts(draw):
    parts = draw(st.lists(st.one_of(st.sampled_from(_POOL), st.text(max_size=40)), max_size=60))
    seps = draw(st.lists(st.sampled_from(["\n", "\n", "\n", "\r", "\r\n"]), min_size=len(parts), max_size=len(parts)))
    return "".join(p + s for p, s in zip(parts, seps))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_log_texts(), cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_any_chunking_gives_the_same_summary_and_phases_only_move_forward(text, cuts):
    data = text.encode("utf-8", "surrogatepass")
    whole = StartupTracker()
    whole.feed_bytes(data)
    chunked = StartupTracker()
    points = sorted({c % (len(data) + 1) for c in cuts})
    prev = 0
    for point in points + [len(data)]:
        chunked.feed_bytes(data[prev:point])
        prev = point
    assert chunked.summary() == whole.summary()  # also before the end: a bar being drawn reads the same
    whole.flush()
    chunked.flush()
    summary = whole.summary()
    assert chunked.summary() == summary
    orders = [e.phase.order for e in summary.events]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert [e.line_no for e in summary.events] == sorted(e.line_no for e in summary.events)
    assert summary.phase.order == max(orders, default=0)


@settings(max_examples=100, deadline=None)
@given(text=_log_texts())
def test_feeding_line_by_line_equals_feeding_the_text(text):
    by_text = StartupTracker()
    by_text.feed_text(text)
    by_text.flush()
    by_line = StartupTracker()
    lines = text.split("\n")
    for line in lines[:-1]:
        by_line.feed_line(line)
    if lines[-1]:
        by_line.feed_text(lines[-1])
    by_line.flush()
    assert by_line.summary() == by_text.summary()


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=4000))
def test_the_tracker_never_raises_on_any_bytes(data):
    tracker = StartupTracker()
    tracker.feed_bytes(data)
    tracker.summary()
    tracker.flush()
    summary = tracker.summary()
    assert summary.outcome in ("ready", "crashed", "incomplete")


def test_a_logged_traceback_the_start_moved_well_past_is_not_fatal():
    b = LogBuilder(tp=2).startup(stop_after=P.LOADING_WEIGHTS)
    b.log("Failed to load an optional kernel, falling back: Traceback (most recent call last):", 0)
    b.raw('  File "/x/kernels.py", line 3, in load')
    b.raw("ImportError: libfoo.so: cannot open shared object file")
    only_loaded = summarize_text(b.build().text)
    assert only_loaded.outcome == "crashed"  # nothing after it yet: it may have been fatal
    b.startup(stop_after=P.CUDA_GRAPH)  # two phases on (kv_cache, cuda_graph): the start went on
    went_on = summarize_text(b.build().text)
    assert went_on.outcome == "incomplete" and went_on.error is None
    assert any(e.kind == "traceback" and not e.fatal for e in went_on.errors)


@pytest.mark.parametrize("who", ["TokenizerManager", "DetokenizerManager", "TpModelWorkerClient"])
def test_any_process_that_hit_an_exception_is_fatal(who):
    b = LogBuilder(tp=2).startup()
    line_no = b.log(f"{who} hit an exception: Traceback (most recent call last):")
    summary = summarize_text(b.build().text)
    assert summary.outcome == "crashed" and summary.error_line == line_no


def test_older_death_notices_of_a_scheduler_are_fatal():
    b = LogBuilder(tp=2).startup(stop_after=P.KV_CACHE)
    line_no = b.log("Rank 0 scheduler is dead. Please check if there are relevant logs.")
    summary = summarize_text(b.build().text)
    assert summary.outcome == "crashed" and summary.error_line == line_no
