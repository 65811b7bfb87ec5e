"""experiments.bench.bench_ar on the tiny shape (every ratio reported with its interval, files
written) and the interleaved timing / bootstrap helpers of experiments.bench.ratios."""

import pytest
import torch

from experiments.bench import bench_ar, ratios


def test_tiny_shape_reports_every_ratio(tmp_path):
    res = bench_ar.main(["--shape", "tiny", "--batches", "1", "2", "--gen-length", "6", "--repeats", "3",
                         "--threads", "1", "--out", str(tmp_path)])
    assert [r["batch"] for r in res["rows"]] == [1, 2]
    for r in res["rows"]:
        assert set(r["ratios"]) == {f"{a}/{b}" for a, b in bench_ar.RATIOS}
        assert all(len(t) == 3 for t in r["times"].values())
        for v in r["ratios"].values():
            assert v["ci"][0] <= v["median"] <= v["ci"][1] and v["rounds"] == 3
    md = (tmp_path / "ar_tiny_g6.md").read_text()
    assert md.startswith("# Lean AR decoding against its matmuls: tiny shape, gen 6")
    assert "| matmuls / lean |" in md


def test_interleaved_rotates_and_median_ci_brackets():
    order = []
    times = ratios.interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3,
                               torch.device("cpu"))
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then rotated rounds
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    med, lo, hi = ratios.median_ci([1.0, 2.0, 3.0, 4.0, 100.0])
    assert med == 3.0 and 1.0 <= lo <= 3.0 <= hi <= 100.0
    assert ratios.ratio({"x": [2.0, 4.0, 6.0], "y": [1.0, 2.0, 3.0]}, "x", "y") == {"median": 2.0, "ci": [2.0, 2.0],
                                                                                     "rounds": 3}
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        ratios.interleaved({"a": lambda: None}, 0, torch.device("cpu"))
