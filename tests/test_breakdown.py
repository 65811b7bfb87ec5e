"""experiments.bench.breakdown on the tiny shape: every forward kind at every batch, whole and
matmul times with intervals, the table written; a bad --gen-length is refused before any compute.
The narrow model dispatches exactly the ops of the model it narrows, and the op count is exact."""

import pytest
import torch

from experiments.bench import breakdown
from dlm.stats import forward_flops
from harness.shapes import random_model


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
        assert r["narrow_s"] > 0 and r["aten_ops"] > 20
        assert r["ns_per_flop"] == pytest.approx(1e9 * r["whole_s"] / r["flops"])
        assert r["attention_s"] > 0 and r["whole_over_gemms"]["median"] < r["whole_over_matmuls"]["median"]
        lo, hi = r["narrow_over_rest"]["ci"]
        assert lo <= r["narrow_over_rest"]["median"] <= hi
    md = (tmp_path / "breakdown_tiny.md").read_text()
    assert md.startswith("# Forward time against its matmuls: tiny shape, prompt 8, gen 64")
    assert md.count("\n| ") == 1 + 10  # header and one row per kind and batch
    assert "| attention ms | attention / rest | whole / (matmuls + attention) |" in md


def test_gen_length_must_fill_blocks(tmp_path):
    with pytest.raises(ValueError, match="--gen-length must be a multiple of 32, got 40"):
        breakdown.main(["--shape", "tiny", "--gen-length", "40", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("layout", [dict(), dict(qkv_bias=True, tie_embeddings=True, shift_logits=True)])
def test_narrow_model_dispatches_the_same_ops(layout):
    model = random_model(dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, mlp_hidden=48, **layout), 256)
    thin = breakdown.narrow(model)
    cfg, small = model.config, thin.config
    assert (small.d_model, small.mlp_hidden) == (2 * cfg.n_heads, 8)
    assert {k: v for k, v in vars(small).items() if k not in ("d_model", "mlp_hidden")} == \
        {k: v for k, v in vars(cfg).items() if k not in ("d_model", "mlp_hidden")}
    for kind in breakdown.KINDS:
        run = breakdown.forward_of(kind, model, 2, 8, 64).run
        thin_run = breakdown.forward_of(kind, thin, 2, 8, 64).run
        assert breakdown.aten_ops(run) == breakdown.aten_ops(thin_run), kind


def test_aten_ops_counts_each_operator():
    x = torch.ones(3)
    assert breakdown.aten_ops(lambda: (x + 1) * 2) == 2
    assert breakdown.aten_ops(lambda: None) == 0


@pytest.mark.slow
def test_compiled_arms_time_and_check_the_forward(tmp_path):
    res = breakdown.main(["--shape", "tiny", "--kinds", "ar", "--batches", "1", "--prompt-len", "8",
                          "--gen-length", "64", "--repeats", "3", "--threads", "1", "--compile", "--out", str(tmp_path)])[0]
    assert [r["kind"] for r in res["rows"]] == ["ar"]
    for r in res["rows"]:
        assert tuple(r["compiled"]) == breakdown.COMPILE_MODES
        for c in r["compiled"].values():
            assert c["argmax_equal"] and c["first_call_s"] > 0
            assert set(c["page_faults_per_call"]) == {"eager", "compiled"}
            lo, hi = c["speedup"]["ci"]
            assert 0 < lo <= c["speedup"]["median"] <= hi
    md = (tmp_path / "breakdown_tiny.md").read_text()
    assert "| eager / compiled static | eager / compiled dynamic |" in md and "argmax differs" not in md


def test_a_forwards_flops_are_the_loops_count():
    model = random_model(dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden=48), 256)
    dense = model.config.num_params(include_embeddings=False)
    P, G = 8, 64
    want = {"full": (P + G, P + G, 32), "prefix": (G, P + G, 32), "dual": (32, P + G, 32), "exact": (16, P + 16, 16),
            "ar": (1, P + G // 2 + 1, 1)}
    for kind, (q, keys, head) in want.items():
        f = breakdown.forward_of(kind, model, 2, P, G)
        assert (f.queries, f.head, f.keys) == (q, head, keys)
        assert f.flops == forward_flops(dense, 2, 32, q, keys, 64, head), kind
        assert (f.mask is None) == (kind in ("full", "prefix", "dual")), kind
