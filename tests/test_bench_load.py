"""experiments.bench.bench_load on a tiny random shape: every strategy at every batch size, positive
throughput and roofline numbers, the crossover read off the rows, files written."""

import json

import pytest

from experiments.bench import bench_load


def test_tiny_shape_runs_and_reports(tmp_path):
    res = bench_load.main(["--shape", "tiny", "--batches", "1", "2", "--gen-length", "16", "--block-length", "8",
                           "--threads", "1", "--repeats", "3", "--out", str(tmp_path)])
    assert {(r["strategy"], r["batch"]) for r in res["rows"]} == {(s, b) for s in bench_load.STRATEGIES for b in (1, 2)}
    ar = {r["batch"]: r for r in res["rows"] if r["strategy"] == "ar"}
    for r in res["rows"]:
        assert r["tokens_per_s"] > 0 and r["floor_s"] > 0 and r["roofline_tokens_per_s"] > 0
        assert r["useful_tokens"] == r["batch"] * 16  # a random model has no EOS: every column counts
        assert len(r["times"]) == 3 and r["seconds"] == sorted(r["times"])[1]
        assert r["tokens_per_s"] == pytest.approx(r["useful_tokens"] / r["seconds"])
        if r["strategy"] != "ar":  # throughput ratio per round, median
            a = ar[r["batch"]]
            per_round = sorted(a["t"] / t for a["t"], t in zip(a["times"], r["times"]))
            assert r["vs_ar"]["median"] == pytest.approx(per_round[1])
            assert r["verdict"] == bench_load.verdict(r["vs_ar"]["ci"])
    assert set(res["crossover"]) == set(bench_load.STRATEGIES) - {"ar"}
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
    assert res["skipped"] == [{"strategy": s, "batch": b} for b in (2, 4) for s in ("ar", "baseline")]
    assert "Not run (a smaller batch took over 1e-09 s): baseline at batch 4." in (tmp_path / "tiny_g16.md").read_text()
    with pytest.raises(ValueError, match="--skip-after"):
        bench_load.main(["--shape", "tiny", "--skip-after", "0"])


def test_the_ar_row_runs_the_lean_decoder(monkeypatch, tmp_path):
    calls = []
    real = bench_load.ar_decode
    monkeypatch.setattr(bench_load, "ar_decode", lambda model, ids, mask, gen, stop_at_eos:
                        calls.append((ids.shape[0], gen, stop_at_eos)) or real(model, ids, mask, gen))
    res = bench_load.main(["--shape", "tiny", "--batches", "2", "--gen-length", "16", "--block-length", "8",
                           "--threads", "1", "--strategies", "ar", "--repeats", "2", "--out", str(tmp_path)])
    assert calls == [(2, 16, False)] * 3  # the tokens (also the warm-up), two rounds (no EOS on a random model)
    assert [(r["strategy"], r["nfe"]) for r in res["rows"]] == [("ar", 16)]


def rows_of(verdicts: dict, ar_roof: dict, roof: dict) -> list[dict]:
    rows = [{"strategy": "ar", "batch": b, "roofline_tokens_per_s": ar_roof[b]} for b in verdicts]
    return rows + [{"strategy": "x", "batch": b, "verdict": v, "roofline_tokens_per_s": roof[b]}
                   for b, v in verdicts.items()]


@pytest.mark.parametrize("verdicts,measured,wins", [
    ({1: "faster", 2: "tied", 4: "slower", 8: "slower"}, 4, True),
    ({1: "faster", 2: "slower", 4: "tied", 8: "slower"}, 8, True),  # slower at 2 but not from 2 on
    ({1: "tied", 2: "faster", 4: "faster", 8: "tied"}, None, False),
    ({1: "slower", 2: "slower"}, 1, False),
])
def test_crossover_is_the_batch_from_which_every_batch_is_slower(verdicts, measured, wins):
    batches = list(verdicts)
    roof = {b: 10.0 / b for b in batches}
    cross = bench_load.crossovers(rows_of(verdicts, {b: 1.0 for b in batches}, roof))["x"]
    brute = next((b for b in batches if all(verdicts[c] == "slower" for c in batches if c >= b)), None)
    assert cross["measured"] == brute == measured
    assert cross["roofline"] == next(b for b in batches if roof[b] < 1.0) if any(roof[b] < 1 for b in batches) else True
    assert cross["wins_at_1"] is wins


def test_verdict_reads_the_interval():
    assert [bench_load.verdict(ci) for ci in ([1.1, 2.0], [0.5, 0.9], [0.9, 1.1], [1.0, 1.2])] == \
        ["faster", "slower", "tied", "tied"]
