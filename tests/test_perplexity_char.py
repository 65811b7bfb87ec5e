"""The char preset of experiments.perplexity: tinyshakespeare splits cut in code, the char
tokenizer, seeds as separate runs, the across-seed statistics and the MC-ELBO interval."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest
import torch

import experiments.perplexity.jobs as jobs
from bd3lm.data import CharTokenizer, build_dataset, char_span, load_tokenizer, special_ids
from harness.results import read_jsonl
from experiments.perplexity.__main__ import parse_config, run
from experiments.perplexity.config import DATASETS, locate
from experiments.perplexity.report import bars, paper_gap_shares
from experiments.perplexity.seeds import paired_ci, render, seed_configs, seeds_for_power, summarize, t_cdf, t_quantile, welch

SHA = DATASETS["tinyshakespeare"]["all"][1]


# ------------------------------------------------------------------------------------ tokenizer
def test_char_tokenizer_round_trip_and_special_ids():
    tok = load_tokenizer("char")
    assert isinstance(tok, CharTokenizer) and len(tok) == 101
    ids = special_ids(tok)
    assert (ids.pad, ids.bos, ids.eos, ids.mask, ids.vocab_size) == (0, 1, 2, 3, 101)
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\t~{}|"
    enc = tok([text])["input_ids"][0]
    assert enc.count(tok.unk_token_id) == 1 and tok.decode(enc) == text.replace("\t", "[UNK]")
    assert tok.decode(enc, skip_special_tokens=True) == text.replace("\t", "")
    assert tok(text, add_special_tokens=True)["input_ids"][:1] == [ids.bos]
    assert CharTokenizer().vocab == tok.vocab  # built in code, the same every time
    with pytest.raises(ValueError, match="ids"):
        tok.decode([101])


def test_char_style_chunks_raw_text_without_specials():
    chunks, ids = build_dataset(["ab\n\ncd", "ef"], "char", "char", seq_len=4)
    assert chunks.shape == (2, 4) and ids.vocab_size == 101  # "ab\n\ncd\nef" = 9 chars: tail dropped
    assert CharTokenizer().decode(chunks.flatten()) == "ab\n\ncd\ne"
    with pytest.raises(ValueError, match="span"):
        build_dataset(["ab"], "lm1b", CharTokenizer(), seq_len=4, span=(0, 0.5))


# --------------------------------------------------------------------------------------- splits
def test_char_span_disjoint_and_covering():
    text = "".join(random.Random(0).choice("abc\n") for _ in range(1001))
    train, test = char_span(text, (0.0, 0.9)), char_span(text, (0.9, 1.0))
    assert train + test == text and len(train) == round(0.9 * len(text))
    assert char_span(text, (0.0, 0.9)) == train  # deterministic
    for bad in [(0.9, 0.1), (0, 1.5), (0.5,), "x"]:
        with pytest.raises(ValueError, match="span"):
            char_span(text, bad)


def test_tinyshakespeare_splits_from_the_mirror(shared_data):
    path = shared_data("tinyshakespeare/input.txt")
    cfg = parse_config(["train", "--preset", "char"])
    ident = cfg.identity()["data"]
    assert (ident["train"], ident["test"], ident["tokenizer"], ident["style"]) == (
        "tinyshakespeare:train", "tinyshakespeare:test", "char", "char")
    assert ident["spans"] == (("train", 0.0, 0.9), ("test", 0.9, 1.0))  # the cut is part of the hash
    assert ident["fingerprints"] == {"train": f"sha256:{SHA}", "test": f"sha256:{SHA}"}
    assert "spans" not in parse_config(["train", "--preset", "laptop"]).identity()["data"]  # old hashes kept
    text = path.read_text(encoding="utf-8")
    tok = CharTokenizer()
    data = jobs.load_data(cfg)
    L, cut = cfg.data.seq_len, round(0.9 * len(text))
    train = torch.cat([data.train, data.val]).flatten()
    assert tok.decode(train) == text[:len(train)] and tok.decode(data.test.flatten()) == text[cut:cut + data.test.numel()]
    assert data.test.shape[0] == (len(text) - cut) // L and train.numel() <= cut  # disjoint: test starts at the cut
    assert torch.equal(jobs.load_data(cfg).test, data.test)  # deterministic


def test_split_fingerprint_checked_and_style_enforced(tmp_path, monkeypatch):
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("not shakespeare\n")
    monkeypatch.setenv("DLM_SHARED_DATA", str(tmp_path))
    cfg = parse_config(["train", "--preset", "char"])
    with pytest.raises(ValueError, match=r"--train: tinyshakespeare:train .*fingerprint"):
        locate("train", cfg.data)
    with pytest.raises(ValueError, match="--train: tinyshakespeare:train"):
        parse_config(["train", "--preset", "laptop", "--train", "tinyshakespeare:train"])


# ---------------------------------------------------------------------------------------- seeds
def _argv(tmp_path, *extra):
    return ["--preset", "char", "--run", "t", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
            "--models", "ar", "bd4", "mdlm", "--seq-len", "16", "--max-train-lines", "120", "--max-test-lines", "40",
            "--val-chunks", "4", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--mlp-hidden", "32",
            "--steps", "2", "--batch-size", "4", "--search-every", "1", "--eval-chunks", "8", "--eval-batch-size", "4",
            "--mc-chunks", "4", "--mc-num", "4", "--var-chunks", "8", "--threads", "1", *extra]


def test_seeds_are_separate_runs(tmp_path, shared_data):
    shared_data("tinyshakespeare/input.txt")
    cfg = parse_config(_argv(tmp_path, "--seeds", "0", "1"))
    assert cfg.seeds == (0, 1)
    md = run(cfg)
    out = tmp_path / "out"
    assert md == out / "perplexity_t_seeds.md"
    recs = {s: {r["id"]: r for r in read_jsonl(out / f"perplexity_t-s{s}.jsonl")} for s in (0, 1)}
    for s in (0, 1):
        assert {r["seed"] for r in recs[s].values()} == {s} and (tmp_path / "work" / f"s{s}" / "ar").is_dir()
        assert (out / "checkpoints" / f"perplexity-t-s{s}-bd4" / "model.safetensors").is_file()
    assert recs[0]["config"]["config_hash"] != recs[1]["config"]["config_hash"]
    assert recs[0]["ppl/ar"]["nelbo"] != recs[1]["ppl/ar"]["nelbo"]  # other init and batches
    bd4 = recs[0]["ppl/bd4"]  # the preset averages 16 passes; the exact AR NLL needs one
    assert bd4["passes"] == 16 and bd4["nelbo"] == pytest.approx(statistics.fmean(bd4["pass_nelbo"]), rel=1e-12)
    assert bd4["nelbo_sem"] == pytest.approx(statistics.stdev(bd4["pass_nelbo"]) / 4, rel=1e-9)
    assert "passes" not in recs[0]["ppl/ar"] and recs[0]["config"]["config"]["eval"]["passes"] == 16
    mc = recs[0]["mc/mdlm"]
    assert len(mc["chunk_mc_nats"]) == len(mc["chunk_nelbo_nats"]) == 4 and mc["nelbo_reps"] == 4
    assert mc["nelbo"] == pytest.approx(sum(mc["chunk_mc_nats"]) / mc["tokens"])
    text = md.read_text()
    assert "[0, 1] of [0, 1]" in text and "one-sided Welch test" in text and "95% t interval" in text and "Clipping" in text
    assert "| eval s.e. |" in text and "| ar | 1 | 2 |" in text and "| exact |" in text
    # one pass of chunk_nelbo is bd3.perplexity's estimate on the same chunks and noise
    one = seed_configs(cfg)[0]
    bd3 = jobs.load_bd3("mdlm", jobs.Paths(one), one)
    sub = jobs._batches(jobs.load_data(one).test, one, 4)
    nats = jobs.chunk_nelbo(bd3, sub, 1, jobs._gen(one))
    assert sum(nats) / (4 * 16) == pytest.approx(bd3.perplexity(sub, jobs._gen(one)).nelbo, rel=1e-6)  # fp32 sums
    before = (out / "perplexity_t-s1.jsonl").read_text()
    run(parse_config(["report", *_argv(tmp_path, "--seeds", "0", "1", "2")]))  # seed 2 not run: skipped
    assert (out / "perplexity_t-s1.jsonl").read_text() == before
    assert "[0, 1] of [0, 1, 2]" in (out / "perplexity_t_seeds.md").read_text()


@pytest.mark.parametrize("extra, match", [(["--seeds", "0", "0"], "--seeds"), (["--seeds", "0", "--seed", "1"], "--seeds"),
                                          (["--seeds", "-1"], "--seeds"), (["--eval-passes", "0"], "--eval-passes")])
def test_bad_seeds(tmp_path, extra, match):
    with pytest.raises(ValueError, match=match):
        parse_config(_argv(tmp_path, *extra))


def test_single_seed_keeps_the_run_name(tmp_path):
    cfg = parse_config(_argv(tmp_path, "--seed", "3"))
    assert cfg.seeds == () and cfg.train.seed == 3 and cfg.run == "t"


def test_eval_passes_enter_the_identity_only_when_set(tmp_path):
    assert parse_config(_argv(tmp_path)).identity()["eval"]["passes"] == 16  # the char preset's
    assert parse_config(_argv(tmp_path, "--eval-passes", "4")).identity()["eval"]["passes"] == 4
    assert "passes" not in parse_config(["eval", "--preset", "laptop"]).identity()["eval"]  # hash unchanged


# ----------------------------------------------------------------------------------- statistics
def _fake(per_model: dict) -> dict:
    """{seed: {id: record}} of ppl records with the given NELBOs per model and seed."""
    blocks = {"ar": 1, "bd4": 4, "bd8": 8, "bd16": 16, "mdlm": 64}
    out: dict = {}
    for name, values in per_model.items():
        for s, v in enumerate(values):
            out.setdefault(s, {})[f"ppl/{name}"] = {"kind": "ppl", "model": name, "block_size": blocks[name],
                                                    "ppl": math.exp(v), "nelbo": v, "tokens": 10,
                                                    "exact": name == "ar"}
    return out


def test_summary_against_brute_force():
    rng = random.Random(1)
    means = {"ar": 1.6, "bd4": 1.9, "bd8": 1.902, "bd16": 2.3, "mdlm": 2.301}
    vals = {m: [mu + rng.gauss(0, 0.01) for _ in range(3)] for m, mu in means.items()}
    summ = summarize(_fake(vals), 64)
    for m in summ["models"]:
        x = vals[m["model"]]
        mu = sum(x) / 3
        sd = math.sqrt(sum((v - mu) ** 2 for v in x) / 2)
        assert (statistics.fmean(m["nelbo"]), statistics.stdev(m["nelbo"])) == pytest.approx((mu, sd))
    names = ["ar", "bd4", "bd8", "bd16", "mdlm"]
    assert [(p["a"], p["b"]) for p in summ["pairs"]] == list(zip(names, names[1:]))
    for p in summ["pairs"]:
        a, b = vals[p["a"]], vals[p["b"]]
        sa, sb = (math.sqrt(sum((v - sum(x) / 3) ** 2 for v in x) / 2) for x in (a, b))
        t = (sum(b) / 3 - sum(a) / 3) / math.sqrt(sa * sa / 3 + sb * sb / 3)
        df = (sa * sa / 3 + sb * sb / 3) ** 2 / ((sa * sa / 3) ** 2 / 2 + (sb * sb / 3) ** 2 / 2)
        assert (p["welch"]["t"], p["welch"]["df"]) == pytest.approx((t, df))
        assert p["separated"] == (p["welch"]["p"] < 0.05)
        assert p["ordered"] == (sum(a) < sum(b))
    assert [p["separated"] for p in summ["pairs"]] == [True, False, True, False]  # 0.002 / 0.001 apart: not
    m = {k: sum(v) / 3 for k, v in vals.items()}
    assert summ["gap"]["nelbo"]["of_means"] == pytest.approx((m["mdlm"] - m["bd4"]) / (m["mdlm"] - m["ar"]))
    assert summ["gap"]["nelbo"]["per_seed"][2] == pytest.approx(
        (vals["mdlm"][2] - vals["bd4"][2]) / (vals["mdlm"][2] - vals["ar"][2]))
    p = {k: sum(math.exp(x) for x in v) / 3 for k, v in vals.items()}  # the PPL share: of the mean PPLs
    assert summ["gap"]["ppl"]["of_means"] == pytest.approx((p["mdlm"] - p["bd4"]) / (p["mdlm"] - p["ar"]))
    e = {k: math.exp(v[1]) for k, v in vals.items()}
    assert summ["gap"]["ppl"]["per_seed"][1] == pytest.approx((e["mdlm"] - e["bd4"]) / (e["mdlm"] - e["ar"]))
    assert summ["gap"]["ppl"]["of_means"] > summ["gap"]["nelbo"]["of_means"]  # exp stretches the upper rungs
    one = summarize(_fake({"ar": [1.0], "mdlm": [2.0]}), 64)
    assert one["pairs"][0]["ordered"] and not one["pairs"][0]["separated"]  # one seed: never separated


def test_paper_gap_shares_from_its_table():
    """The paper's share on each scale, by hand from LM1B Table 3 (AR 22.83, L'4 28.23, MDLM 31.78)."""
    got = paper_gap_shares()
    assert got["ppl"] == pytest.approx((31.78 - 28.23) / (31.78 - 22.83))  # 0.397: the "40%"
    assert got["nelbo"] == pytest.approx(math.log(31.78 / 28.23) / math.log(31.78 / 22.83))  # 0.358
    assert round(got["ppl"], 3) == 0.397 and round(got["nelbo"], 3) == 0.358


def test_gap_bar_is_on_the_ppl_next_to_the_papers_share():
    """The per-run bar: our PPL share against 40%, labelled with the paper's share of the same style
    (OWT: (22.98 - 20.73) / (22.98 - 17.54) = 41.4%; char has no paper row, so LM1B's 39.7%)."""
    t3 = [{"model": m, "ppl": p} for m, p in (("ar", 5.0), ("bd4", 8.0), ("mdlm", 10.0))]  # share 2/5
    for style, label in (("char", "paper LM1B 39.7%"), ("lm1b", "paper LM1B 39.7%"), ("owt", "paper OWT 41.4%")):
        order, (bar, measured, ok) = bars(t3, [], style)
        assert order[2]  # ar < bd4 < mdlm
        assert label in bar and "PPL gap" in bar and measured == "40.0%" and ok
    t3[1]["ppl"] = 8.1  # share 0.38: below the bar
    assert not bars(t3, [], "char")[1][2]


def test_paired_by_seed_takes_out_the_shared_seed_noise():
    """Seeds that move every model together: the unpaired rule cannot separate 0.01 nats under a
    0.05 seed spread, the paired interval (t, 2 df: 4.303 * sd / sqrt 3) can; brute force."""
    shared = [0.0, 0.05, -0.05]
    step = {"ar": 1.60, "bd4": 1.90, "bd8": 1.91, "bd16": 1.92, "mdlm": 1.93}
    jitter = {"ar": [0, 0, 0], "bd4": [0.001, -0.001, 0.0], "bd8": [0.0, 0.001, -0.0005],
              "bd16": [0.0005, 0.0, 0.001], "mdlm": [-0.015, 0.02, 0.0]}
    vals = {m: [mu + o + j for o, j in zip(shared, jitter[m])] for m, mu in step.items()}
    summ = summarize(_fake(vals), 64)
    for p in summ["pairs"]:
        d = [b - a for a, b in zip(vals[p["a"]], vals[p["b"]])]
        mu = sum(d) / 3
        sd = math.sqrt(sum((x - mu) ** 2 for x in d) / 2)
        assert p["seed_diffs"] == pytest.approx(d)
        c = p["paired"]
        assert (c["mean"], c["sd"]) == pytest.approx((mu, sd))
        assert (c["lo"], c["hi"]) == pytest.approx((mu - 4.302653 * sd / math.sqrt(3), mu + 4.302653 * sd / math.sqrt(3)),
                                                   rel=1e-5)
    assert [p["separated"] for p in summ["pairs"]] == [True, False, False, False]  # the shared 0.05 spread
    assert [p["paired"]["lo"] > 0 for p in summ["pairs"]] == [True, True, True, False]  # mdlm's own noise: not
    text = render({"config": {"preset": "char", "eval": {"seed": 1}, "data": {"seq_len": 64, "train": "t", "test": "u",
                                                                            "tokenizer": "char"}}, "run": "x-s0"},
                  [0, 1, 2], [0, 1, 2], summ)
    assert "| bd8 < bd16 | +0.0105, +0.0090, +0.0115 |" in text
    one = summarize(_fake({"ar": [1.0], "mdlm": [2.0]}), 64)
    assert one["pairs"][0]["paired"] is None  # one seed: no interval


def test_t_quantile_matches_tables():
    from experiments.perplexity.seeds import t_quantile

    table = {(0.975, 1): 12.7062047362, (0.975, 2): 4.30265272975, (0.975, 10): 2.22813885196,
             (0.975, 49): 2.00957523713, (0.995, 5): 4.03214298356, (0.95, 30): 1.69726088659}
    for (p, df), t in table.items():
        assert t_quantile(p, df) == pytest.approx(t, rel=1e-7), (p, df)
    for bad in ((0.4, 3), (1.0, 3), (0.975, 0), (0.975, -2.5)):
        with pytest.raises(ValueError, match="df"):
            t_quantile(*bad)


def test_mc_elbo_paired_interval():
    rng = random.Random(2)
    chunk = [rng.uniform(100, 200) for _ in range(50)]  # per-chunk nats: a large common part
    x = [c + rng.gauss(0.5, 1.0) for c in chunk]
    y = [c + rng.gauss(0.0, 1.0) for c in chunk]
    ci = paired_ci(x, y)
    d = [a - b for a, b in zip(x, y)]
    sd = (sum((v - sum(d) / 50) ** 2 for v in d) / 49) ** 0.5
    lo, hi = sum(d) / 50 - 2.00957523713 * sd / 50 ** 0.5, sum(d) / 50 + 2.00957523713 * sd / 50 ** 0.5
    assert ci["n"] == 50 and ci["mean"] == pytest.approx(sum(d) / 50)
    assert (ci["lo"], ci["hi"]) == pytest.approx((lo, hi))
    assert ci["hi"] - ci["lo"] < 1.5  # pairing removes the chunk-to-chunk spread (width ~ 0.8, not ~ 16)
    with pytest.raises(ValueError, match="x, y"):
        paired_ci([1.0], [2.0])
    with pytest.raises(ValueError, match="x, y"):
        paired_ci([1.0, 2.0], [2.0])
    fake = {0: {"mc/mdlm": {"kind": "mc_elbo", "chunk_mc_nats": x, "chunk_nelbo_nats": y, "nelbo": 1.0, "nelbo_same": 1.0,
                            "mc_num": 8}}}
    summ = summarize(fake, 16)
    assert summ["mc"][0]["ci"]["mean"] == pytest.approx(ci["mean"] / 16)  # per token
    assert json.dumps(summ)  # plain numbers


@pytest.mark.parametrize("p,df,want", [(0.95, 4, 2.131847), (0.975, 10, 2.228139), (0.8, 5, 0.919544),
                                       (0.95, 1, 6.313752), (0.99, 30, 2.457262)])
def test_t_quantile_and_cdf_against_tables(p, df, want):
    """Student-t quantiles from the standard tables; the CDF inverts them, for fractional df too."""
    assert t_quantile(p, df) == pytest.approx(want, abs=2e-6)
    assert t_cdf(want, df) == pytest.approx(p, abs=1e-6)
    x = t_quantile(p, df + 0.5)  # fractional df (Welch): between its whole neighbours
    assert t_quantile(p, df + 1) < x < t_quantile(p, df) and t_cdf(x, df + 0.5) == pytest.approx(p, abs=1e-9)


def test_welch_p_against_monte_carlo_and_power_against_simulation():
    """p = P(T_df >= t) checked by simulating the t statistic under equal means (Welch's df is an
    approximation, so to 0.01); the planned seed count reaches the power, one fewer does not."""
    rng = random.Random(0)
    a, b = [2.0 + rng.gauss(0, 0.02) for _ in range(5)], [2.03 + rng.gauss(0, 0.04) for _ in range(5)]
    w = welch(a, b)

    def t_null(sa, sb, n):
        xa, xb = [rng.gauss(0, sa) for _ in range(n)], [rng.gauss(0, sb) for _ in range(n)]
        (ma, va), (mb, vb) = ((statistics.fmean(x), statistics.variance(x)) for x in (xa, xb))
        return (mb - ma) / math.sqrt(va / n + vb / n)

    sims = [t_null(0.02, 0.04, 5) for _ in range(40000)]
    assert sum(t >= w["t"] for t in sims) / len(sims) == pytest.approx(w["p"], abs=0.01)
    assert welch([1.0], [2.0, 3.0]) is None and welch([1.0, 1.0], [2.0, 2.0]) is None
    n = seeds_for_power(0.03, 0.02, 0.03)
    assert n is not None and n > 2 and seeds_for_power(-0.01, 0.02, 0.03) is None

    def power(k):  # share of simulated runs of k seeds each that the test separates at 0.05
        hits = 0
        for _ in range(3000):
            xa, xb = [rng.gauss(0, 0.02) for _ in range(k)], [0.03 + rng.gauss(0, 0.03) for _ in range(k)]
            hits += welch(xa, xb)["p"] < 0.05
        return hits / 3000

    assert power(n) >= 0.77 and power(n - 1) < power(n)


def test_an_ema_run_also_evaluates_its_raw_weights_which_are_the_run_without_ema(tmp_path, shared_data):
    """With --ema the exported models hold the EMA weights and the raw ones are evaluated beside them
    (``ppl_raw/<model>``): the EMA does not steer training, so those equal a run without --ema."""
    shared_data("tinyshakespeare/input.txt")
    base = [a for a in _argv(tmp_path, "--seeds", "0", "1", "--steps", "4") if a not in ("--run", "t")]
    work = base.index("--work") + 1
    for name, extra in (("plain", []), ("ema", ["--ema", "0.5"])):
        base[work] = str(tmp_path / f"work-{name}")
        run(parse_config([*base, "--run", name, *extra]))
    out = tmp_path / "out"
    for s in (0, 1):
        plain = {r["id"]: r for r in read_jsonl(out / f"perplexity_plain-s{s}.jsonl")}
        ema = {r["id"]: r for r in read_jsonl(out / f"perplexity_ema-s{s}.jsonl")}
        for m in ("ar", "bd4", "mdlm"):
            assert ema[f"ppl_raw/{m}"]["nelbo"] == pytest.approx(plain[f"ppl/{m}"]["nelbo"], rel=1e-6)
            assert ema[f"ppl/{m}"]["nelbo"] != pytest.approx(plain[f"ppl/{m}"]["nelbo"], rel=1e-6)
            assert (out / "checkpoints" / f"perplexity-ema-s{s}-{m}{jobs.RAW}" / "model.safetensors").is_file()
        assert "ppl_raw/ar" not in plain
    text = (out / "perplexity_ema_seeds.md").read_text()
    assert "## The same runs without their EMA (raw weights)" in text and "| bd4 | 2 |" in text
    assert "## The same runs without their EMA" not in (out / "perplexity_plain_seeds.md").read_text()
