"""The roofline cost model (harness.roofline) and the Fast-dLLM benchmark's report on it:
forwards recorded by kind add up to the call's NFE and FLOPs, the floor is the per-forward max of
the compute and memory bounds, and the benchmark writes one row per variant and per kind."""

import json

import pytest
import torch

import fastdllm
from experiments.bench import bench_fastdllm
from harness import roofline
from tests.tiny import random_prompts, tiny_model


def test_forward_kinds_add_up_to_the_call():
    model = tiny_model()
    ids = random_prompts(2, 12, model.config)
    out = fastdllm.generate(model, ids, gen_length=16, block_length=8, steps=16, cache="dual", timed=True)
    st = out.stats
    kinds = st.forward_kinds  # (queries, keys, head columns) -> [n, seconds, FLOPs per row]
    assert sum(n for n, _, _ in kinds.values()) == st.nfe
    assert sum(n * f for n, _, f in kinds.values()) == st.extra["flops"]
    assert set(kinds) == {(28, 28, 8), (8, 28, 8)}  # block-start refreshes and cached dual windows
    assert sum(s for _, s, _ in kinds.values()) == pytest.approx(st.forward_seconds)
    hw = {"peak_flops": 1e9, "bandwidth": 1e8}
    each = {k: roofline.floor_seconds(2 * f, roofline.forward_bytes(model, 2, k[1]), hw) for k, (_, _, f) in kinds.items()}
    assert roofline.call_floor(model, st, 2, hw) == pytest.approx(sum(kinds[k][0] * each[k] for k in kinds))
    rows = roofline.kinds(model, st, 2, hw)
    assert [r["queries"] for r in rows] == [28, 8]
    assert all(r["floor_each"] == each[(r["queries"], r["keys"], r["head"])] for r in rows)


def test_matmuls_alone_time_the_forwards_gemms(monkeypatch):
    """matmul_seconds runs every block Linear on `rows` rows and the LM head on `head_rows` rows,
    with the model's own weights; kinds(matmuls=True) reports it per forward kind."""
    model = tiny_model()
    cfg = model.config
    ids = random_prompts(2, 12, cfg)
    st = fastdllm.generate(model, ids, gen_length=16, block_length=8, steps=16, cache="dual", timed=True).stats
    calls = []
    real = roofline.F.linear
    monkeypatch.setattr(roofline.F, "linear", lambda x, w: calls.append((tuple(x.shape), w)) or real(x, w))
    monkeypatch.setattr(roofline, "best_seconds", lambda fn, device, reps: fn() or 0.25)
    assert roofline.matmul_seconds(model, 6, 2) == 0.25
    linears = [m.weight for m in model.layers.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 7 * cfg.n_layers  # q, k, v, o, gate, up, down per block
    assert [w for _, w in calls[:-1]] == linears and calls[-1][1] is model.head_weight()
    assert all(shape[0] == 6 for shape, _ in calls[:-1]) and calls[-1][0] == (2, cfg.d_model)
    calls.clear()
    roofline.matmul_seconds(model, 6, 0)
    assert len(calls) == len(linears)  # no LM head without head columns
    calls.clear()
    rows = roofline.kinds(model, st, 2, {"peak_flops": 1e9, "bandwidth": 1e8}, matmuls=True)
    assert [c[0][0] for c in calls[::len(linears) + 1]] == [2 * 28, 2 * 8]  # batch x window columns
    for r in rows:
        n, sec, _ = st.forward_kinds[(r["queries"], r["keys"], r["head"])]
        assert r["matmul_each"] == 0.25 and r["matmul_over_measured"] == pytest.approx(0.25 * n / sec)


def test_floor_is_the_binding_bound():
    hw = {"peak_flops": 100.0, "bandwidth": 10.0}
    assert roofline.floor_seconds(1000, 50, hw) == 10.0  # compute bound
    assert roofline.floor_seconds(100, 50, hw) == 5.0  # memory bound
    model = tiny_model()
    elem = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * elem
    cfg = model.config
    assert roofline.forward_bytes(model, 3, 10) == weights + 3 * 10 * 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * elem
    hw = roofline.machine(torch.device("cpu"), torch.float32, n=64, mib=1)
    assert hw["peak_flops"] > 0 and hw["bandwidth"] > 0


def test_bench_fastdllm_reports_against_the_roofline(tmp_path):
    res = bench_fastdllm.main(["--preset", "tiny", "--gen-length", "16", "--block-length", "8", "--prompt-len", "8",
                               "--threads", "1", "--out", str(tmp_path), "--name", "t"])
    names = [r["variant"] for r in res["rows"]]
    assert names == ["baseline", "+prefix", "+dual", "+threshold", "+prefix+threshold", "+dual+threshold"]
    for r in res["rows"]:
        assert r["floor_s"] > 0 and r["floor_over_measured"] == pytest.approx(r["floor_s"] / r["seconds"])
        assert sum(k["forwards"] for k in r["kinds"]) == r["nfe"]
        assert r["matmul_s"] == pytest.approx(sum(k["forwards"] * k["matmul_each"] for k in r["kinds"]))
        assert 0 < r["matmul_s"] and r["matmul_over_measured"] == pytest.approx(r["matmul_s"] / r["seconds"])
    assert json.loads((tmp_path / "t.json").read_text())["rows"][0]["variant"] == "baseline"
    md = (tmp_path / "t.md").read_text()
    assert md.startswith("# Fast-dLLM speed against the roofline") and "| 16 | +dual | 8 x 24, head 8 |" in md


def test_bench_fastdllm_compile_columns(tmp_path, monkeypatch):
    """The --compile path's report (the compiler itself is tested in test_compiled.py: here the
    forward stays eager, so the tokens must be equal)."""
    monkeypatch.setattr(bench_fastdllm, "compiled", lambda model: model)
    res = bench_fastdllm.main(["--preset", "tiny", "--gen-length", "16", "--block-length", "8", "--prompt-len", "8",
                               "--threads", "1", "--compile", "--out", str(tmp_path), "--name", "c"])
    for r in res["rows"]:
        assert r["tokens_equal"] and r["compile_speedup"] == pytest.approx(r["seconds"] / r["compiled_seconds"])
    assert "Compiled forward (`torch.compile`, dynamic shapes) against eager" in (tmp_path / "c.md").read_text()


def test_bench_bd3lm_reports_the_exact_cache_against_the_roofline(tmp_path):
    from experiments.bench import bench_bd3lm

    res = bench_bd3lm.main(["--d-model", "32", "--layers", "1", "--vocab", "64", "--train-len", "32", "--train-batch",
                            "1", "--block-size", "8", "--lengths", "32", "--reps", "3", "--threads", "1",
                            "--out", str(tmp_path)])
    row = res["sampling"]["32"]
    assert row["tokens_equal"]
    for key in ("cached", "uncached"):
        assert row[key]["floor_s"] > 0
        assert row[key]["floor_over_measured"] == pytest.approx(row[key]["floor_s"] / row[key]["seconds"])
        assert len(row["times"][key]) == len(row["times"][f"{key}_matmuls"]) == 3
        assert row[key]["seconds"] == sorted(row["times"][key])[1]
    assert row["cached"]["flops"] < row["uncached"]["flops"]  # the exact cache removes compute
    per_round = sorted(u / c for u, c in zip(row["times"]["uncached"], row["times"]["cached"]))
    assert row["speedup"]["median"] == per_round[1] and row["speedup"]["rounds"] == 3
    assert row["of_flop_ideal"]["median"] == pytest.approx(per_round[1] / row["flop_ideal"])
    t = row["times"]
    of_mm = sorted((u / c) / (um / cm) for u, c, um, cm in
                   zip(t["uncached"], t["cached"], t["uncached_matmuls"], t["cached_matmuls"]))
    assert row["of_matmul_ideal"]["median"] == pytest.approx(of_mm[1])
    assert res["training"]["sdpa"]["ratio"]["rounds"] == 3
    md = (tmp_path / "bd3lm.md").read_text()
    assert "| 32 |" in md and "random model: d 32, 1 layers, vocab 64" in md


def test_matmuls_of_call_runs_each_forward_kind_its_count_of_times(monkeypatch):
    """The call's matmul floor replays every recorded forward kind exactly its count of times."""
    from bd3lm import sample
    from harness import roofline

    model = tiny_model()
    out = sample(model, random_prompts(1, 4, model.config), block_size=4, max_length=16, steps_per_block=2,
                 stop_at_eos=False, use_cache=True)
    made = []
    monkeypatch.setattr(roofline, "matmul_call", lambda m, rows, head: lambda: made.append((rows, head)))
    roofline.matmuls_of_call(model, out.stats, 1)()
    want = {}
    for (q, _k, h), (n, _s, _f) in out.stats.forward_kinds.items():
        want[(q, h)] = want.get((q, h), 0) + n
    assert {k: made.count(k) for k in set(made)} == want
    assert len(made) == out.stats.nfe


def test_kinds_of_the_same_shape_but_another_head_are_apart():
    """BD3-LM's exact cache runs each block's window twice: denoising (LM head on the block) and
    the clean commit (no head). Same shape, different FLOPs: two kinds."""
    from bd3lm import sample

    model = tiny_model()
    out = sample(model, random_prompts(1, 4, model.config), block_size=4, max_length=16, steps_per_block=2,
                 stop_at_eos=False, use_cache=True)
    kinds = out.stats.forward_kinds
    assert any(h == 0 for _, _, h in kinds) and any(h == 4 for _, _, h in kinds)
    for (q, k, h), (n, _, f) in kinds.items():
        assert f == roofline_flops(model, q, k, h)
    assert sum(n * f for n, _, f in kinds.values()) == out.stats.extra["flops"]


def roofline_flops(model, q, k, h):
    from dlm.stats import forward_flops

    cfg = model.config
    return forward_flops(cfg.num_params(include_embeddings=False), cfg.n_layers, cfg.d_model, q, k, cfg.vocab_size, h)
