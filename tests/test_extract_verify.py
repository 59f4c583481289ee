"""``extract verify``: passes on good output, fails naming the file on a corrupted one; ``--against-http``
re-requests samples from the server; ``--lm-head-check`` catches a wrong final state on the demo model."""
from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import torch
from _extract_support import run_cli, stop_job, write_spec

from sessions.capture.writer import write_chunks
from sessions.extraction.collector import collect_sample
from sessions.extraction.output import ManifestEntry, OutputDir
from sessions.extraction.verify import check_sample_file

H, K = 16, 3


def build_output(root: Path, count: int = 5) -> Path:
    """A small output dir made the way a job makes it: real dumps → collector → writer → manifest."""
    capture = root / "capture"
    capture.mkdir(mode=0o700)
    out = OutputDir(root / "out")
    out.acquire("j", fresh=True)
    for index in range(count):
        tokens = 4 + index
        ids = torch.arange(tokens) + 10
        write_chunks(capture, [f"r-{index}"], [0], [tokens], torch.randn(tokens, K * H), torch.randn(tokens, H),
                     ids, {"layers": [2, 4, 5], "hidden_size": H}, fsync=False)
        sample, _ = collect_sample(capture, f"r-{index}", f"j-{index}", ids.tolist(), [0, 0] + [1] * (tokens - 2),
                                   None, 1.0)
        rel, size, checksum = out.write_sample(index, sample)
        out.append(ManifestEntry(index, index + 1, f"j-{index}", "ok", tokens, tokens - 2, rel, size, checksum))
    out.write_dataset_json({"job_id": "j", "complete": True, "hidden_size": H, "aux_width": K * H,
                            "counts": {"ok": count}})
    out.release()
    return out.root


def verify(out: Path, env: dict, *extra: str) -> tuple[int, dict]:
    result = run_cli(["extract", "verify", str(out), "--json", *extra], env)
    return result.returncode, json.loads(result.stdout)


def test_good_output_passes_and_each_kind_of_damage_is_named(home, cli_env, tmp_path: Path) -> None:
    out = build_output(tmp_path)
    code, report = verify(out, cli_env)
    assert code == 0 and report["ok"] and report["files_checked"] == 5

    flipped = out / "rows_0-2000" / "data_1.ckpt"
    raw = bytearray(flipped.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    (out / "rows_0-2000" / "data_3.ckpt").unlink()
    shutil.copy(out / "rows_0-2000" / "data_0.ckpt", out / "rows_0-2000" / "data_77.ckpt")
    code, report = verify(out, cli_env)
    assert code == 1 and not report["ok"]
    named = {p["path"]: p["message"] for p in report["problems"]}
    assert "checksum" in named["rows_0-2000/data_1.ckpt"] or "cannot be loaded" in named["rows_0-2000/data_1.ckpt"]
    assert "missing" in named["rows_0-2000/data_3.ckpt"]
    assert "not in manifest.jsonl" in named["rows_0-2000/data_77.ckpt"]


def test_contract_violations_inside_a_file_are_named(home, cli_env, tmp_path: Path) -> None:
    out = build_output(tmp_path, count=2)
    path = out / "rows_0-2000" / "data_0.ckpt"
    data = torch.load(path, weights_only=True)
    data["input_ids"] = data["input_ids"][None]  # [1, T]: breaks SpecForge's normaliser
    data["hidden_state"][0, 1, 2] = float("inf")
    torch.save(data, path)
    entries, _ = OutputDir(out).read_manifest()
    from sessions.extraction.output import file_crc32

    entries[0] = ManifestEntry(**{**entries[0].__dict__, "bytes": path.stat().st_size,
                                  "checksum": file_crc32(path)})
    OutputDir(out)._rewrite(entries.values())
    code, report = verify(out, cli_env)
    assert code == 1
    (problem,) = report["problems"]
    assert problem["path"] == "rows_0-2000/data_0.ckpt" and "expected 1-D [T]" in problem["message"]


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers every POST with the body the test put under the port."""

    bodies: ClassVar[dict[int, bytes]] = {}

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = self.bodies[self.server.server_address[1]]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


# Each hostile answer is given to the sample whose prompt has its length (build_output: sample i has 4 + i
# tokens), so one output and one `extract verify --against-http 6` (one CLI start, not six) check them all;
# each case below still asserts on its own sample's comparison.
HOSTILE_ANSWERS = [
    (b"[1]", "is a number, not an object"),
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
    (b'{"meta_info": {"hidden_states": [[[NaN, 1.0]]]}}', "not a finite number"),
    (b'{"meta_info": {"hidden_states": [[[1.0, 2.0], [1.0]]]}}', "not a matrix of numbers"),
    (b'{"meta_info": {"hidden_states": [[["a", "b"]]]}}', "not a matrix of numbers"),
    (b'{"meta_info": {"hidden_states": [[[' + b"1.0," * 2_000_000 + b'1.0]]]}}', "cap"),
]


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers each POST with the hostile body planted for its prompt's length."""

    bodies: ClassVar[dict[int, bytes]] = {}

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        body = self.bodies[len(request["input_ids"])]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def hostile_verify(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """One output of one sample per hostile answer, verified once against a server giving each its answer."""
    from conftest import REPO_ROOT

    from sessions.home import HOME_ENV, resolve_home

    root = tmp_path_factory.mktemp("hostile")
    env = {**os.environ, HOME_ENV: str(root / "eagle3-home"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))}
    env.pop("EAGLE3_TUI_DEMO", None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HOME_ENV, env[HOME_ENV])
        resolve_home().ensure()
    out = build_output(root, count=len(HOSTILE_ANSWERS))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    _Answers.bodies.update({4 + index: body for index, (body, _) in enumerate(HOSTILE_ANSWERS)})
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        result = run_cli(["extract", "verify", str(out), "--json", "--against-http", str(len(HOSTILE_ANSWERS)),
                          "--server-url", f"http://127.0.0.1:{server.server_address[1]}"], env)
    finally:
        server.shutdown()
        server.server_close()
    checks = {c["path"]: c for c in json.loads(result.stdout)["http"]} if result.stdout else {}
    return result, checks, out


@pytest.mark.parametrize(("body", "why"), HOSTILE_ANSWERS)
def test_a_hostile_generate_answer_is_a_mismatch_with_its_reason(hostile_verify, body: bytes, why: str) -> None:
    """adv22: ``--against-http`` read /generate with httpx (no size cap, 600 s per read) and ``.json()``: a
    non-object answer raised AttributeError, a deep one RecursionError, ragged rows ValueError."""
    result, checks, out = hostile_verify
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert len(checks) == len(HOSTILE_ANSWERS), checks
    entries, _ = OutputDir(out).read_manifest()
    check = checks[entries[HOSTILE_ANSWERS.index((body, why))].path]
    assert not check["ok"] and why in check["note"], check


def test_a_fifo_for_weights_or_a_sample_is_named_never_waited_on(home, cli_env, tmp_path: Path) -> None:
    """adv22: safetensors' ``safe_open`` and ``torch.load(mmap=True)`` open files by name themselves; a FIFO
    planted as ``model.safetensors`` made ``--lm-head-check`` wait for a writer for good (run_cli's timeout
    only stops a hung test).  Now each is opened by `safe_files.opened_path` first."""
    out = build_output(tmp_path, count=2)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": H}))
    os.mkfifo(model / "model.safetensors")
    result = run_cli(["extract", "verify", str(out), "--lm-head-check", "--model-path", str(model)], cli_env,
                     timeout=300)
    assert result.returncode == 1 and "model.safetensors is a FIFO" in result.stderr, result.stderr
    sample = out / "rows_0-2000" / "data_1.ckpt"
    sample.unlink()
    os.mkfifo(sample)
    problems, data = check_sample_file(sample, H, K * H)
    assert data == {} and "FIFO" in problems[0], problems
    with pytest.raises(OSError, match="FIFO"):
        OutputDir(out).token_counts(OutputDir(out).read_manifest()[0].values())


@pytest.mark.parametrize(("extra", "named"), [(["--against-http", "-5"], "--against-http"),
                                              (["--min-top1", "nan"], "--min-top1"),
                                              (["--min-top1", "7"], "--min-top1")])
def test_verify_arguments_out_of_reason_are_refused_naming_the_flag(home, cli_env, tmp_path: Path, extra, named):
    """adv22: ``--against-http -5`` compared nothing and said OK; ``--min-top1 nan`` could never pass."""
    out = build_output(tmp_path, count=1)
    result = run_cli(["extract", "verify", str(out), *extra], cli_env)
    assert result.returncode == 2 and named in result.stderr and "Traceback" not in result.stderr, result.stderr


# -- against the emulator --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sessions.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "demo", num_layers=8, hidden_size=64)


@pytest.mark.slow
def test_lm_head_and_http_checks_pass_on_real_output_and_catch_a_wrong_final_state(
        home, cli_env, make_emulator_profile, launched, demo_model, tmp_path: Path) -> None:
    from _extract_support import wait_for
    from transformers import AutoTokenizer

    from sessions.extraction.job import job_status, run_job

    capture = tmp_path / "capture"
    capture.mkdir(mode=0o700)
    profile = make_emulator_profile("verify", tp=1, model_path=str(demo_model), chunked_prefill_size=-1,
                                    capture={"enabled": True, "dir": str(capture), "rid_prefix": "eagle3-"})
    session = launched.launch(profile)
    wait_for(lambda: session.status().state == "ready", "server ready", 180)
    url = f"http://127.0.0.1:{session.status().port}"
    # A regenerated dataset: each answer is the model's own greedy continuation (as EAGLE-3 data should be).
    tokenizer = AutoTokenizer.from_pretrained(demo_model, local_files_only=True)
    rows = []
    for question in ("What is the capital city of France?", "Tell me a short story.", "Hello! How are you?"):
        prompt = list(tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                    add_generation_prompt=True, tokenize=True)["input_ids"])
        reply = httpx.post(f"{url}/generate", json={"input_ids": prompt, "sampling_params": {
            "max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}, timeout=60).json()
        rows.append({"input_ids": prompt + reply["output_ids"],
                     "loss_mask": [0] * len(prompt) + [1] * len(reply["output_ids"])})
    dataset = tmp_path / "regenerated.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = write_spec(tmp_path / "job.toml", name="v", session=session.session_id, dataset=dataset,
                      output_dir=tmp_path / "out", dataset_format="tokenized")
    job_id = run_job(spec, home)
    try:
        wait_for(lambda: job_status(job_id, home).state in ("done", "failed"), "job finished", 240)
    finally:
        stop_job(job_id, home)
    out = tmp_path / "out"
    code, report = verify(out, cli_env, "--lm-head-check", "--min-top1", "0.9", "--against-http", "2")
    assert code == 0, report
    assert report["lm_head"]["positions"] == 3 * 24 and report["lm_head"]["top1"] >= 0.9
    assert len(report["http"]) == 2 and all(c["ok"] for c in report["http"])

    # A capture that stored a pre-norm middle layer as the "final" state: the files are well-formed, the
    # lm_head check is what catches it.
    wrong = OutputDir(out)
    entries, _ = wrong.read_manifest()
    fixed = {}
    for index, entry in entries.items():
        data = torch.load(out / entry.path, weights_only=True)
        data["hidden_state"] = data["aux_hidden_state"][:, :, 64:128].clone()
        _, size, checksum = wrong.write_sample(index, data)
        fixed[index] = ManifestEntry(**{**entry.__dict__, "bytes": size, "checksum": checksum})
    wrong._rewrite(fixed.values())
    code, report = verify(out, cli_env, "--lm-head-check", "--min-top1", "0.9")
    assert code == 1 and report["problems"] == [] and report["lm_head"]["top1"] < 0.9
