"""experiments.perplexity end to end on a slice of lm1b-sample: tiny models, a few steps, L=16."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

import experiments.perplexity.jobs as jobs
from dlm.attention import causal_mask
from dlm.likelihood import mc_perplexity
from harness.results import config_hash, read_jsonl
from experiments.perplexity.__main__ import main, parse_config, run
from conftest import find_shared_data
from tiny import random_prompts, tiny_model

REPO = Path(__file__).resolve().parents[1]


#: the data mirror files the ladder reads (named datasets, looked up in ../shared/data or $DLM_SHARED_DATA)
DATA = ("lm1b-sample/1b_benchmark.dev.tokens", "lm1b-sample/1b_benchmark.test.tokens", "tokenizers/bert-base-uncased")


def _argv(tmp_path, *extra, models=("ar", "bd4", "mdlm")) -> list[str]:
    return ["--preset", "laptop", "--run", "t", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
            "--train", "lm1b-sample:dev", "--test", "lm1b-sample:test", "--tokenizer", "bert-base-uncased",
            "--models", *models, "--seq-len", "16", "--max-train-lines", "200", "--max-test-lines", "60",
            "--val-chunks", "4", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--mlp-hidden", "32",
            "--steps", "3", "--batch-size", "4", "--search-every", "2", "--eval-chunks", "8",
            "--eval-batch-size", "4", "--mc-chunks", "2", "--mc-num", "4", "--var-chunks", "8", "--threads", "1",
            *extra]


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    for f in DATA:  # skip (CI: fail) naming the missing file and where to put it
        find_shared_data(f)
    tmp = tmp_path_factory.mktemp("ppl")
    argv = _argv(tmp)
    run(parse_config(argv))
    return tmp, argv


def _records(tmp) -> list[dict]:
    return read_jsonl(tmp / "out" / "perplexity_t.jsonl")


def test_files_written(ladder, shared_data):
    tmp, _ = ladder
    out = tmp / "out"
    for ext in ("jsonl", "md", "csv", "png"):
        assert (out / f"perplexity_t.{ext}").stat().st_size > 0
    ids = {r["id"] for r in _records(tmp)}
    assert {"config", "train/ar", "train/bd4", "train/mdlm", "ppl/ar", "ppl/bd4", "ppl/mdlm", "mc/mdlm",
            "search/bd4", "var/bd4/U[0,1]", "var/bd4/U[.3,.8]", "var/bd4/U[.5,1]", "var/bd4/searched"} <= ids
    for r in _records(tmp):
        assert r["git_sha"] and r["config_hash"] and r["seed"] == 0
    for name, block in (("ar", 1), ("bd4", 4), ("mdlm", 16)):
        ckpt = out / "checkpoints" / f"perplexity-t-{name}"
        meta = json.loads((ckpt / "config.json").read_text())
        assert meta["torch_dtype"] == "bfloat16" and meta["extra"]["bd3lm"]["block_size"] == block
        assert meta["tie_embeddings"] and (ckpt / "model.safetensors").stat().st_size < 30522 * 16 * 2 + 60_000
    md = (out / "perplexity_t.md").read_text()
    assert "Table 3" in md and "Table 2" in md and "22.83" in md and "23.65" in md and "Bars" in md
    lines = (out / "perplexity_t.csv").read_text().splitlines()
    assert lines[0].startswith("table,model,block_size") and "git_sha" in lines[0] and len(lines) == 1 + 3 + 1 + 4


def test_ar_perplexity_is_exact_nll(ladder, shared_data):
    """ppl/ar = exp(exact NLL): each token scored from [x_<i, MASK] with causal attention."""
    tmp, argv = ladder
    cfg = parse_config(argv)
    rec = next(r for r in _records(tmp) if r["id"] == "ppl/ar")
    assert rec["exact"] and rec["ppl"] == pytest.approx(math.exp(rec["nelbo"]), rel=1e-12)
    bd3 = jobs.load_bd3("ar", jobs.Paths(cfg), cfg)
    model, mask_id = bd3.model, bd3.config.mask_token_id
    x = jobs.load_data(cfg).test[:cfg.eval.eval_chunks]  # (N, L)
    nats = 0.0
    with torch.no_grad():
        for i in range(x.shape[1]):
            inp = torch.cat([x[:, :i], torch.full_like(x[:, :1], mask_id)], dim=1)  # (N, i + 1)
            logits = model(inp, attn_mask=causal_mask(torch.arange(i + 1), i + 1))[:, -1].double()  # (N, V)
            logits[:, mask_id] = -math.inf
            nats -= float(torch.log_softmax(logits, -1).gather(1, x[:, i:i + 1]).sum())
    assert rec["tokens"] == x.numel()
    assert rec["nelbo"] == pytest.approx(nats / x.numel(), rel=1e-5)


def test_resume_skips_finished(ladder, monkeypatch, shared_data):
    tmp, argv = ladder
    before = (tmp / "out" / "perplexity_t.jsonl").read_text()

    def boom(*a, **k):
        raise AssertionError("finished work must not be redone")

    monkeypatch.setattr(jobs, "train", boom)
    monkeypatch.setattr(jobs, "mc_loglikelihood", boom)
    monkeypatch.setattr(jobs, "nelbo_variance", boom)
    run(parse_config(argv))
    assert (tmp / "out" / "perplexity_t.jsonl").read_text() == before
    with pytest.raises(ValueError, match=r"--run t: .*train\.lr 0\.002 -> 0\.01"):  # another config, same run:
        run(parse_config(argv + ["--lr", "0.01"]))  # the error says what differs


def test_eval_with_nothing_left_to_compute_needs_no_data(ladder, tmp_path, monkeypatch, shared_data):
    """Committed records of an unchanged config: eval only rebuilds the tables, without the data
    (a clone without ../shared); a missing record needs the data, and the error says where to put it."""
    src, _ = ladder
    shutil.copytree(src / "out", tmp_path / "out")
    jsonl, md = tmp_path / "out" / "perplexity_t.jsonl", tmp_path / "out" / "perplexity_t.md"
    before = jsonl.read_text()
    monkeypatch.setenv("DLM_SHARED_DATA", str(tmp_path / "no-mirror"))
    main(["eval", *_argv(tmp_path)])
    assert jsonl.read_text() == before and md.read_text() == (src / "out" / "perplexity_t.md").read_text()
    main(["train", *_argv(tmp_path)])  # every model trained and exported: nothing to do either
    assert jsonl.read_text() == before
    jsonl.write_text("".join(line for line in before.splitlines(keepends=True) if '"ppl/ar"' not in line))
    with pytest.raises(ValueError, match=r"lm1b-sample.*no-mirror.*DLM_SHARED_DATA"):
        main(["eval", *_argv(tmp_path)])
    shutil.rmtree(tmp_path / "out" / "checkpoints" / "perplexity-t-bd4")
    with pytest.raises(ValueError, match=r"bd4: recorded .* is missing"):
        main(["train", *_argv(tmp_path)])


@pytest.mark.parametrize("mirror", ["real", "symlink", "absent"])
def test_laptop_config_names_its_data_wherever_it_lives(mirror, tmp_path, monkeypatch):
    """The config and its hash hold the dataset's name and its files' fingerprints, never a path:
    the data mirror as a symlink, elsewhere ($DLM_SHARED_DATA) or absent changes nothing, and the
    committed laptop run is this config."""
    (tmp_path / "real").mkdir()
    root = tmp_path / {"real": "real", "symlink": "link", "absent": "none"}[mirror]
    if mirror == "symlink":
        root.symlink_to(tmp_path / "real", target_is_directory=True)
    monkeypatch.setenv("DLM_SHARED_DATA", str(root))
    ident = parse_config(["eval", "--preset", "laptop"]).identity()
    data = ident["data"]
    assert (data["train"], data["test"], data["tokenizer"]) == ("lm1b-sample:dev", "lm1b-sample:test",
                                                                  "bert-base-uncased")
    assert sorted(data["fingerprints"]) == ["test", "train"]
    assert "shared" not in json.dumps(ident) and "/" not in json.dumps(data)
    committed = next(r for r in read_jsonl(REPO / "results" / "perplexity_laptop.jsonl") if r["id"] == "config")
    assert committed["config"] == json.loads(json.dumps(ident)) and committed["config_hash"] == config_hash(ident)


def test_a_named_file_of_the_mirror_is_named_and_checked(tmp_path, monkeypatch):
    """A mirror file given as a path is recorded by its name; other local files by file name and
    fingerprint; a mirror file whose content is not the named one is refused when read."""
    mirror = tmp_path / "mirror"
    (mirror / "lm1b-sample").mkdir(parents=True)
    (mirror / "lm1b-sample" / "1b_benchmark.dev.tokens").write_text("not the lm1b sample\n")
    monkeypatch.setenv("DLM_SHARED_DATA", str(mirror))
    cfg = parse_config(["train", "--train", str(mirror / "lm1b-sample" / "1b_benchmark.dev.tokens")])
    assert cfg.data.train == "lm1b-sample:dev"
    with pytest.raises(ValueError, match=r"lm1b-sample:dev.*fingerprint"):
        jobs.load_data(cfg)
    own = tmp_path / "mine.txt"
    own.write_text("a b c\n")
    ident = parse_config(["train", "--train", str(own)]).identity()["data"]
    assert ident["train"] == "file:mine.txt" and ident["fingerprints"]["train"].startswith("sha256:")
    assert str(tmp_path) not in json.dumps(ident)


#: the laptop config as committed before datasets were named (the path beside the checkout)
LEGACY_DATA = {"style": "lm1b", "train": "../shared/data/lm1b-sample/1b_benchmark.dev.tokens",
               "test": "../shared/data/lm1b-sample/1b_benchmark.test.tokens", "tokenizer": "bert-base-uncased",
               "seq_len": 128, "train_split": "train", "test_split": "test", "hf_config": None,
               "max_train_lines": None, "max_test_lines": None, "val_chunks": 64}


def test_missing_data_skips_naming_it_and_fails_in_ci(tmp_path, monkeypatch):
    import conftest

    monkeypatch.setattr(conftest, "SHARED_DATA", tmp_path / "mirror")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"lm1b-sample/x\.tokens.*mirror.*DLM_SHARED_DATA"):
        find_shared_data("lm1b-sample/x.tokens")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"lm1b-sample/x\.tokens"):
        find_shared_data("lm1b-sample/x.tokens")


def test_report_from_jsonl_alone(ladder, tmp_path, capsys, shared_data):
    src, _ = ladder
    out = tmp_path / "out"
    out.mkdir()
    (out / "perplexity_t.jsonl").write_text((src / "out" / "perplexity_t.jsonl").read_text())
    main(["report", "--run", "t", "--out", str(out), "--train", "missing.tokens"])  # no data, no models
    assert (out / "perplexity_t.md").read_text() == (src / "out" / "perplexity_t.md").read_text()
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("perplexity_t.*")}
    main(["report", "--run", "t", "--out", str(out)])  # unchanged content: no file is rewritten
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("perplexity_t.*")} == stamps
    assert (out / "perplexity_t.csv").read_text() == (src / "out" / "perplexity_t.csv").read_text()
    assert (out / "perplexity_t.png").stat().st_size > 0 and "Table 3" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--run"):
        main(["report", "--run", "nothing", "--out", str(out)])


def test_finetune_from_mdlm_and_variance_finetune(tmp_path, shared_data):
    for f in DATA:
        shared_data(f)
    argv = _argv(tmp_path, "--finetune-from-mdlm", "--finetune-steps", "2", "--var-finetune-steps", "1",
                 "--search-every", "0", models=("bd4",))
    cfg = parse_config(argv)
    planned = [(j.name, j.steps, j.init) for j in jobs.plan_jobs(cfg)]
    assert planned[:2] == [("mdlm-base", 1, None), ("bd4", 2, "mdlm-base")] and len(planned) == 6
    run(cfg)
    recs = {r["id"]: r for r in _records(tmp_path)}
    assert recs["train/bd4"]["init"] == "mdlm-base" and "train/bd4@0.3-0.8" in recs and "train/bd4@searched" in recs
    var = recs["var/bd4/U[.3,.8]"]
    assert var["evaluated"] == "bd4@0.3-0.8" and var["trained_under"] == [0.3, 0.8]
    assert not (tmp_path / "work" / "mdlm-base" / "LOCK").exists()
    row = next(r for r in csv.DictReader(open(tmp_path / "out" / "perplexity_t.csv")) if r["table"] == "table3")
    assert row["model"] == "bd4" and row["steps"] == "3"  # 1 MDLM step + 2 fine-tuning steps


@pytest.mark.parametrize("extra, match", [
    (["--preset", "big"], "--preset"), (["--models", "gpt"], "--models"), (["--models", "bd5"], "--models"),
    (["--models", "ar", "ar"], "--models"), (["--var-models", "mdlm"], "--var-models"), (["--steps", "0"], "--steps"),
    (["--train", "nope/missing.tokens"], "--train"), (["--run", "a/b"], "--run"),
    (["--precision", "fp8"], "--precision"),
    (["--finetune-from-mdlm", "--finetune-steps", "3"], "--finetune-steps"), (["--mc-num", "12"], "--mc-num"),
    (["--d-model", "18"], "--d-model"), (["--warmup", "9"], "--warmup"), (["frobnicate"], "command")])
def test_bad_arguments(tmp_path, extra, match):
    with pytest.raises(ValueError, match=match):
        parse_config(_argv(tmp_path) + extra)
    assert not (tmp_path / "out").exists()  # refused before any compute or file


@pytest.mark.parametrize("preset, seq_len, tokenizer", [("lm1b", 128, "bert-base-uncased"), ("owt", 1024, "gpt2")])
def test_paper_presets_are_configs(preset, seq_len, tokenizer):
    cfg = parse_config(["train", "--preset", preset])  # HF datasets: nothing is loaded or checked locally
    assert (cfg.data.seq_len, cfg.data.tokenizer, cfg.train.batch_size, cfg.train.steps) == (
        seq_len, tokenizer, 512, 1_000_000)
    assert cfg.train.precision == "bf16" and cfg.arch.d_model == 768 and cfg.var_models == ("bd4", "bd16")


def test_mc_perplexity_exact_for_one_token():
    model = tiny_model()
    x = random_prompts(3, 1, model.config, seed=2)  # (3, 1): one masked token, the ELBO is exact
    res = mc_perplexity(model, [x], mc_num=2, batch_size=2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.full_like(x, model.config.mask_token_id))[:, 0], -1)
    assert res["tokens"] == 3 and res["nelbo"] == pytest.approx(-float(logp.gather(1, x).mean()), rel=1e-9)