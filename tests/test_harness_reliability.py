"""The GSM8K harness cannot be silently wrong: per-sample costs independent of the batch size, one
writer per results folder, resumes over edited data refused, ``--dtype auto`` hashed as resolved."""

from __future__ import annotations

import json
import sys
import time

import pytest

from experiments.eval import gsm8k
from harness.results import read_jsonl
from test_gsm8k_harness import TWO, FakeClock, argv, ckpt, run  # noqa: F401  (ckpt: fixture)


def test_per_sample_costs_do_not_depend_on_the_batch_size(ckpt, tmp_path):
    """The same config at batch sizes 1, 3 and 6 records identical per-sample costs and outputs
    (every strategy with a cache, a parallel rule and the EOS stop included)."""
    names = ["baseline_semiar", "fastdllm_dual_threshold", "abl_prefix_topk_eos_semiar", "abl_dual_threshold_eos_full"]
    keys = ("prediction", "nfe", "steps", "positions_computed", "flops", "tokens_committed", "tokens_until_eos")
    by_size = {}
    for bs in (1, 3, 6):
        out = tmp_path / f"b{bs}"
        gsm8k.run(gsm8k.parse_config(["--model", str(ckpt), "--out", str(out), "--limit", "6", "--batch-size",
                                      str(bs), "--gen-length", "32", "--block-length", "4", "--dtype", "float64",
                                      "--strategies", *names]), clock=FakeClock())
        by_size[bs] = {n: {r["id"]: tuple(r[k] for k in keys) for r in read_jsonl(out / f"{n}.jsonl")} for n in names}
        assert all(r["cost_basis"] == "row" and r["batch_rows"] <= bs for n in names
                   for r in read_jsonl(out / f"{n}.jsonl"))
    assert by_size[1] == by_size[3] == by_size[6]
    varied = [n for n in names if len({v[1] for v in by_size[6][n].values()}) > 1]
    assert varied, "no strategy's rows differ in cost: the equality would be trivial"


def test_a_second_run_into_the_same_folder_fails_at_once_naming_the_first(ckpt, tmp_path):
    """Two harness runs with one --out: the second refuses before loading anything, naming the
    holder's pid; the first's results equal an uninterrupted run's."""
    from test_results_io import holder  # a spawned process holding a lock until released

    out = tmp_path / "o"
    out.mkdir()
    with holder(out, how="lock") as p:
        clock = FakeClock()
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=rf"locked by pid {p.pid}"):
            run(ckpt, out, clock=clock)
        assert time.monotonic() - t0 < 1.0 and clock.calls == 0 and not list(out.glob("*.jsonl"))
    run(ckpt, out)  # the lock is free again
    run(ckpt, tmp_path / "ref")
    for name in TWO:
        assert (out / f"{name}.jsonl").read_text() == (tmp_path / "ref" / f"{name}.jsonl").read_text()


def test_a_resume_over_edited_data_is_refused_naming_the_sample(ckpt, tmp_path):
    """Sample ids of a local --data file are row numbers: an edited row must not mix old targets
    with new answers. Records fingerprint their problem; a changed one refuses the resume."""
    from tasks import generate_problems

    rows = [{"question": p.question, "answer": p.answer} for p in generate_problems(n=3, split="test")]
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["--model", str(ckpt), "--data", str(data), "--limit", "3", "--batch-size", "2", "--gen-length", "8",
            "--block-length", "4", "--strategies", "baseline_semiar", "--out", str(tmp_path / "o")]
    gsm8k.run(gsm8k.parse_config(base), clock=FakeClock())
    assert len({r["problem"] for r in read_jsonl(tmp_path / "o" / "baseline_semiar.jsonl")}) == 3
    rows[1]["answer"] = rows[1]["answer"].rsplit("####", 1)[0] + "#### 12345"  # the 2nd target edited in place
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    clock = FakeClock()
    with pytest.raises(ValueError, match="gsm8k-test-1.*another problem"):
        gsm8k.run(gsm8k.parse_config(base), clock=clock)
    assert clock.calls == 0


def test_dtype_auto_is_hashed_as_the_dtype_it_resolves_to(ckpt, tmp_path):
    """--dtype auto means bf16 on a GPU and fp32 on a CPU: the config records the concrete dtype, so
    a GPU run cannot resume into a CPU run's file."""
    run(ckpt, tmp_path / "a", "--dtype", "auto", "--strategies", "baseline_semiar")
    run(ckpt, tmp_path / "b", "--dtype", "float32", "--strategies", "baseline_semiar")
    cfg = {k: json.loads((tmp_path / k / "config.json").read_text())["strategies"]["baseline_semiar"]
           for k in ("a", "b")}
    assert cfg["a"]["config"]["dtype"] == "float32" and cfg["a"]["config_hash"] == cfg["b"]["config_hash"]


def test_config_records_checkout_paths_relative(ckpt, tmp_path, monkeypatch):
    """An absolute path inside the checkout is recorded relative to it (results carry no machine's
    paths); one outside it stays as given."""
    from harness.records import write_run_config
    from harness.results import REPO

    inside = REPO / "results" / "checkpoints" / "llada-arith"
    monkeypatch.setattr("sys.argv", ["gsm8k", "--model", str(inside), "--out", str(tmp_path / "o"), "--limit", "4"])
    cfg = gsm8k.parse_config(argv(ckpt, tmp_path / "o", "--strategies", "baseline_semiar"))
    write_run_config(cfg.out, {}, cfg.baseline, "abc", sys.argv[1:])
    got = json.loads((tmp_path / "o" / "config.json").read_text())["argv"]
    assert got[:2] == ["--model", "results/checkpoints/llada-arith"] and got[3] == str(tmp_path / "o")


def test_skip_decodes_the_later_problems_exactly_as_a_longer_run_does(ckpt, tmp_path):
    """--skip 3 --limit 3 records problems 3-5 with their own indices, ids and outputs: those of
    the same problems in a --limit 6 run (a point picked on 0-2 is confirmed on 3-5)."""
    keys = ("id", "index", "problem", "prediction", "nfe", "tokens_until_eos")
    got = {}
    for name, extra in (("all", ["--limit", "6"]), ("held", ["--skip", "3", "--limit", "3"])):
        gsm8k.run(gsm8k.parse_config(["--model", str(ckpt), "--out", str(tmp_path / name), *extra, "--batch-size",
                                      "2", "--gen-length", "32", "--block-length", "4", "--dtype", "float64",
                                      "--strategies", "fastdllm_dual_threshold"]), clock=FakeClock())
        got[name] = [tuple(r[k] for k in keys) for r in read_jsonl(tmp_path / name / "fastdllm_dual_threshold.jsonl")]
    assert [r[1] for r in got["held"]] == [3, 4, 5]
    assert got["held"] == got["all"][3:]
    with pytest.raises(ValueError, match="--skip"):
        gsm8k.parse_config(["--model", str(ckpt), "--skip", "-1"])
