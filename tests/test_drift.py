"""experiments.eval.drift: what is and is not exact in Fast-dLLM's approximate cache.

- refresh every step: every step is a full forward, identical to the exact recomputation, so
  K/V errors and KL are exactly 0 and no token differs;
- layer-0 K/V of an unchanged column depend only on its token and position: the cached layer-0
  K/V are exact for any depth, so a one-layer model does not drift at all;
- deeper layers of a multi-layer model drift once the block changes (refresh only per block).
"""

from __future__ import annotations

import json

import pytest

from experiments.eval import drift
from tiny import random_prompts, tiny_model

CFG = dict(gen=12, block=4)


def _run(model, cache, refresh, **kw):
    """refresh: None (block starts), K (every K steps) or a policy dict (drift.parse_refresh)."""
    ids = random_prompts(1, 5, model.config, seed=3)
    policy = refresh if isinstance(refresh, dict) else None if refresh is None else {"refresh_every": refresh}
    return drift.measure(model, ids, drift.DriftConfig(cache=cache, **CFG, **kw), policy)


@pytest.mark.parametrize("cache", ["dual", "prefix"])
def test_refresh_every_step_is_exact(cache):
    r = _run(tiny_model(), cache, refresh=1)
    assert r.steps and all(s.full for s in r.steps)
    for s in r.steps:
        assert s.k_err == s.v_err == (0.0, 0.0)
        assert s.k_cos == pytest.approx((1.0, 1.0), abs=1e-12)
        assert s.kl_max == 0.0 and s.differ == 0
    assert r.first_divergence is None


@pytest.mark.parametrize("cache", ["dual", "prefix"])
def test_one_layer_cache_is_exact(cache):
    r = _run(tiny_model(n_layers=1), cache, refresh=None)
    assert not all(s.full for s in r.steps)
    for s in r.steps:
        assert s.k_err == s.v_err == (0.0,)
        assert s.kl_max < 1e-12 and s.differ == 0  # window vs full forward: rounding only
    assert r.first_divergence is None


@pytest.mark.parametrize("cache", ["dual", "prefix"])
def test_deeper_layers_drift_without_refresh(cache):
    r = _run(tiny_model(n_layers=3), cache, refresh=None)
    assert all(s.k_err[0] == 0.0 and s.v_err[0] == 0.0 for s in r.steps)  # layer 0 always exact
    cached = [s for s in r.steps if not s.full]
    assert max(s.k_err[2] for s in cached) > 1e-3 and min(s.k_cos[2] for s in cached) < 1.0
    assert max(s.kl_max for s in cached) > 1e-6
    refreshed = _run(tiny_model(n_layers=3), cache, refresh=2)  # refreshing reduces the drift
    mean = lambda rr: sum(s.kl_mean for s in rr.steps) / len(rr.steps)  # noqa: E731
    assert mean(refreshed) < mean(r)


def test_shifted_logits_columns():
    cols = drift.cache_columns("dual", 5, 9, 12, shift_logits=True)
    assert cols.tolist() == [0, 1, 2, 3, 9, 10, 11]
    assert drift.cache_columns("prefix", 5, 9, 12, shift_logits=False).tolist() == [0, 1, 2, 3, 4]
    r = _run(tiny_model(n_layers=1, shift_logits=True, qkv_bias=True), "dual", refresh=None)
    assert all(s.k_err == (0.0,) and s.differ == 0 for s in r.steps)


def test_cli_writes_results(tmp_path, capsys):
    out = drift.main(["--gen", "8", "--block", "4", "--prompts", "2", "--layers", "2", "--prompt-len", "6",
                      "--refresh", "block", "every:1", "--out-dir", str(tmp_path), "--run", "t"])
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["config"]["git_sha"] and set(data["summary"]) == {"block", "every:1"}
    assert len(data["summary"]["block"]["k_cos_by_layer"]) == 2
    assert data["summary"]["every:1"]["kl_max"] == 0.0
    assert out["summary"]["block"]["kl_mean"] > 0.0
    for f in ("t.md", "t/k_cos_by_layer.png", "t/kl_by_step.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert "| every:1 |" in capsys.readouterr().out


@pytest.mark.parametrize("spec", ["delayed", "delayed:2", "adaptive:0.05", "adaptive-nb:0.05"])
def test_new_policies_one_layer_exact_and_deeper_drift(spec):
    """The delayed and adaptive caches: exact on one layer, drifting (and counted) on three."""
    policy = drift.parse_refresh(spec)
    r = _run(tiny_model(n_layers=1), "dual", refresh=policy)
    assert all(s.k_err == s.v_err == (0.0,) and s.differ == 0 for s in r.steps)
    assert r.first_divergence is None and r.refreshes >= 1
    deep = _run(tiny_model(n_layers=3), "dual", refresh=policy)
    assert max(s.kl_max for s in deep.steps if not s.full) > 1e-6
    always = _run(tiny_model(n_layers=3), "dual", refresh=drift.parse_refresh("adaptive:0"))
    assert all(s.full for s in always.steps) and max(s.kl_max for s in always.steps) == 0.0
    assert always.refreshes == len(always.steps)


@pytest.mark.parametrize("bad", ["never", "every:0", "every:x", "every:", "delayed:0", "delayed:x", "adaptive",
                                 "adaptive:", "adaptive:x", "adaptive-nb:-1"])
def test_bad_refresh(bad):
    with pytest.raises(ValueError, match="refresh|tolerance"):
        policy = drift.parse_refresh(bad)
        drift.measure(tiny_model(), random_prompts(1, 5, tiny_model().config), drift.DriftConfig(**CFG), policy)


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="gen_length"):
        drift.DriftConfig(gen=10, block=4)
    with pytest.raises(ValueError, match="cache"):
        drift.DriftConfig(cache="none")
    with pytest.raises(ValueError, match="prompts"):
        drift.main(["--prompts", "0", "--out-dir", str(tmp_path)])
    model = tiny_model()
    with pytest.raises(ValueError, match="input_ids"):
        drift.measure(model, random_prompts(2, 5, model.config), drift.DriftConfig(**CFG), None)
