"""research.bd3_blocks on a tiny random BD3-LM checkpoint: exact cache = uncached outputs,
resumable logs, the table, bad arguments."""

from __future__ import annotations

import json

import pytest

from tiny import tokenizer_model
from research import bd3_blocks
from harness.results import read_jsonl


@pytest.fixture(scope="module")
def bd3_ckpt(tmp_path_factory):
    from bd3lm import BD3Config, save_bd3
    from tasks.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model = tokenizer_model(tok, max_seq_len=512)
    return save_bd3(model, tok, tmp_path_factory.mktemp("b") / "bd3", BD3Config(block_size=4, align="prompt"))


def test_cached_equals_uncached_and_resume(bd3_ckpt, tmp_path, monkeypatch):
    argv = ["--models", str(bd3_ckpt), "--n", "3", "--uncached", "2", "--batch-size", "2", "--gen-length", "16",
            "--fewshot", "0", "1", "--out", str(tmp_path)]
    bd3_blocks.main(argv)
    for k in (0, 1):
        cached = read_jsonl(tmp_path / f"L4_k{k}.jsonl")
        uncached = read_jsonl(tmp_path / f"L4_k{k}_uncached.jsonl")
        assert len(cached) == 3 and len(uncached) == 2
        for a, b in zip(cached, uncached):  # the exact cache changes nothing
            assert a["prediction"] == b["prediction"] and a["id"] == b["id"]
        assert {r["model_weights"] for r in cached} == {r["model_weights"] for r in uncached}
    rows = json.loads((tmp_path / "table.json").read_text())["rows"]
    assert [(r["block_size"], r["shots"], r["n"], r["n_uncached"]) for r in rows] == [(4, 0, 3, 2), (4, 1, 3, 2)]
    assert all(r["identical_outputs"] == 1.0 for r in rows)
    assert rows[1]["mean_prompt_length"] > rows[0]["mean_prompt_length"]
    before = {p.name: p.read_text() for p in tmp_path.glob("*.jsonl")}

    def no_compute(*a, **k):
        raise AssertionError("resumed run recomputed a sample")

    monkeypatch.setattr("harness.evaluate.generate", no_compute)
    bd3_blocks.main(argv)
    assert {p.name: p.read_text() for p in tmp_path.glob("*.jsonl")} == before
    with pytest.raises(ValueError, match="--out"):  # another config into the same files
        bd3_blocks.main([("8" if a == "16" else a) for a in argv])  # --gen-length 8


def test_bad_args(tmp_path):
    with pytest.raises(ValueError, match="--models"):
        bd3_blocks.main(["--models", str(tmp_path / "nope"), "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--n"):
        bd3_blocks.main(["--models", str(tmp_path), "--n", "0", "--out", str(tmp_path)])
