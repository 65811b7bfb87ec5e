"""GSM8K harness (experiments.eval.gsm8k / strategies / report) on a tiny random checkpoint.

Timing is made reproducible with a fake clock (each sampler call takes exactly ``step`` seconds),
so a resumed run must give byte-identical JSONL and tables to an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlm import save_model
from experiments.eval import gsm8k
from harness import report
from harness.results import encode_question, merge_logs, read_jsonl
from dlm.spec import Sampler
from tiny import tokenizer_model

REPO = Path(__file__).resolve().parents[1]
TWO = ["baseline_semiar", "fastdllm_dual_threshold"]


class Killed(RuntimeError):
    pass


class FakeClock:
    """Read k returns ``k * step``: every sampler call (two consecutive reads) lasts ``step``
    seconds; read number ``kill_at`` raises instead (a kill before that call)."""

    def __init__(self, step: float = 1.0, kill_at: int | None = None) -> None:
        self.step, self.calls, self.kill_at = step, 0, kill_at

    def __call__(self) -> float:
        self.calls += 1
        if self.kill_at is not None and self.calls >= self.kill_at:
            raise Killed("simulated kill")
        return self.calls * self.step


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from tasks.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model = tokenizer_model(tok)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] *= 4  # some rows stop early
    return save_model(model, tok, tmp_path_factory.mktemp("ckpt") / "tiny")


def argv(ckpt, out, *extra) -> list[str]:
    return ["--model", str(ckpt), "--out", str(out), "--limit", "4", "--batch-size", "2", "--gen-length", "16",
            "--block-length", "8", "--dtype", "float64", "--strategies", *TWO, *extra]


def run(ckpt, out, *extra, clock=None):
    return gsm8k.run(gsm8k.parse_config(argv(ckpt, out, *extra)), clock=clock or FakeClock())


def test_bad_args_raise_value_error_naming_the_flag(ckpt, tmp_path):
    base = ["--model", str(ckpt), "--out", str(tmp_path / "o"), "--limit", "4"]
    cases = [(["--limit", "0"], "--limit"), (["--batch-size", "0"], "--batch-size"),
             (["--num-fewshot", "-1"], "--num-fewshot"), (["--strategies", "nope"], "strategies"),
             (["--baseline", "nope"], "--baseline"), (["--data", str(tmp_path / "missing.jsonl")], "--data"),
             (["--gen-length", "30", "--block-length", "8"], "--gen-length 30 must be divisible by --block-length 8"),
             (["--threshold", "1.5"], "--threshold"), (["--factor", "0"], "--factor"),
             (["--gen-length", "0"], "--gen-length must be >= 1"),
             (["--bd3-model", str(tmp_path / "none")], "--bd3-model"), (["--threads", "0"], "--threads")]
    for extra, name in cases:
        with pytest.raises(ValueError, match=name):
            gsm8k.parse_config(base + extra)
    with pytest.raises(ValueError, match="policy"):
        Sampler.of("x", policy="nope")
    with pytest.raises(ValueError, match="block size"):
        Sampler.of("x", policy="exact", block_length=None)
    # prompt + gen length too long for the model: refused before any sampler call or file
    clock = FakeClock()
    with pytest.raises(ValueError, match="--gen-length"):
        gsm8k.run(gsm8k.parse_config(base + ["--gen-length", "96", "--block-length", "32",
                                             "--strategies", "baseline_semiar"]), clock=clock)
    assert clock.calls == 0 and not list((tmp_path / "o").glob("*.jsonl"))
    text = gsm8k.build_parser().format_help()
    for flag in ("--model", "--data", "--num-fewshot", "--limit", "--batch-size", "--seed", "--no-chat-template",
                 "--strategies", "--bd3-model", "--gen-length", "--block-length", "--steps", "--threshold",
                 "--factor", "--out", "--baseline", "--device", "--dtype"):
        assert flag in text


def test_resume_after_kill_matches_uninterrupted_run(ckpt, tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run(ckpt, full)
    with pytest.raises(Killed):  # dies at the start of the 2nd batch of the 2nd strategy
        run(ckpt, resumed, clock=FakeClock(kill_at=7))
    part = resumed / "fastdllm_dual_threshold.jsonl"
    assert len(read_jsonl(part)) == 2
    ref = (full / "fastdllm_dual_threshold.jsonl").read_text().splitlines(keepends=True)
    part.write_text("".join(ref[:3]) + ref[3][:25])  # the 3rd record landed, the 4th was cut short
    run(ckpt, resumed)
    for name in TWO + ["table.md", "table.csv", "ablation.md"]:
        suffix = "" if "." in name else ".jsonl"
        assert (resumed / f"{name}{suffix}").read_text() == (full / f"{name}{suffix}").read_text(), name
    rec = read_jsonl(full / "baseline_semiar.jsonl")[0]
    for key in ("id", "strategy", "config_hash", "prompt_length", "prediction", "extracted", "target", "correct",
                "nfe", "positions_computed", "tokens_until_eos", "seconds", "seed"):
        assert key in rec


def test_sorted_harness_batches_decode_the_same_tokens(ckpt, tmp_path):
    runs = {}
    for name, extra in (("plain", ()), ("sorted", ("--sort-prompts",))):
        out = tmp_path / name
        gsm8k.run(gsm8k.parse_config(argv(ckpt, out, "--strategies", "baseline_semiar", "--batch-size", "3", *extra)),
                  clock=FakeClock())
        runs[name] = {r["id"]: r for r in read_jsonl(out / "baseline_semiar.jsonl")}
    plain, sorted_ = runs["plain"], runs["sorted"]
    assert plain.keys() == sorted_.keys()
    assert all(plain[i]["prediction"] == sorted_[i]["prediction"] for i in plain)  # greedy: batch-independent
    assert {r["config_hash"] for r in plain.values()} != {r["config_hash"] for r in sorted_.values()}
    for recs in runs.values():
        assert all(r["batch_width"] >= r["prompt_length"] for r in recs.values())

    def waste(recs):
        return 1 - sum(r["prompt_length"] for r in recs.values()) / sum(r["batch_width"] for r in recs.values())

    assert waste(sorted_) <= waste(plain)


def test_rerun_skips_done_ids_and_merge_dedups(ckpt, tmp_path):
    out = tmp_path / "o"
    run(ckpt, out)
    before = {p.name: p.read_text() for p in out.glob("*.jsonl")}
    clock = FakeClock()
    run(ckpt, out, clock=clock)
    assert clock.calls == 0  # nothing recomputed
    assert {p.name: p.read_text() for p in out.glob("*.jsonl")} == before
    # a different config for the same strategy and --out is refused
    with pytest.raises(ValueError, match="--out"):
        run(ckpt, out, "--threshold", "0.5")
    # per-rank merge: dedup by id (first seen wins), sorted by index, idempotent
    recs = read_jsonl(out / "baseline_semiar.jsonl")
    main, r0, r1 = out / "m.jsonl", out / "m.rank0.jsonl", out / "m.rank1.jsonl"
    r0.write_text("".join(json.dumps(r) + "\n" for r in recs[0::2]))
    r1.write_text("".join(json.dumps(r) + "\n" for r in [recs[1], recs[3], recs[1]]))
    main.write_text(json.dumps(recs[0]) + "\n")
    with pytest.raises(ValueError, match="repeated"):  # one file holding an id twice is refused
        merge_logs(main, [r0, r1])
    r1.write_text("".join(json.dumps(r) + "\n" for r in [recs[1], recs[3]]))
    assert merge_logs(main, [r0, r1]) == 4
    first = main.read_text()
    assert merge_logs(main, [r0, r1]) == 4 and main.read_text() == first
    assert [r["id"] for r in read_jsonl(main)] == [r["id"] for r in recs]


def test_retrained_checkpoint_at_the_same_path_is_not_resumed(ckpt, tmp_path):
    """The config names the model by path; the weights fingerprint in every record stops a rerun
    after the checkpoint was replaced from silently keeping the old model's samples."""
    from dlm.checkpoints import load_model, save_model as save

    model_dir = tmp_path / "m"
    shutil.copytree(ckpt, model_dir)
    out = tmp_path / "o"
    run(model_dir, out, "--limit", "2")
    rec = read_jsonl(out / "baseline_semiar.jsonl")[0]
    assert rec["model_weights"] and json.loads((out / "config.json").read_text())[
        "strategies"]["baseline_semiar"]["model_weights"] == rec["model_weights"]
    model, tok = load_model(model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.01)  # "retrained"
    save(model, tok, model_dir)
    with pytest.raises(ValueError, match="checkpoint changed"):
        run(model_dir, out, "--limit", "2")


def test_throughput_definition(ckpt, tmp_path):
    out = tmp_path / "o"
    run(ckpt, out, clock=FakeClock(step=3.0))
    rows = {r.strategy: r for r in report.build_report(out, plot=False).rows}
    for name in TWO:
        recs = read_jsonl(out / f"{name}.jsonl")
        assert all(r["seconds"] == 1.5 for r in recs)  # 3 s per batch of 2 rows
        for r in recs:  # tokens up to and including the first EOS (the decoded text stops before it)
            assert 1 <= r["tokens_until_eos"] <= 16
        expect = sum(r["tokens_until_eos"] for r in recs) / sum(r["seconds"] for r in recs)
        assert rows[name].tokens_per_second == pytest.approx(expect)
        assert rows[name].nfe_per_token == pytest.approx(sum(r["nfe"] for r in recs)
                                                         / sum(r["tokens_until_eos"] for r in recs))
    synthetic = [{"tokens_until_eos": 10, "seconds": 2.0}, {"tokens_until_eos": 30, "seconds": 2.0}]
    assert report.throughput(synthetic) == 10.0
    base = rows["baseline_semiar"]
    assert base.speedup == 1.0
    assert rows["fastdllm_dual_threshold"].speedup == pytest.approx(
        rows["fastdllm_dual_threshold"].tokens_per_second / base.tokens_per_second)


def test_bootstrap_ci_is_deterministic():
    x = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1]
    a, b = report.bootstrap_ci(x, 1000, seed=0), report.bootstrap_ci(x, 1000, seed=0)
    assert a == b and a[0] <= 0.7 <= a[1]
    assert report.bootstrap_ci([1, 1, 1]) == (1.0, 1.0)
    y = [math.sin(i) for i in range(50)]
    assert report.bootstrap_ci(y, 1000, seed=1) == report.bootstrap_ci(y, 1000, seed=1)
    assert report.bootstrap_ci(y, 1000, seed=1) != report.bootstrap_ci(y, 1000, seed=2)
    with pytest.raises(ValueError, match="values"):
        report.bootstrap_ci([])


def test_report_rebuilds_from_jsonl_and_config_only(ckpt, tmp_path, monkeypatch):
    out, copy = tmp_path / "o", tmp_path / "copy"
    run(ckpt, out)
    copy.mkdir()
    for p in [*out.glob("*.jsonl"), out / "config.json"]:  # config.json: the task, for chain-step accuracy
        shutil.copy(p, copy / p.name)
    import dlm.checkpoints

    monkeypatch.setattr(dlm.checkpoints, "load_model", lambda *a, **k: pytest.fail("report loaded a model"))
    report.main(["--out", str(copy)])
    assert (copy / "table.csv").read_text() == (out / "table.csv").read_text()
    assert (copy / "ablation.csv").read_text() == (out / "ablation.csv").read_text()
    assert (copy / "pareto.png").stat().st_size > 1000
    md = (copy / "table.md").read_text()
    assert "speed-up" in md and "baseline_semiar" in md and "git " in md
    meta = json.loads((out / "table.json").read_text())["meta"]
    assert meta["run_git_shas"] and set(meta["run_config"]) == set(TWO)
    with pytest.raises(ValueError, match="--out"):
        report.build_report(tmp_path / "nothing")


def test_pareto_front_and_factorial_main_effects():
    assert report.pareto_front([(1.0, 0.5), (2.0, 0.4), (0.5, 0.6), (1.5, 0.3), (2.0, 0.2)]) == [2, 0, 1]
    # balanced 2 x 2 design with log speed-ups 0.5 (cache) and 1.0 (threshold), no interaction
    rows = []
    for cache in ("none", "dual"):
        for par in ("none", "threshold"):
            tps = 10 * math.exp(0.5 * (cache == "dual") + 1.0 * (par == "threshold"))
            f = {"kind": "fastdllm", "cache": cache, "parallel": par, "stop_at_eos": False, "block_length": 32}
            rows.append(report.Row(f"{cache}_{par}", 10, 0.5, 0.4, 0.6, tps, 1.0, 8, 1, 1, 10, 1, f, "h", "g"))
    effects, info = report.factorial_effects(rows, baseline="none_none")
    got = {(e.factor, e.level): e for e in effects}
    assert got[("cache", "dual")].log_speedup == pytest.approx(0.5)
    assert got[("parallel", "threshold")].speedup == pytest.approx(math.exp(1.0))
    assert info["r2"] == pytest.approx(1.0) and info["factors"] == ["cache", "parallel"]


def test_chat_template_prompt_equals_plain_format(ckpt):
    from dlm.checkpoints import load_tokenizer
    from tasks import ArithConfig, fewshot_examples, generate_problems

    tok = load_tokenizer(ckpt)
    assert tok.chat_template
    shots = fewshot_examples(ArithConfig(), 2, seed=1)
    q = generate_problems(ArithConfig(), 1, split="test")[0].question
    assert encode_question(tok, q, shots, True) == encode_question(tok, q, shots, False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_run_merges_into_single_process_result(ckpt, tmp_path):
    out, ref = tmp_path / "dist", tmp_path / "ref"
    args = ["--model", str(ckpt), "--limit", "5", "--batch-size", "2", "--gen-length", "16", "--block-length", "8",
            "--dtype", "float64", "--strategies", "fastdllm_dual", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(_free_port()), "-m", "experiments.eval.gsm8k", *args, "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    gsm8k.run(gsm8k.parse_config(args + ["--out", str(ref)]), clock=FakeClock())
    merged = read_jsonl(out / "fastdllm_dual.jsonl")
    assert [r["index"] for r in merged] == [0, 1, 2, 3, 4]
    assert {r["index"] % 2 for r in read_jsonl(out / "fastdllm_dual.rank1.jsonl")} == {1}
    keys = ("id", "prediction", "correct", "tokens_until_eos", "config_hash", "prompt_length")
    single = read_jsonl(ref / "fastdllm_dual.jsonl")
    assert [[r[k] for k in keys] for r in merged] == [[r[k] for k in keys] for r in single]
    assert (out / "table.md").is_file()
    text = (out / "fastdllm_dual.jsonl").read_text()
    merge_logs(out / "fastdllm_dual.jsonl", sorted(out.glob("fastdllm_dual.rank*.jsonl")))
    assert (out / "fastdllm_dual.jsonl").read_text() == text


def test_local_gsm8k_jsonl_fewshot_and_bd3lm(ckpt, tmp_path, capsys):
    from bd3lm import BD3Config, save_bd3
    from dlm.checkpoints import load_model
    from tasks import generate_problems

    for split in ("test", "train"):  # GSM8K-format file with train.jsonl beside it for the shots
        rows = [{"question": p.question, "answer": p.answer} for p in generate_problems(n=3, split=split)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model, tok = load_model(ckpt)
    bd3 = save_bd3(model, tok, tmp_path / "bd3", BD3Config(block_size=4, align="prompt"))
    base = ["--model", str(ckpt), "--data", str(tmp_path / "test.jsonl"), "--num-fewshot", "1", "--limit", "3",
            "--batch-size", "2", "--gen-length", "8", "--block-length", "4", "--strategies", "baseline_semiar", "bd3lm"]
    names = gsm8k.run(gsm8k.parse_config(base + ["--out", str(tmp_path / "a")]), clock=FakeClock())
    assert names == ["baseline_semiar"] and "bd3lm: skipped" in capsys.readouterr().err
    recs = read_jsonl(tmp_path / "a" / "baseline_semiar.jsonl")
    assert [r["id"] for r in recs] == ["gsm8k-test-0", "gsm8k-test-1", "gsm8k-test-2"]
    assert min(r["prompt_length"] for r in recs) > 30  # one worked example before the question
    out = tmp_path / "b"
    gsm8k.run(gsm8k.parse_config(base + ["--out", str(out), "--bd3-model", str(bd3)]), clock=FakeClock())
    b = read_jsonl(out / "bd3lm.jsonl")
    assert len(b) == 3 and b[0]["factors"]["kind"] == "bd3lm" and b[0]["factors"]["block_length"] == 4
    assert "bd3lm" in (out / "table.md").read_text()
    # past the BD3 model's context: refused, unless --bd3-context raises it (recorded in the config)
    limit = model.config.max_seq_len
    long = [a if a != "8" else str(limit) for a in base]  # --gen-length = the whole context
    with pytest.raises(ValueError, match="max_seq_len"):
        gsm8k.run(gsm8k.parse_config(long + ["--out", str(tmp_path / "d"), "--bd3-model", str(bd3),
                                             "--strategies", "bd3lm"]), clock=FakeClock())
    for bad in (["--bd3-context", "64"], ["--bd3-model", str(bd3), "--bd3-context", "0"]):
        with pytest.raises(ValueError, match="--bd3-context"):
            gsm8k.parse_config(base + bad)
    wide = tmp_path / "e"
    gsm8k.run(gsm8k.parse_config(long + ["--out", str(wide), "--bd3-model", str(bd3), "--bd3-context",
                                         str(2 * limit), "--strategies", "bd3lm"]), clock=FakeClock())
    w = read_jsonl(wide / "bd3lm.jsonl")
    config = json.loads((wide / "config.json").read_text())["strategies"]["bd3lm"]["config"]
    assert len(w) == 3 and config["bd3_context"] == 2 * limit and w[0]["config_hash"] != b[0]["config_hash"]
    (tmp_path / "train.jsonl").unlink()
    with pytest.raises(ValueError, match="--num-fewshot"):
        gsm8k.run(gsm8k.parse_config(base + ["--out", str(tmp_path / "c")]))



def test_dream_checkpoint_runs_the_dream_rules_unless_told(tmp_path):
    """A Dream-layout checkpoint (shifted logits, q/k/v bias) gets Fast-dLLM's Dream rules in every
    row by default, recorded in the config; ``--family llada`` runs and records the LLaDA rules."""
    from dlm import load_model
    from tasks.tokenizer import build_tokenizer

    tok = build_tokenizer()
    ckpt = save_model(tokenizer_model(tok, shift_logits=True, qkv_bias=True), tok, tmp_path / "dream", layout="dream")
    model, _ = load_model(ckpt, dtype=torch.float64)
    assert model.config.shift_logits and model.config.layout == "dream"
    hashes = {}
    for family in ("auto", "llada"):
        run(ckpt, tmp_path / family, "--family", family)
        meta = json.loads((tmp_path / family / "config.json").read_text())["strategies"]
        for name in TWO:  # the family that ran is recorded in every config
            assert meta[name]["config"]["family"] == ("dream" if family == "auto" else "llada"), (family, name)
        hashes[family] = meta["fastdllm_dual_threshold"]["config_hash"]
        assert len(read_jsonl(tmp_path / family / "fastdllm_dual_threshold.jsonl")) == 4
    assert hashes["auto"] != hashes["llada"]
