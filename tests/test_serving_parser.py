"""The serving parser reads the stats lines of SGLang 0.4 to 0.5.23 and sums DP ranks (sessions.serving)."""

from __future__ import annotations

import pytest

from sessions.serving import ServingTracker, parse_batch_line, parse_metrics, summarize_serving, with_metrics

V0523_DECODE = (
    "[2026-05-01 10:00:00 TP0] Decode batch, #running-req: 3, #token: 1200, token usage: 0.05, "
    "cuda graph: True, gen throughput (token/s): 250.50, #queue-req: 2"
)


@pytest.mark.parametrize(
    "line, running, queued, gen, usage",
    [
        (V0523_DECODE, 3, 2, 250.5, 0.05),
        # 0.4: a full stop after "batch", a trailing comma, no graph field
        (("[2025-03-08 12:29:31 TP0] Decode batch. #running-req: 1, #token: 262, token usage: 0.00, "
         "gen throughput (token/s): 64.27, #queue-req: 0, "), 1, 0, 64.27, 0.0),
        # DP attention prefix, speculative fields
        (("[2026-05-01 10:00:00 DP1 TP4 EP4] Decode batch, #running-req: 8, #token: 9000, token usage: 0.30, "
         "accept len: 2.41, accept rate: 0.47, cuda graph: True, gen throughput (token/s): 812.00, "
         "#queue-req: 1"), 8, 1, 812.0, 0.30),
        # time-only and no prefix at all
        (("[2026-04-05 16:48:21] Decode batch, #running-req: 2, #token: 50, token usage: 0.01, "
         "cuda graph: False, gen throughput (token/s): 180.00, #queue-req: 0"), 2, 0, 180.0, 0.01),
        (("Decode batch, #running-req: 4, #token: 50, token usage: 0.02, npu graph: True, "
         "gen throughput (token/s): 99.90, #queue-req: 5"), 4, 5, 99.9, 0.02),
        # outer container and Ray actor prefixes
        (("sglang-1  | [2025-06-01 09:00:00 TP0] Decode batch, #running-req: 6, #token: 50, "
         "token usage: 0.04, cuda graph: True, gen throughput (token/s): 500.00, #queue-req: 0"), 6, 0, 500.0, 0.04),
        (("(SGLangEngine pid=4242) [2025-06-01 09:00:00 TP0] Decode batch, #running-req: 7, #token: 5, "
         "token usage: 0.03, cuda graph: True, gen throughput (token/s): 70.00, #queue-req: 0"), 7, 0, 70.0, 0.03),
        # renamed/extra fields: largest-len, hybrid pools, PD pre-allocation
        (("[2025-01-01 00:00:00 TP0] Decode batch. #running-req: 5, #token: 700, token usage: 0.10, "
         "largest-len: 0, gen throughput (token/s): 300.00, #queue-req: 0, "), 5, 0, 300.0, 0.10),
        (("[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 5, #full token: 700, full token usage: 0.20, "
         "#swa token: 300, swa token usage: 0.10, cuda graph: True, gen throughput (token/s): 310.00, "
         "#queue-req: 0"), 5, 0, 310.0, 0.20),
        (("[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 5, #token: 700, token usage: 0.20, "
         "pre-allocated usage: 0.05, #prealloc-req: 1, #transfer-req: 0, #retracted-req: 0, cuda graph: True, "
         "gen throughput (token/s): 320.00, #queue-req: 0"), 5, 0, 320.0, 0.20),
    ],
)
def test_decode_lines_of_every_version(line, running, queued, gen, usage):
    parsed = parse_batch_line(line)
    assert parsed is not None and parsed.kind == "decode"
    assert (parsed.running_reqs, parsed.queue_reqs) == (running, queued)
    assert parsed.gen_throughput == pytest.approx(gen)
    assert parsed.token_usage == pytest.approx(usage)


def test_prefill_lines_old_and_new():
    old = parse_batch_line("[2025-03-08 12:29:30 TP0] Prefill batch. #new-seq: 1, #new-token: 6, "
                           "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, ")
    new = parse_batch_line("[2026-04-05 16:48:21] Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, "
                           "token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, "
                           "cuda graph: True, input throughput (token/s): 1234.50")
    iters = parse_batch_line("[2026-04-05 16:48:21] Prefill batch [17], #new-seq: 2, #new-token: 6, "
                             "#cached-token: 0, token usage: 0.00, #running-req: 1, #queue-req: 3, "
                             "cuda graph: True, input throughput (token/s): 10.00")
    assert old is not None and old.kind == "prefill" and old.input_throughput is None
    assert new is not None and new.input_throughput == pytest.approx(1234.5)
    assert iters is not None and iters.queue_reqs == 3


@pytest.mark.parametrize(
    "line",
    [
        "[2026-05-01 10:00:00 TP0] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.5",
        "[2026-05-01 10:00:00 TP0] Load weight end. elapsed=1.00 s",
        "ValueError: something about Decode batch, #running-req: 1 in a message",
        "[2026-05-01 10:00:00 TP0] Decode batch, nothing we know",
    ],
)
def test_lines_that_are_not_serving_figures(line):
    assert parse_batch_line(line) is None


def test_dp_attention_sums_the_latest_line_of_each_rank_and_keeps_them():
    tracker = ServingTracker()
    for dp, gen, running, queued, accept in [(0, 100.0, 4, 1, 2.0), (1, 50.0, 2, 0, 3.0), (0, 120.0, 5, 2, 2.2)]:
        tracker.feed_line(
            f"[2026-05-01 10:00:0{dp} DP{dp} TP{dp * 4}] Decode batch, #running-req: {running}, #token: 10, "
            f"token usage: 0.{dp + 1}0, accept len: {accept:.2f}, accept rate: 0.40, cuda graph: True, "
            f"gen throughput (token/s): {gen:.2f}, #queue-req: {queued}"
        )
    snap = tracker.snapshot()
    assert snap is not None
    assert snap.gen_throughput == pytest.approx(170.0)  # 120 (latest of DP0) + 50
    assert (snap.running_reqs, snap.queue_reqs) == (7, 2)
    assert snap.accept_length == pytest.approx(2.6)
    assert [r["dp_rank"] for r in snap.ranks] == [0, 1]
    assert snap.ranks[0]["gen_throughput"] == pytest.approx(120.0)
    out = snap.to_json()
    assert {"gen_throughput", "running_reqs", "queue_reqs", "token_usage", "input_throughput",
            "updated_at", "accept_length", "accept_rate"} <= out.keys()
    assert len(out["ranks"]) == 2


def test_feed_bytes_cleans_ansi_and_bars_and_waits_for_the_newline(tmp_path):
    tracker = ServingTracker()
    line = V0523_DECODE.encode()
    tracker.feed_bytes(b"noise\n\x1b[32m" + line[:30])
    assert tracker.snapshot() is None
    tracker.feed_bytes(line[30:] + b"\x1b[0m\n")
    snap = tracker.snapshot()
    assert snap is not None and snap.running_reqs == 3 and snap.history == (250.5,)
    log = tmp_path / "server.log"
    log.write_bytes(b"x\n" * 1000 + line + b"\n" + line.replace(b"250.50", b"300.00") + b"\n")
    end = summarize_serving(log)
    assert end is not None and end.gen_throughput == pytest.approx(300.0)


def test_metrics_text_overrides_the_log_figures():
    text = (
        '# TYPE sglang:gen_throughput gauge\n'
        'sglang:gen_throughput{model_name="m",engine_type="unified",tp_rank="0"} 0.0\n'
        'sglang:num_running_reqs{model_name="m",tp_rank="0"} 0.0\n'
        'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 3.0\n'
        'sglang:token_usage{model_name="m",tp_rank="0"} 0.25\n'
    )
    values = parse_metrics(text)
    assert values == {"gen_throughput": 0.0, "running_reqs": 0.0, "queue_reqs": 3.0, "token_usage": 0.25}
    tracker = ServingTracker()
    tracker.feed_line(V0523_DECODE)
    merged = with_metrics(tracker.snapshot(), values, at=123.0)
    assert (merged.gen_throughput, merged.queue_reqs, merged.source, merged.updated_at) == (0.0, 3, "metrics", 123.0)


@pytest.mark.parametrize("prefix", ["", "[2026-12-02 01:07:57] ", "2026-12-02T01:07:57.1Z stdout F ", "> "])
def test_the_warmup_request_is_not_running_once_the_server_is_fired_up(prefix):
    """SGLang's warm-up request logs a Prefill line (running = #running-req + #new-seq = 1) before "fired up";
    the card showed "running 1" on a server that had just become ready and ran nothing."""
    tracker = ServingTracker()
    tracker.feed_line(prefix + "[2026-12-02 01:07:57 TP0] Prefill batch, #new-seq: 1, #new-token: 29, "
                      "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, ")
    assert tracker.snapshot().running_reqs == 1  # the warm-up request, while it is prefilled
    tracker.feed_line(prefix + "[2026-12-02 01:07:57] The server is fired up and ready to roll!")
    snap = tracker.snapshot()
    assert snap.running_reqs == 0 and snap.queue_reqs == 0
    tracker.feed_line(prefix + "[2026-12-02 01:08:01 TP0] Decode batch, #running-req: 3, #token: 90, "
                      "token usage: 0.01, gen throughput (token/s): 80.00, #queue-req: 2, ")
    assert tracker.snapshot().running_reqs == 3  # later traffic counts as before
