"""The demo's data passes its own checks (issue 21 item 3).

The demo dataset's answers are the demo model's own greedy answers: the committed book equals what the
emulator's model backend generates from the model that `ensure_demo_home` writes, and the demo job's output
passes `extract verify --lm-head-check`.  The check means something only if wrong final states fail it:
pre-norm states, states shifted by one position, and another layer's states are planted in copies of a
real job's output, and each must fail.  Real parts: the emulator with capture on, a detached job, the CLI.
"""
from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
from _extract_support import run_cli, run_job_to_end, wait_for, write_spec

from sessions.demo import TINY_MODEL_SHAPE, demo_conversation_plans, demo_dataset_text
from sessions.demo_answers import ANSWERS_FILE, answer_key, generate_answers, load_book, model_fingerprint
from sessions.extraction.output import ManifestEntry, OutputDir
from sessions.extraction.verify import verify_output

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny model, written as the demo home writes it."""
    from sessions.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "tiny-llama", **TINY_MODEL_SHAPE)


def test_the_committed_answers_are_the_demo_models_own_greedy_answers(tiny_model: Path) -> None:
    fingerprint, book = load_book()
    assert fingerprint == model_fingerprint(tiny_model), (
        f"{ANSWERS_FILE} came from other model files; regenerate it (see sessions/demo_answers.py)")
    generated = generate_answers(tiny_model, demo_conversation_plans())
    assert {answer_key(e["messages"], e["max_new_tokens"]): e["answer"] for e in generated} == book
    # Every assistant turn of the dataset is one of them, and none is empty.
    rows = [json.loads(line) for line in demo_dataset_text(book).splitlines() if line.endswith("}")]
    answers = [t["value"] for r in rows for t in r["conversations"] if t["from"] == "gpt"]
    assert answers and all(a.strip() for a in answers) and set(answers) <= set(book.values())


@functools.cache
def _loaded(model_dir: Path) -> torch.nn.Module:
    """The model, read once per module (the planted pre-norm states need it for every sample)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()


def _final_states(model_dir: Path, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pre-norm final states, post-norm final states) of the model for these ids, [1, T, H] bf16."""
    model = _loaded(model_dir)
    seen: dict[str, torch.Tensor] = {}
    handle = model.model.norm.register_forward_hook(lambda _m, args, out: seen.update(pre=args[0], post=out))
    with torch.inference_mode():
        model.model(input_ids=input_ids[None])
    handle.remove()
    return seen["pre"].to(torch.bfloat16), seen["post"].to(torch.bfloat16)


def _plant(out: Path, into: Path, change) -> Path:
    """A copy of ``out`` whose every sample's ``hidden_state`` is ``change(sample)``, its manifest updated
    (sizes and checksums), so that the files pass every other check and only the lm_head check is left."""
    shutil.copytree(out, into)
    planted = OutputDir(into)
    entries, _ = planted.read_manifest()
    fixed = {}
    for index, entry in entries.items():
        if entry.status != "ok":
            fixed[index] = entry
            continue
        data = torch.load(into / entry.path, weights_only=True)
        data["hidden_state"] = change(data).contiguous()
        _, size, checksum = planted.write_sample(index, data)
        fixed[index] = ManifestEntry(**{**entry.__dict__, "bytes": size, "checksum": checksum})
    planted._rewrite(fixed.values())
    return into


def test_the_demo_jobs_output_passes_the_lm_head_check_and_planted_wrong_final_states_fail_it(
        home, cli_env, make_emulator_profile, launched, tiny_model, tmp_path) -> None:
    capture = tmp_path / "capture"
    capture.mkdir(mode=0o700)
    profile = make_emulator_profile("tiny", tp=1, model_path=str(tiny_model),
                                    capture={"enabled": True, "dir": str(capture), "rid_prefix": "eagle3-"})
    session = launched.launch(profile)
    wait_for(lambda: session.status().state == "ready", "the capture server ready", 180)
    launched.remember(session)
    dataset = tmp_path / "demo-chats.jsonl"
    dataset.write_text(demo_dataset_text())  # the demo's dataset, its broken line included
    out = tmp_path / "out"
    spec = write_spec(tmp_path / "job.toml", name="demo", session=session.session_id, dataset=dataset,
                      output_dir=out, num_samples=30, concurrency=4)
    done = run_job_to_end(spec, cli_env, home, limit_s=300)
    assert done.state == "done" and done.ok == 29, done.reason

    # One verification, by the CLI (its report as JSON), not the CLI and then verify_output in-process again.
    verified = run_cli(["extract", "verify", str(out), "--lm-head-check", "--json"], cli_env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] and report["lm_head"] is not None and report["lm_head"]["positions"] > 500, report
    # Every position agrees but the two per answer the head cannot speak: the end-of-turn marker and the
    # newline after it.
    assert report["lm_head"]["top1"] >= 0.85, report

    num_layers = TINY_MODEL_SHAPE["num_layers"]
    hidden = 64

    def pre_norm(data: dict) -> torch.Tensor:
        return _final_states(tiny_model, data["input_ids"])[0]

    def shifted(data: dict) -> torch.Tensor:  # the state of the position before: off by one
        return torch.roll(data["hidden_state"], shifts=1, dims=1)

    def other_layer(data: dict) -> torch.Tensor:  # the highest captured layer's input, not the final state
        return data["aux_hidden_state"][:, :, -hidden:]

    # The planted pre-norm states are the model's own (its post-norm states match what the job stored).
    first = next(out.rglob("*.ckpt"))
    sample = torch.load(first, weights_only=True)
    post = _final_states(tiny_model, sample["input_ids"])[1]
    assert torch.nn.functional.cosine_similarity(post[0].float(), sample["hidden_state"][0].float()).min() > 0.99
    assert num_layers == 8
    for name, change in (("pre-norm", pre_norm), ("shifted", shifted), ("other-layer", other_layer)):
        planted = _plant(out, tmp_path / name, change)
        bad = verify_output(planted, lm_head_check=True)
        assert bad.problems == () and bad.lm_head is not None and not bad.lm_head.ok, (name, bad.summary())
        assert bad.lm_head.top1 < 0.5, (name, bad.summary())
        result = run_cli(["extract", "verify", str(planted), "--lm-head-check"], cli_env)
        assert result.returncode == 1 and "the final states look wrong" in result.stdout, (name, result.stdout)


def test_a_demo_home_whose_model_differs_gets_that_models_own_answers(home, monkeypatch, tmp_path,
                                                                     seed_demo_models) -> None:
    """Another torch could draw other weights from the same seed: the committed answers would not be that
    model's, so the demo home generates its own (a child process), says so, and the dataset holds them."""
    from sessions.demo import DEMO_DATASET_NAME, demo_root, ensure_demo_home, tiny_model_dir
    from sessions.demo_model import write_demo_model
    from sessions.home import resolve_home

    monkeypatch.setenv("EAGLE3_TUI_DEMO", "1")
    seed_demo_models()  # this model is replaced below: writing it is tested elsewhere (test_demo_entry)
    demo = ensure_demo_home(resolve_home())
    model = tiny_model_dir(demo)
    dataset = demo_root(demo) / "datasets" / DEMO_DATASET_NAME
    shutil.rmtree(model)
    write_demo_model(model, **{**TINY_MODEL_SHAPE, "seed": 5})  # "another torch": other weights
    dataset.unlink()
    said: list[str] = []
    ensure_demo_home(demo, progress=said.append)
    assert any("generating its own answers" in line for line in said), said
    first = json.loads(dataset.read_text().splitlines()[0])
    (entry,) = generate_answers(model, demo_conversation_plans()[:1])  # the first row's one answer, made here
    assert first["conversations"][2] == {"from": "gpt", "value": entry["answer"]}
    assert entry["answer"] not in load_book()[1].values()
