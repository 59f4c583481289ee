"""Our output read by SpecForge 0.2.0's own code: its offline reader (with validation on), its feature-file
loader and its EAGLE-3 normaliser; and our vocab map equal to the one its own function builds."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from _extract_support import assert_specforge_reads, specforge_modules, specforge_vocab_function

from sessions.capture.writer import write_chunks
from sessions.extraction.collector import collect_sample
from sessions.extraction.output import ManifestEntry, OutputDir

H, K = 16, 3


def test_collected_samples_load_with_specforges_reader_and_normaliser(tmp_path: Path) -> None:
    capture = tmp_path / "capture"
    capture.mkdir(mode=0o700)
    out = OutputDir(tmp_path / "out", file_group_size=2)
    out.acquire("j", fresh=True)
    for index, tokens in enumerate((5, 9, 1, 17)):
        rid = f"eagle3-j-{index}"
        ids = torch.arange(100, 100 + tokens)
        write_chunks(capture, [rid], [0], [tokens], torch.randn(tokens, K * H), torch.randn(tokens, H), ids,
                     {"layers": [2, 4, 5], "hidden_size": H}, fsync=False)
        sample, _ = collect_sample(capture, rid, f"j-{index}", ids.tolist(), [0] + [1] * (tokens - 1), None, 1.0)
        rel, size, checksum = out.write_sample(index, sample)
        out.append(ManifestEntry(index, index + 1, f"j-{index}", "ok", tokens, tokens - 1, rel, size, checksum))
    out.write_dataset_json({"job_id": "j"})
    out.release()
    assert assert_specforge_reads(out.root, H, K * H) == 4
    load_feature_file, _, _ = specforge_modules()
    raw = load_feature_file(str(out.root / "rows_2-4" / "data_3.ckpt"))
    assert raw["sample_id"] == "j-3"  # our extra key rides along; SpecForge ignores it


def test_vocab_mapping_matches_specforges_own_construction(tmp_path: Path) -> None:
    counts = {7: 50, 3: 40, 11: 30, 2: 20, 5: 10, 9: 5}
    out = OutputDir(tmp_path / "out")
    out.acquire("j", fresh=True)
    for draft_vocab in (4, 8):
        out.write_vocab_mapping(counts, draft_vocab, target_vocab_size=16)
        ours = torch.load(out.vocab_mapping_path, weights_only=True)
        d2t, t2d = specforge_vocab_function()(Counter(counts), draft_vocab, 16)
        assert torch.equal(ours["d2t"], d2t) and torch.equal(ours["t2d"], t2d), draft_vocab
        assert ours["d2t"].dtype == torch.int64 and ours["t2d"].dtype == torch.bool
    out.release()
