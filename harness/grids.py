"""Grids: the samplers (:class:`dlm.spec.Sampler`) of a results table, built from one set of numbers.

``table1`` (Fast-dLLM's Table 1 line-up + BD3-LM), ``factorial`` (cache x rule x stop_at_eos x
block), ``caches`` (every approximate cache policy under the threshold rule), ``sweep`` (the
curves: per cache policy the threshold and factor rules over their ``sweep`` values, the block
length, and every swept parameter of the policy), ``sweep_fastdllm`` (the sweep over Fast-dLLM's
none / prefix / dual) and ``autoregressive``. ``caches`` and ``sweep`` read the approximate
policies and the swept values from the registry (:mod:`dlm.registry`), so a new cache policy
joins them by itself.
"""

from __future__ import annotations

import itertools
import re
import textwrap
from typing import Optional, Sequence

from dlm import registry
from dlm.spec import Sampler

BLOCK_LENGTHS = (8, 16, 32, 64, 128)  # the sweep's block lengths (those dividing gen_length)


def _numbers(gen_length: int = 256, block_length: int = 32, steps: Optional[int] = None, threshold: float = 0.9,
             factor: float = 1.0, temperature: float = 0.0, family: str = "auto") -> dict:
    return dict(gen_length=gen_length, block_length=block_length, steps=steps, threshold=threshold, factor=factor,
                temperature=temperature, family=family)


def _base(name: str, n: dict, **values) -> Sampler:
    """A sampler of the grid's numbers (threshold / factor only under their rules)."""
    rule = values.get("rule", "topk")
    own = {"threshold": n["threshold"]} if rule == "threshold" else {"factor": n["factor"]} if rule == "factor" else {}
    spec = dict(gen_length=n["gen_length"], block_length=n["block_length"], steps=n["steps"],
                temperature=n["temperature"], family=n["family"])
    return Sampler.of(name, **{**spec, **own, **values})


def table1(**numbers) -> tuple[Sampler, ...]:
    """Fast-dLLM's Table 1 line-up (baseline full / semi-AR, each cache and rule) plus BD3-LM, and the
    semi-AR baseline stopped at the first block holding EOS as BD3-LM is (``baseline_semiar_eos``):
    it tells the speed of stopping early apart from the speed of BD3-LM's exact cache."""
    n = _numbers(**numbers)
    base = _base("baseline_semiar", n)
    return (
        base.with_(name="baseline_full", block_length=None),
        base,
        base.with_(name="baseline_semiar_eos", stop_at_eos=True),
        base.with_(name="fastdllm_prefix", policy="prefix"),
        base.with_(name="fastdllm_dual", policy="dual"),
        _base("fastdllm_threshold", n, rule="threshold"),
        _base("fastdllm_factor", n, rule="factor"),
        _base("fastdllm_prefix_threshold", n, rule="threshold", policy="prefix"),
        _base("fastdllm_dual_threshold", n, rule="threshold", policy="dual"),
        base.with_(name="bd3lm", policy="exact", stop_at_eos=True, top_p=1.0),
    )


def factorial(**numbers) -> tuple[Sampler, ...]:
    """cache (none / prefix / dual) x rule (top-k / threshold) x stop_at_eos x (semi-AR / one block):
    24 cells; the cell without cache, rule or stop is the semi-AR / full baseline."""
    n = _numbers(**numbers)
    cells = []
    for policy, rule, stop, semi in itertools.product(("none", "prefix", "dual"), ("topk", "threshold"),
                                                      (False, True), (True, False)):
        name = (f"abl_{'nocache' if policy == 'none' else policy}_{rule}_{'eos' if stop else 'noeos'}_"
                f"{'semiar' if semi else 'full'}")
        cells.append(_base(name, n, policy=policy, rule=rule, stop_at_eos=stop,
                           block_length=n["block_length"] if semi else None))
    return tuple(cells)


def approximate_policies() -> tuple[tuple[str, str, dict], ...]:
    """``(label, policy, options)`` of every registered approximate cache policy and its variants
    (a policy's ``variants``: ``{suffix: options}``, e.g. the adaptive cache without block-start refreshes)."""
    out = []
    for name in registry.names("policy"):
        cls = registry.get("policy", name)
        if cls.approximate:
            out.append((name, name, {}))
            out += [(f"{name}_{suffix}", name, dict(opts)) for suffix, opts in getattr(cls, "variants", {}).items()]
    return tuple(out)


def caches(**numbers) -> tuple[Sampler, ...]:
    """Every approximate cache policy (and variant) under the threshold rule, ``cache_<label>_threshold``."""
    n = _numbers(**numbers)
    return tuple(_base(f"cache_{label}_threshold", n, rule="threshold", policy=policy, **opts)
                 for label, policy, opts in approximate_policies())


def _tag(x: float) -> str:
    return f"{x:g}".replace(".", "p")


def _swept(cls) -> tuple:
    return tuple(p for p in registry.user_params(cls) if p.sweep)


def sweep(*, policies: Optional[Sequence[str]] = None, rules: Optional[Sequence[str]] = None,
          **numbers) -> tuple[Sampler, ...]:
    """Accuracy-vs-throughput curves per cache policy (``none`` and every approximate one, or the
    labels ``policies``): every rule with a swept parameter (or the rules ``rules``) over its
    ``sweep`` values, the block length over ``BLOCK_LENGTHS`` (threshold rule at ``threshold``;
    lengths not dividing ``gen_length`` left out) and each swept parameter of the policy; cells
    ``sw_<label>_<tag><x>`` (``p`` for the point: ``sw_dual_thr0p9``, ``sw_dual_f2``, ``sw_dual_b16``)."""
    n = _numbers(**numbers)
    labels = (("none", "none", {}),) + approximate_policies()
    cells = []
    for label, policy, opts in labels:
        if policies is not None and label not in policies:
            continue
        base = _base(f"sw_{label}", n, rule="threshold", policy=policy, **opts)
        for rule in registry.names("rule") if rules is None else rules:
            for p in _swept(registry.get("rule", rule)):
                cells += [_base(f"{base.name}_{p.tag}{_tag(v)}", n, rule=rule, policy=policy, **opts).with_(**{p.name: v})
                          for v in p.sweep]
        steps = n["steps"]
        cells += [base.with_(name=f"{base.name}_b{L}", block_length=L) for L in BLOCK_LENGTHS
                  if n["gen_length"] % L == 0 and L != n["block_length"]
                  and (steps is None or steps % (n["gen_length"] // L) == 0)]
        for p in _swept(registry.get("policy", policy)):
            cells += [base.with_(name=f"{base.name}_{p.tag}{_tag(v)}", **{p.name: v}) for v in p.sweep]
    return tuple(cells)


def sweep_fastdllm(**numbers) -> tuple[Sampler, ...]:
    """:func:`sweep` over Fast-dLLM's line-up only: its cache modes (none, prefix, dual) and rules
    (threshold, factor)."""
    return sweep(**numbers, policies=("none", "prefix", "dual"), rules=("threshold", "factor"))


def autoregressive(**numbers) -> tuple[Sampler, ...]:
    """AR decoding with the exact KV cache (an AR-trained model), run to the end and stopping at EOS."""
    n = _numbers(**numbers)
    ar = Sampler.of("ar", policy="ar", gen_length=n["gen_length"], block_length=1, temperature=n["temperature"])
    return ar, ar.with_(name="ar_eos", stop_at_eos=True)


GRIDS = {"table1": table1, "factorial": factorial, "caches": caches, "sweep": sweep,
         "sweep_fastdllm": sweep_fastdllm, "autoregressive": autoregressive}


def sampler_names() -> tuple[str, ...]:
    """Every sampler name of every grid at the default numbers."""
    return tuple(s.name for grid in GRIDS.values() for s in grid())


def listing(width: int = 78) -> str:
    """Every grid with its sampler names, for the entry points' ``--list-strategies``."""
    lines = ["grids of harness/grids.py and their sampler names:"]
    for grid, make in GRIDS.items():
        names = [s.name for s in make()]
        lines += [f"{grid} ({len(names)}):", *textwrap.wrap(" ".join(names), width, initial_indent="  ",
                                                            subsequent_indent="  ")]
    return "\n".join(lines)


def resolve(names: Sequence[str], **numbers) -> list[Sampler]:
    """Sampler or grid names -> samplers built from ``numbers`` (grid order, duplicates dropped).
    Only the grids that hold a requested name are built, and a value a requested sampler cannot
    take is a ValueError naming that sampler or grid: ``strategies baseline_semiar: gen_length=100
    must be divisible by block_length=32`` (never another sampler of its grid)."""
    if isinstance(names, str) or not names:
        raise ValueError("strategies must be a non-empty list of sampler or grid names")
    built: dict[str, object] = {}  # grid -> its samplers, or the error building them

    def grid(g: str):
        if g not in built:
            try:
                built[g] = {s.name: s for s in GRIDS[g](**numbers)}
            except (TypeError, ValueError) as e:
                built[g] = e
        return built[g]

    out: dict[str, Sampler] = {}
    for name in names:
        if name in GRIDS:
            got = grid(name)
            if isinstance(got, Exception):
                raise ValueError(f"strategies {name}: {got}") from None
            out.update(got)
            continue
        errors = []
        for g in GRIDS:
            got = grid(g)
            if isinstance(got, Exception):
                errors.append(got)
            elif name in got:
                out[name] = got[name]
                break
        else:
            if errors and name in sampler_names():  # its grid refuses these numbers: say so for the name asked
                raise ValueError(f"strategies {name}: {re.sub(r'^sampler [^ ]+: ', '', str(errors[0]))}") from None
            raise ValueError(f"strategies: unknown name {name!r}; grids: {sorted(GRIDS)} (every name: "
                             "python -m experiments.eval.gsm8k --list-strategies)")
    return list(out.values())


def factors(s: Sampler) -> dict:
    """Factor levels recorded with every sample (the ablation reads them back)."""
    policy = registry.get("policy", s.policy)
    kind = "bd3lm" if policy.block_model else "baseline" if (s.policy, s.rule) == ("none", "topk") else "fastdllm"
    label = next((lab for lab, name, opts in approximate_policies()
                  if name == s.policy and opts and all(s.option(k) == v for k, v in opts.items())), s.policy)
    return {"kind": kind, "cache": label, "parallel": "none" if s.rule == "topk" else s.rule,
            "stop_at_eos": s.stop_at_eos, "block_length": s.block}
