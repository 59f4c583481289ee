"""adv22: what else changes hidden states with the same weights, and what the identity check reads.

The check of issue 22 compared the weights' names, sizes and times, the capture layers, the chat template
and the version.  Three changes passed it: the model folder's ``config.json`` edited (a rope setting, a
layer count), a server of the same folder started with ``--dtype float16`` (or ``--quantization``,
``--kv-cache-dtype``, ``--json-model-override-args``), and its template files were read with a plain
``read_bytes``: a FIFO planted as ``chat_template.jinja`` held the identity read (so the job) for good.
"""
from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
from _extract_support import wait_for

from sessions.extraction.identity import identity_differences, server_identity


def test_config_dtype_and_template_changes_are_differences_and_a_fifo_is_never_waited_on(
        home, make_emulator_profile, launched, emulator_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(emulator_model_dir, model)
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")

    def serve(name: str, **overrides):
        session = launched.launch(make_emulator_profile(name, tp=1, model_path=str(model), **overrides))
        wait_for(lambda: session.status().state == "ready", f"{name} ready", 180)
        launched.remember(session)
        return session, f"http://127.0.0.1:{session.status().port}"

    first, url = serve("plain")
    before = server_identity(url)
    assert before["model_config"] and before["numerics"]["dtype"] == "auto"
    assert identity_differences(before, server_identity(url)) == []  # the same server is the same

    config_path = model / "config.json"
    original = config_path.read_text()
    config = json.loads(original)
    config["rope_theta"] = float(config.get("rope_theta") or 10000.0) * 4
    config_path.write_text(json.dumps(config))
    assert [d for d in identity_differences(before, server_identity(url)) if d.startswith("model_config:")]
    config_path.write_text(original)

    (model / "chat_template.jinja").unlink()
    os.mkfifo(model / "chat_template.jinja")
    with ThreadPoolExecutor(1) as pool:  # the bound only stops a hung test: a FIFO held the read for good
        planted = pool.submit(server_identity, url).result(timeout=120)
    assert [d for d in identity_differences(before, planted) if d.startswith("chat_template:")]
    (model / "chat_template.jinja").unlink()
    first.stop()

    _second, other_url = serve("half", extra_args=["--dtype", "float16"])
    differences = identity_differences(before, server_identity(other_url))
    assert [d for d in differences if d.startswith("numerics:") and "float16" in d], differences


@pytest.mark.parametrize("recorded", [5, [1], [1, 2, 3], None, "big", {"size": 1}])
def test_a_recorded_weights_entry_of_another_shape_is_a_worded_difference_not_a_raise(recorded) -> None:
    """job.json's server_identity is read back as it is; ``(size, mtime) = 5`` raised TypeError out of the
    resume's identity check."""
    differences = identity_differences({"weights": {"model.safetensors": recorded}},
                                       {"weights": {"model.safetensors": [10, 1_700_000_000_000_000_000]}})
    when = datetime.fromtimestamp(1.7e9).isoformat(sep=" ", timespec="seconds")
    assert differences == [f"weights: model.safetensors changed (size ? → 10 bytes, modified ? → {when})"]

