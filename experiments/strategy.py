"""The one strategy type: a name plus the arguments of the one loop (:func:`dlm.sample.denoise`).

A :class:`Strategy` says which cache policy recomputes what (``cache``), which commit rule
decides what to keep (``rule``), and the numbers (``gen_length``, ``block_length``, ``steps``,
``threshold``, ``factor``, ...). Every policy runs with every rule, e.g. BD3-LM's exact cache with
the threshold rule inside each block (what Fast-dLLM v2 does for block-diffusion models).

=================  =========================================================================
cache              policy (which window a step recomputes, when K/V are written)
=================  =========================================================================
``none``           :class:`dlm.sampling.FullSequence`: prompt + answer, no cache (LLaDA)
``prefix``         :class:`fastdllm.PrefixCache`: ``[lo, T)``, refreshed per block (Fast-dLLM)
``dual``           :class:`fastdllm.DualCache`: the block only, refreshed per block (Fast-dLLM)
``delayed``        :class:`fastdllm.delayed.DelayedCache`: decoded columns cached one step late,
                   masked ones never (dKV-Cache; ``delay``)
``adaptive``       :class:`fastdllm.adaptive.AdaptiveCache`: the dual cache refreshed per row
                   when a drift test fires (after Elastic-Cache; ``tolerance``, ``every_block``)
``ar``             :class:`dlm.ar.ARCache`: autoregressive, causal, one column per step over an
                   exact cache (``block_length=1``; an AR-trained model)
``exact``          :class:`bd3lm.policy.ExactBlockCache`: the block only, block-causal, clean
                   blocks' K/V written once (BD3-LM; a block-diffusion model)
``block_causal``   the same attention without the cache (the whole prefix every step)
=================  =========================================================================

Adding a cache policy: its module (a class with ``name``, ``start``, ``logits`` setting ``run.refreshed``,
``block_done``) and one line in ``POLICIES``; adding a commit rule: :mod:`dlm.commit`.

Grids (``GRIDS``) build the strategies of a results table from one set of numbers: ``table1``
(Fast-dLLM's Table 1 line-up + BD3-LM), ``factorial`` (cache x rule x stop_at_eos x block),
``caches`` (every approximate cache under the threshold rule) and ``sweep`` (the curves: each
cache's threshold, factor, block length and tolerance swept).
"""

from __future__ import annotations

import itertools
import textwrap
from dataclasses import asdict, dataclass, replace
from typing import Optional, Sequence

import torch
from torch import Tensor

from bd3lm.policy import ALIGNS, ExactBlockCache
from bd3lm.sampler import block_layout
from dlm.ar import ARCache
from dlm.commit import RULES, check_int, check_real
from dlm.compiled import compiled
from dlm.dream import DreamProposal, dream_rule
from dlm.sample import Callback, GenerateOutput, denoise
from dlm.sampling import FullSequence, blocks_after
from dlm.validate import check_blocks, prepare_batch
from fastdllm.dream import RULE_SETS, block_sampler, resolve_rules
from fastdllm.policies import cache_policy


def _approximate(s: "Strategy", dream: bool):
    return cache_policy(s.cache, s.refresh_every, dream, delay=s.delay, tolerance=s.tolerance,
                        every_block=s.every_block)


POLICIES = {  # (strategy, Fast-dLLM's Dream rules in force) -> policy
    "none": lambda s, dream: FullSequence(s.cfg_scale),
    "prefix": _approximate,
    "dual": _approximate,
    "delayed": _approximate,
    "adaptive": _approximate,
    "ar": lambda s, dream: ARCache(),
    "exact": lambda s, dream: ExactBlockCache(s.block_length, s.align, use_cache=True),
    "block_causal": lambda s, dream: ExactBlockCache(s.block_length, s.align, use_cache=False),
}
BLOCK_MODELS = ("exact", "block_causal")  # policies for block-diffusion (BD3-LM) models
DREAM_BLOCK_RULES = ("topk", "threshold", "factor")  # the rules fastdllm.dream gives a Dream form
#: new fields, left out of as_dict() at these defaults so older results keep their config hashes
_LATER_DEFAULTS = {"rules": "auto", "alg": None, "alg_temp": None, "eps": None, "top_k": None, "delay": None,
                   "tolerance": None, "every_block": True}


@dataclass(frozen=True)
class Strategy:
    """One sampler configuration (a row of a results table).

    block_length None: one block of ``gen_length`` (full-sequence diffusion); for the
    block-diffusion policies it must be the model's block size (:meth:`for_bd3` sets it).
    steps: total denoising steps of the scheduled rules (default ``gen_length``: one token per
    step), split evenly over the blocks. threshold / factor: the numbers of those rules.
    top_p: None proposes from raw logits (LLaDA); a number from BD3-LM's SUBS log-probabilities
    (Dream's nucleus filter under the Dream rules).
    align: block alignment of the block-diffusion policies (``prompt`` or ``absolute``).
    rules: which family's rules ``topk`` / ``threshold`` / ``factor`` follow (:mod:`fastdllm.dream`):
    ``auto`` Fast-dLLM's Dream rules on a Dream-style model (``config.shift_logits``), its LLaDA
    rules otherwise; ``dream`` / ``llada`` either. rule ``dream``: Dream's own sampler
    (:mod:`dlm.dream`, ``alg`` default ``entropy``). alg, alg_temp, eps, top_k: Dream's options
    (``eps`` default 1e-3), for the Dream rules and rule ``dream`` only.
    """

    name: str = "baseline"
    cache: str = "none"
    rule: str = "topk"
    gen_length: int = 256
    block_length: Optional[int] = 32
    steps: Optional[int] = None
    threshold: Optional[float] = None
    factor: Optional[float] = None
    temperature: float = 0.0
    remasking: str = "low_confidence"
    top_p: Optional[float] = None
    stop_at_eos: bool = False
    refresh_every: Optional[int] = None
    cfg_scale: float = 0.0
    align: str = "prompt"
    rules: str = "auto"
    alg: Optional[str] = None
    alg_temp: Optional[float] = None
    eps: Optional[float] = None
    top_k: Optional[int] = None
    delay: Optional[int] = None
    tolerance: Optional[float] = None
    every_block: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name or "." in self.name:
            raise ValueError(f"strategy name must be a non-empty str without '/' or '.', got {self.name!r}")
        if self.cache not in POLICIES:
            raise ValueError(f"strategy {self.name}: cache must be one of {tuple(POLICIES)}, got {self.cache!r}")
        if self.align not in ALIGNS:
            raise ValueError(f"strategy {self.name}: align must be one of {ALIGNS}, got {self.align!r}")
        if not isinstance(self.stop_at_eos, bool):
            raise TypeError(f"strategy {self.name}: stop_at_eos must be a bool")
        if self.block_length is None and self.cache in BLOCK_MODELS:
            raise ValueError(f"strategy {self.name}: cache={self.cache!r} needs the model's block size "
                             "as block_length (Strategy.for_bd3)")
        if self.cfg_scale and self.cache != "none":
            raise ValueError(f"strategy {self.name}: cfg_scale needs cache='none'")
        check_real("cfg_scale", self.cfg_scale, 0.0, low_open=False)
        check_blocks(self.gen_length, self.block, self.total_steps)
        if self.rules not in RULE_SETS:
            raise ValueError(f"strategy {self.name}: rules must be one of {RULE_SETS}, got {self.rules!r}")
        dream_options = [k for k in ("alg", "alg_temp", "eps", "top_k") if getattr(self, k) is not None]
        if dream_options and self.rules != "dream" and self.rule != "dream":
            raise ValueError(f"strategy {self.name}: {', '.join(dream_options)} are options of Dream's rules "
                             "(rules='dream' or rule='dream')")
        for family in ("llada", "dream") if self.rules == "auto" else (self.rules,):
            self.sampler(family)  # validates rule, threshold, factor, steps, sampling and Dream's options
        if self.cache == "none" and (self.delay is not None or self.tolerance is not None or not self.every_block):
            raise ValueError(f"strategy {self.name}: delay / tolerance / every_block are options of the "
                             "delayed / adaptive caches")
        if self.cache == "ar" and (self.block_length != 1 or self.rule != "topk"):
            raise ValueError(f"strategy {self.name}: cache='ar' decodes one column per step: block_length=1, "
                             "rule='topk'")
        try:
            POLICIES[self.cache](self, False)  # validates refresh_every, delay, tolerance, every_block
        except (TypeError, ValueError) as e:
            raise type(e)(f"strategy {self.name}: {e}") from None

    @property
    def block(self) -> int:
        """The decoding block length (``gen_length`` for one block)."""
        return self.gen_length if self.block_length is None else self.block_length

    @property
    def total_steps(self) -> int:
        return self.gen_length if self.steps is None else self.steps

    @property
    def steps_per_block(self) -> int:
        return self.total_steps * self.block // self.gen_length

    def family(self, model) -> str:
        """``llada`` or ``dream``: whose block rules run on ``model`` (Dream's only for the rules
        and caches Fast-dLLM's Dream sampler has)."""
        if self.rule not in DREAM_BLOCK_RULES or self.cache in BLOCK_MODELS + ("ar",):
            return "llada"
        return resolve_rules(self.rules, model)

    def commit_rule(self, family: str = "llada"):
        return self.sampler(family)[0]

    def proposal(self, family: str = "llada"):
        return self.sampler(family)[1]

    def sampler(self, family: str = "llada"):
        """(commit rule, proposal) under ``family``'s rules: Dream's own sampler for rule ``dream``,
        else Fast-dLLM's family rules (:func:`fastdllm.dream.block_sampler`; the LLaDA ones for
        the block-diffusion and AR policies)."""
        if self.rule == "dream":
            if self.remasking != "low_confidence":
                raise ValueError(f"strategy {self.name}: remasking is an option of the LLaDA rules")
            return (dream_rule(self.steps_per_block, self.alg or "entropy", 1e-3 if self.eps is None else self.eps,
                               self.alg_temp, "row"), DreamProposal(self.temperature, self.top_p, self.top_k))
        if self.alg is not None:
            raise ValueError(f"strategy {self.name}: alg is an option of rule='dream'")
        if family == "dream" and (self.rule not in DREAM_BLOCK_RULES or self.cache in BLOCK_MODELS):
            family = "llada"
        try:
            return block_sampler(family, self.rule, self.steps_per_block, self.threshold, self.factor,
                                 self.temperature, self.remasking, self.top_p, self.top_k, self.eps, self.alg_temp,
                                 self.cache)
        except (TypeError, ValueError) as e:
            raise type(e)(f"strategy {self.name}: {e}") from None

    def policy(self, family: str = "llada"):
        return POLICIES[self.cache](self, family == "dream")

    def for_bd3(self, block_size: int, align: str) -> "Strategy":
        """This strategy on a BD3-LM model of ``block_size`` and ``align`` (the block-diffusion
        policies only; others are returned unchanged)."""
        if self.cache not in BLOCK_MODELS:
            return self
        check_int("block_size", block_size)
        return replace(self, block_length=block_size, align=align)

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in _LATER_DEFAULTS or v != _LATER_DEFAULTS[k]}

    @torch.no_grad()
    def run(self, model, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
            generator: Optional[torch.Generator] = None, callback: Optional[Callback] = None,
            backend: str = "sdpa", compile: bool = False) -> GenerateOutput:
        """Decode after the left-padded prompts ``input_ids`` (B, P) with the one loop.
        ``compile``: the model forward under ``torch.compile`` (:mod:`dlm.compiled`; same tokens)."""
        if not isinstance(compile, bool):
            raise TypeError(f"compile must be a bool, got {type(compile).__name__}")
        G, L = self.gen_length, self.block
        batch = prepare_batch(model, input_ids, attention_mask, G, None)  # validates before any compute
        model = compiled(model) if compile else model
        if self.cache in BLOCK_MODELS:
            blocks = block_layout(self.align, batch.prompt_len, G, L, attention_mask)
        else:
            blocks = blocks_after(batch.prompt_len, G, L)
        family = self.family(model)
        rule, proposal = self.sampler(family)
        return denoise(model, batch, blocks, self.policy(family), rule, proposal,
                       stop_at_eos=self.stop_at_eos, generator=generator, backend=backend, callback=callback)


# ------------------------------------------------------------------------------------- grids
def table1(gen_length: int = 256, block_length: int = 32, steps: Optional[int] = None, threshold: float = 0.9,
           factor: float = 1.0, temperature: float = 0.0, rules: str = "auto") -> tuple[Strategy, ...]:
    """Fast-dLLM's Table 1 line-up (baseline full / semi-AR, each cache and rule) plus BD3-LM, and the
    semi-AR baseline stopped at the first block holding EOS as BD3-LM is (``baseline_semiar_eos``):
    it tells the speed of stopping early apart from the speed of BD3-LM's exact cache."""
    base = Strategy("baseline_semiar", gen_length=gen_length, block_length=block_length, steps=steps,
                    temperature=temperature, rules=rules)
    thr = dict(rule="threshold", threshold=threshold)
    return (
        replace(base, name="baseline_full", block_length=None),
        base,
        replace(base, name="baseline_semiar_eos", stop_at_eos=True),
        replace(base, name="fastdllm_prefix", cache="prefix"),
        replace(base, name="fastdllm_dual", cache="dual"),
        replace(base, name="fastdllm_threshold", **thr),
        replace(base, name="fastdllm_factor", rule="factor", factor=factor),
        replace(base, name="fastdllm_prefix_threshold", cache="prefix", **thr),
        replace(base, name="fastdllm_dual_threshold", cache="dual", **thr),
        replace(base, name="bd3lm", cache="exact", stop_at_eos=True, top_p=1.0),
    )


def factorial(gen_length: int = 256, block_length: int = 32, steps: Optional[int] = None, threshold: float = 0.9,
              factor: float = 1.0, temperature: float = 0.0, rules: str = "auto") -> tuple[Strategy, ...]:
    """cache (none / prefix / dual) x rule (top-k / threshold) x stop_at_eos x (semi-AR / one block):
    24 cells; the cell without cache, rule or stop is the semi-AR / full baseline."""
    cells = []
    for cache, rule, stop, semi in itertools.product(("none", "prefix", "dual"), ("topk", "threshold"),
                                                     (False, True), (True, False)):
        name = (f"abl_{'nocache' if cache == 'none' else cache}_{rule}_{'eos' if stop else 'noeos'}_"
                f"{'semiar' if semi else 'full'}")
        cells.append(Strategy(name, cache, rule, gen_length, block_length if semi else None, steps,
                              threshold if rule == "threshold" else None, temperature=temperature,
                              stop_at_eos=stop, rules=rules))
    return tuple(cells)


def caches(gen_length: int = 256, block_length: int = 32, steps: Optional[int] = None, threshold: float = 0.9,
           factor: float = 1.0, temperature: float = 0.0, rules: str = "auto") -> tuple[Strategy, ...]:
    """Every approximate cache policy under the threshold rule: Fast-dLLM's prefix and dual, the
    delayed cache (dKV-Cache) and the drift-refreshed dual cache with / without its block-start
    refresh (tolerance 0.1)."""
    base = Strategy("cache_dual_threshold", "dual", "threshold", gen_length, block_length, steps, threshold,
                    temperature=temperature, rules=rules)
    return (replace(base, name="cache_prefix_threshold", cache="prefix"), base,
            replace(base, name="cache_delayed_threshold", cache="delayed"),
            replace(base, name="cache_adaptive_threshold", cache="adaptive", tolerance=0.1),
            replace(base, name="cache_adaptive_nb_threshold", cache="adaptive", tolerance=0.1, every_block=False))


SWEEP = {"threshold": (0.5, 0.7, 0.8, 0.9, 0.95, 0.99), "factor": (0.5, 1.0, 2.0, 4.0),
         "block_length": (8, 16, 32, 64, 128), "tolerance": (0.02, 0.05, 0.1, 0.2, 0.5),
         "refresh_every": (2, 4, 8)}
SWEEP_CACHES = {"none": {}, "prefix": {}, "dual": {}, "delayed": {}, "adaptive": {"tolerance": 0.1},
                "adaptive_nb": {"tolerance": 0.1, "every_block": False}}


def _tag(x: float) -> str:
    return f"{x:g}".replace(".", "p")


def sweep(gen_length: int = 256, block_length: int = 32, steps: Optional[int] = None, threshold: float = 0.9,
          factor: float = 1.0, temperature: float = 0.0, rules: str = "auto",
          caches: Sequence[str] = tuple(SWEEP_CACHES)) -> tuple[Strategy, ...]:
    """Accuracy-vs-throughput curves: per cache policy (``SWEEP_CACHES``) the threshold rule over
    ``SWEEP["threshold"]``, the factor rule over ``SWEEP["factor"]``, the block length over
    ``SWEEP["block_length"]`` (threshold ``threshold``), the adaptive caches' tolerance over
    ``SWEEP["tolerance"]`` and the others' extra refresh every ``SWEEP["refresh_every"]`` steps;
    cells ``sw_<cache>_thr<t>`` / ``_f<f>`` / ``_b<L>`` / ``_tol<x>`` / ``_re<k>`` (numbers
    with ``p`` for the point: ``sw_dual_thr0p9``).
    The block lengths that do not divide ``gen_length`` are left out. ``caches``: the keys of
    ``SWEEP_CACHES`` swept (grid ``sweep_fastdllm``: Fast-dLLM's three, none / prefix / dual)."""
    cells = []
    for cache in caches:
        knobs = SWEEP_CACHES[cache]
        base = Strategy(f"sw_{cache}", cache.removesuffix("_nb"), "threshold", gen_length, block_length, steps,
                        threshold, temperature=temperature, rules=rules, **knobs)
        cells += [replace(base, name=f"{base.name}_thr{_tag(t)}", threshold=t) for t in SWEEP["threshold"]]
        cells += [replace(base, name=f"{base.name}_f{_tag(f)}", rule="factor", threshold=None, factor=f)
                  for f in SWEEP["factor"]]
        cells += [replace(base, name=f"{base.name}_b{L}", block_length=L) for L in SWEEP["block_length"]
                  if gen_length % L == 0 and L != block_length and (steps is None or steps % (gen_length // L) == 0)]
        if cache.startswith("adaptive"):
            cells += [replace(base, name=f"{base.name}_tol{_tag(x)}", tolerance=x) for x in SWEEP["tolerance"]]
        elif cache != "none":
            cells += [replace(base, name=f"{base.name}_re{k}", refresh_every=k) for k in SWEEP["refresh_every"]]
    return tuple(cells)


def autoregressive(gen_length: int = 256, block_length: int = 32, steps: Optional[int] = None, threshold: float = 0.9,
                   factor: float = 1.0, temperature: float = 0.0, rules: str = "auto") -> tuple[Strategy, ...]:
    """AR decoding with the exact KV cache (an AR-trained model), run to the end and stopping at EOS."""
    ar = Strategy("ar", "ar", "topk", gen_length, 1, temperature=temperature)
    return ar, replace(ar, name="ar_eos", stop_at_eos=True)


def sweep_fastdllm(**numbers) -> tuple[Strategy, ...]:
    """:func:`sweep` over Fast-dLLM's cache modes only: none, prefix, dual."""
    return sweep(**numbers, caches=("none", "prefix", "dual"))


GRIDS = {"table1": table1, "factorial": factorial, "caches": caches, "sweep": sweep,
         "sweep_fastdllm": sweep_fastdllm, "autoregressive": autoregressive}
STRATEGY_NAMES = tuple(s.name for grid in GRIDS.values() for s in grid())


def listing(width: int = 78) -> str:
    """Every grid with its strategy names, for the entry points' ``--list-strategies``."""
    lines = ["grids of experiments/strategy.py and their strategy names:"]
    for grid, make in GRIDS.items():
        names = [s.name for s in make()]
        lines += [f"{grid} ({len(names)}):", *textwrap.wrap(" ".join(names), width, initial_indent="  ",
                                                            subsequent_indent="  ")]
    return "\n".join(lines)


def resolve(names: Sequence[str], **numbers) -> list[Strategy]:
    """Strategy or grid names -> strategies built from ``numbers`` (grid order, duplicates dropped)."""
    if isinstance(names, str) or not names:
        raise ValueError("strategies must be a non-empty list of strategy or grid names")
    every = {s.name: s for grid in GRIDS.values() for s in grid(**numbers)}
    out: dict[str, Strategy] = {}
    for name in names:
        if name in GRIDS:
            out.update((s.name, s) for s in GRIDS[name](**numbers))
        elif name in every:
            out[name] = every[name]
        else:
            raise ValueError(f"strategies: unknown name {name!r}; grids: {sorted(GRIDS)} (every name: "
                             "python -m experiments.gsm8k --list-strategies)")
    return list(out.values())


def factors(s: Strategy) -> dict:
    """Factor levels recorded with every sample (the ablation reads them back)."""
    kind = "bd3lm" if s.cache in BLOCK_MODELS else "baseline" if (s.cache, s.rule) == ("none", "topk") else "fastdllm"
    cache = "adaptive_nb" if s.cache == "adaptive" and not s.every_block else s.cache
    return {"kind": kind, "cache": cache, "parallel": s.rule if s.rule in ("threshold", "factor") else "none",
            "stop_at_eos": s.stop_at_eos, "block_length": s.block}


__all__ = ["BLOCK_MODELS", "GRIDS", "POLICIES", "RULES", "STRATEGY_NAMES", "SWEEP", "Strategy", "caches",
           "factorial", "factors", "resolve", "sweep", "table1"]
