"""experiments.bench.breakdown on the tiny shape: every forward kind at every batch, whole and
matmul times with intervals, the table written; a bad --gen-length is refused before any compute."""

import pytest

from experiments.bench import breakdown


def test_tiny_shape_times_every_kind(tmp_path):
    res = breakdown.main(["--shape", "tiny", "--batches", "1", "2", "--prompt-len", "8", "--gen-length", "64",
                          "--repeats", "3", "--threads", "1", "--out", str(tmp_path)])[0]
    assert [(r["kind"], r["batch"]) for r in res["rows"]] == [(k, b) for k in breakdown.KINDS for b in (1, 2)]
    shapes = {r["kind"]: (r["queries"], r["head"]) for r in res["rows"]}
    assert shapes == {"full": (72, 32), "prefix": (64, 32), "dual": (32, 32), "exact": (16, 16), "ar": (1, 1)}
    for r in res["rows"]:
        assert r["whole_s"] > 0 and r["matmuls_s"] > 0
        lo, hi = r["whole_over_matmuls"]["ci"]
        assert lo <= r["whole_over_matmuls"]["median"] <= hi
    md = (tmp_path / "breakdown_tiny.md").read_text()
    assert md.startswith("# Forward time against its matmuls: tiny shape, prompt 8, gen 64")
    assert md.count("\n| ") == 1 + 10  # header and one row per kind and batch


def test_gen_length_must_fill_blocks(tmp_path):
    with pytest.raises(ValueError, match="--gen-length must be a multiple of 32, got 40"):
        breakdown.main(["--shape", "tiny", "--gen-length", "40", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())
