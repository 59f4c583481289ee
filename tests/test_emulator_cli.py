"""The SGLang emulator's command line (flags and their errors spelled as SGLang's argparse spells them) and
its pieces (no torch on import, tqdm's bars, the fixed backend)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _emulator_support import (
    REPO_ROOT,
)
from conftest import SMALL_CONFIG

# -- the command line --------------------------------------------------------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessions.emulator", *args],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )


def test_unknown_and_ambiguous_flags_exit_2_like_sglang(tmp_path, models):
    result = run_cli("--model-path", str(models["small"]), "--bogus-flag", cwd=tmp_path)
    assert (
        result.returncode == 2
        and "sglang serve: error: unrecognized arguments: --bogus-flag" in result.stderr
    )
    result = run_cli("--model-path", str(models["small"]), "--cuda-graph-max-bs", "8", cwd=tmp_path)
    assert result.returncode == 2 and "ambiguous option: --cuda-graph-max-bs could match" in result.stderr
    result = run_cli("--model-path", str(models["small"]), "--emulate-fault", "melt", cwd=tmp_path)
    assert result.returncode == 2 and "invalid choice: 'melt'" in result.stderr


def test_help_works_and_a_missing_model_dir_is_named(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0 and "--emulate-fault" in result.stdout and "--tp-size" in result.stdout
    result = run_cli("--model-path", str(tmp_path / "absent"), cwd=tmp_path)
    assert (
        result.returncode == 1 and f"model path '{tmp_path / 'absent'}' is not a directory" in result.stderr
    )
    (tmp_path / "empty").mkdir()
    result = run_cli("--model-path", str(tmp_path / "empty"), cwd=tmp_path)
    assert result.returncode == 1 and "has no config.json" in result.stderr


def test_parse_args_accepts_sglang_spellings():
    from sessions.emulator.args import parse_args

    ns, options = parse_args(
        [
            "--model",
            "/m",
            "--tp",
            "8",
            "--ep",
            "8",
            "--return-aux-hidden-state-layer-ids",
            "2",
            "30",
            "58",
            "--context-length",
            "128Ki",
            "--emulate-gpus",
            "16",
        ]
    )
    assert ns.model_path == "/m" and ns.tp_size == 8 and ns.ep_size == 8
    assert ns.return_aux_hidden_state_layer_ids == [2, 30, 58] and ns.context_length == 131072
    assert options.gpus == 16 and options.time_scale == 0.05 and str(options.fault) == "none"


def test_capture_flag_errors_are_sglangs(models):
    from sessions.emulator.args import parse_args, resolve_server_args
    from sessions.emulator.model_config import load_model_config

    model = load_model_config(models["small"])
    for argv, message in [
        (["--return-aux-hidden-state-layer-ids", "1"], "requires --enable-return-aux-hidden-states"),
        (
            ["--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids", "2", "2"],
            "duplicates",
        ),
        (
            [
                "--enable-return-aux-hidden-states",
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                "/d",
            ],
            "capture-only",
        ),
        (["--mem-fraction-static", "1.5"], "must be in (0, 1)"),
    ]:
        ns, _ = parse_args(["--model-path", str(models["small"]), *argv])
        with pytest.raises(ValueError, match=re.escape(message)):
            resolve_server_args(ns, model)


def test_importing_the_emulator_pulls_no_torch():
    code = (
        "import sys, sessions.emulator.startup, sessions.emulator.ranks, sessions.emulator.http; "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
    )
    assert result.stdout.strip() == "False", result.stderr


# -- pieces ------------------------------------------------------------------------------------------------


def test_progress_bars_render_exactly_like_tqdm():
    from tqdm import tqdm

    from sessions.emulator.console import WEIGHT_BAR_FORMAT, format_meter

    for n, total, elapsed, desc, fmt in [
        (0, 64, 0.0, "Multi-thread loading shards", WEIGHT_BAR_FORMAT),
        (1, 1, 1 / 2.76, "Multi-thread loading shards", WEIGHT_BAR_FORMAT),
        (74, 163, 42.5, "Multi-thread loading shards", WEIGHT_BAR_FORMAT),
        (0, 58, 0.0, None, None),
        (1, 52, 0.5, "Capturing batches (bs=512 avail_mem=20.51 GB)", None),
        (37, 52, 3700.0, "Capturing batches (bs=16 avail_mem=20.51 GB)", None),
        (52, 52, 61.0, "Capturing prefill shape (num_tokens=4 avail_mem=9.20 GB)", None),
    ]:
        assert format_meter(n, total, elapsed, desc, fmt) == tqdm.format_meter(
            n, total, elapsed, prefix=desc or "", bar_format=fmt
        )


def test_fixed_backend_is_deterministic_and_caches_prefixes(models):
    from sessions.emulator.backend import FixedBackend, RequestError

    flags = {"chunked_prefill_size": 8192, "time_scale": 0}
    backend = FixedBackend(str(models["small"]), flags)
    first = backend.generate(
        {"input_ids": [1, 2, 3, 4], "rid": "x", "sampling_params": {"max_new_tokens": 4}}
    )
    again = backend.generate(
        {"input_ids": [1, 2, 3, 4, 5], "rid": "y", "sampling_params": {"max_new_tokens": 4}}
    )
    other = FixedBackend(str(models["small"]), flags).generate(
        {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 4}}
    )
    assert first["output_ids"] == other["output_ids"] and first["text"] == other["text"]
    assert first["meta_info"]["cached_tokens"] == 0 and again["meta_info"]["cached_tokens"] == 4
    no_cache = FixedBackend(str(models["small"]), dict(flags, disable_radix_cache=True))
    no_cache.generate({"input_ids": [1, 2, 3]})
    assert no_cache.generate({"input_ids": [1, 2, 3]})["meta_info"]["cached_tokens"] == 0
    with pytest.raises(RequestError, match="max_new_tokens"):
        backend.generate({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}})
    with pytest.raises(RequestError, match="context length"):
        backend.generate({"input_ids": [1] * SMALL_CONFIG["max_position_embeddings"]})
