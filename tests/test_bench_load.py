"""experiments.bench.bench_load on a tiny random shape: every strategy at every batch size, positive
throughput and roofline numbers, the crossover read off the rows, files written."""

import json

import pytest

from experiments.bench import bench_load


def test_tiny_shape_runs_and_reports(tmp_path):
    res = bench_load.main(["--shape", "tiny", "--batches", "1", "2", "--gen-length", "16", "--block-length", "8",
                           "--threads", "1", "--out", str(tmp_path)])
    assert {(r["strategy"], r["batch"]) for r in res["rows"]} == {(s, b) for s in bench_load.STRATEGIES for b in (1, 2)}
    for r in res["rows"]:
        assert r["tokens_per_s"] > 0 and r["floor_s"] > 0 and r["roofline_tokens_per_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * 16 / r["seconds"])
    ar = {r["batch"]: r["tokens_per_s"] for r in res["rows"] if r["strategy"] == "ar"}
    for name, cross in res["crossover"].items():
        rows = {r["batch"]: r["tokens_per_s"] for r in res["rows"] if r["strategy"] == name}
        first = next((b for b in sorted(rows) if rows[b] < ar[b]), None)
        assert cross["tokens_per_s"] == first
    saved = json.loads((tmp_path / "tiny_g16.json").read_text())
    assert saved["machine"]["peak_flops"] > 0 and saved["machine"]["bandwidth"] > 0
    for r in res["rows"]:  # the loop counts FLOPs per row: the batch's floor is B times that at least
        assert r["floor_s"] >= r["batch"] * r["flops"] / saved["machine"]["peak_flops"] * (1 - 1e-9)  # json floats: 10 digits
    assert (tmp_path / "tiny_g16.md").read_text().startswith("# Throughput under load")
    assert (tmp_path / "tiny_g16.png").stat().st_size > 0


@pytest.mark.parametrize("argv,word", [(["--batches", "0"], "batches"), (["--strategies", "baseline"], "ar"),
                                       (["--gen-length", "20"], "gen-length")])
def test_bad_flags(argv, word, tmp_path):
    with pytest.raises(ValueError, match=word):
        bench_load.main(["--shape", "tiny", "--out", str(tmp_path), *argv])


def test_skip_after_drops_a_slow_strategys_larger_batches(tmp_path):
    res = bench_load.main(["--shape", "tiny", "--batches", "1", "2", "4", "--gen-length", "16", "--block-length", "8",
                           "--threads", "1", "--strategies", "ar", "baseline", "--skip-after", "1e-9",
                           "--out", str(tmp_path)])
    assert {(r["strategy"], r["batch"]) for r in res["rows"]} == {("ar", 1), ("baseline", 1)}
    assert res["skipped"] == [{"strategy": s, "batch": b} for s in ("ar", "baseline") for b in (2, 4)]
    assert "Not run (a smaller batch took over 1e-09 s): baseline at batch 4." in (tmp_path / "tiny_g16.md").read_text()
    with pytest.raises(ValueError, match="--skip-after"):
        bench_load.main(["--shape", "tiny", "--skip-after", "0"])


def test_the_ar_row_runs_the_lean_decoder(monkeypatch, tmp_path):
    calls = []
    real = bench_load.ar_decode
    monkeypatch.setattr(bench_load, "ar_decode", lambda model, ids, mask, gen: calls.append((ids.shape[0], gen))
                        or real(model, ids, mask, gen))
    res = bench_load.main(["--shape", "tiny", "--batches", "2", "--gen-length", "16", "--block-length", "8",
                           "--threads", "1", "--strategies", "ar", "--out", str(tmp_path)])
    assert calls == [(1, 16), (2, 16)]  # the warm-up, then the timed call
    assert [(r["strategy"], r["nfe"]) for r in res["rows"]] == [("ar", 16)]
