"""Named sampling strategies and the ONE function that turns a strategy into a sampler call.

A :class:`Strategy` says *which* sampler runs and with which switches (cache policy, parallel
commit rule, semi-AR blocks or one block, early stop at EOS); :class:`Settings` holds the numbers
shared by every strategy of a run (``gen_length``, ``block_length``, ``steps``, ``threshold``,
``factor``, ``temperature``). :func:`build_call` combines the two into a :class:`SamplerCall`:

==========  ===============================  =====================================================
kind        sampler                           kwargs built from the strategy + settings
==========  ===============================  =====================================================
baseline    :func:`dlm.sampling.generate`     gen_length, steps, block_length (gen_length for the
                                              full-sequence baseline), temperature
fastdllm    :func:`fastdllm.generate`         gen_length, block_length, steps, cache, threshold /
                                              factor, stop_at_eos, temperature
bd3lm       :func:`bd3lm.sample`              block_size (the model's), gen_length,
                                              steps_per_block = steps * block_size / gen_length,
                                              align (the model's), stop_at_eos, temperature
==========  ===============================  =====================================================

Grids (``GRIDS``): ``table1`` is the Fast-dLLM Table 1 line-up (+ BD3-LM); ``factorial`` is the
full cache x parallel decoding x stop_at_eos x block size design (24 ``fastdllm`` cells; the cell
without cache, rule or stop is exactly the semi-AR / full baseline) used for the ablation.
"""

from __future__ import annotations

import itertools
import numbers
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from torch import Tensor

from dlm.sampling import check_blocks

KINDS = ("baseline", "fastdllm", "bd3lm")
CACHES = (None, "prefix", "dual")
PARALLEL = (None, "threshold", "factor")


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Settings:
    """Numbers shared by every strategy of one run. ``steps`` defaults to ``gen_length``
    (one token per step for the top-k schedule); the parallel rules ignore it."""

    gen_length: int = 256
    block_length: int = 32
    steps: Optional[int] = None
    threshold: float = 0.9
    factor: float = 1.0
    temperature: float = 0.0

    def __post_init__(self) -> None:
        _positive_int("gen_length", self.gen_length)
        _positive_int("block_length", self.block_length)
        if self.steps is not None:
            _positive_int("steps", self.steps)
        if not 0.0 < _real("threshold", self.threshold) <= 1.0:
            raise ValueError(f"threshold must lie in (0, 1], got {self.threshold!r}")
        if not _real("factor", self.factor) > 0.0:
            raise ValueError(f"factor must be > 0, got {self.factor!r}")
        if _real("temperature", self.temperature) < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")

    @property
    def total_steps(self) -> int:
        return self.gen_length if self.steps is None else self.steps


@dataclass(frozen=True)
class Strategy:
    """One row of the results table.

    kind: which sampler (``KINDS``); cache: Fast-dLLM cache policy; parallel: Fast-dLLM commit
    rule (``None`` = LLaDA's top-k schedule); semi_ar: blocks of ``block_length`` (False: one
    block of ``gen_length``, the full-sequence baseline); stop_at_eos: skip the blocks after
    every row has an EOS (fastdllm, bd3lm).
    """

    name: str
    kind: str
    cache: Optional[str] = None
    parallel: Optional[str] = None
    semi_ar: bool = True
    stop_at_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name or "." in self.name:
            raise ValueError(f"strategy name must be a non-empty str without '/' or '.', got {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"strategy {self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.cache not in CACHES:
            raise ValueError(f"strategy {self.name}: cache must be one of {CACHES}, got {self.cache!r}")
        if self.parallel not in PARALLEL:
            raise ValueError(f"strategy {self.name}: parallel must be one of {PARALLEL}, got {self.parallel!r}")
        if self.kind != "fastdllm" and (self.cache is not None or self.parallel is not None):
            raise ValueError(f"strategy {self.name}: cache / parallel need kind='fastdllm'")
        if self.kind == "baseline" and self.stop_at_eos:
            raise ValueError(f"strategy {self.name}: the baseline sampler has no stop_at_eos")
        if self.kind == "bd3lm" and not self.semi_ar:
            raise ValueError(f"strategy {self.name}: bd3lm always decodes blocks of the model's block size")

    def block_length(self, settings: Settings) -> int:
        """Effective decoding block (the model's block size for bd3lm is not known here)."""
        return settings.block_length if self.semi_ar else settings.gen_length

    def factors(self, settings: Settings, block_size: Optional[int] = None) -> dict:
        """Factor levels recorded with every sample (the ablation reads them back)."""
        block = block_size if self.kind == "bd3lm" else self.block_length(settings)
        return {"kind": self.kind, "cache": self.cache or "none", "parallel": self.parallel or "none",
                "stop_at_eos": self.stop_at_eos, "block_length": block}


def _table1() -> tuple[Strategy, ...]:
    fd = "fastdllm"
    return (
        Strategy("baseline_full", "baseline", semi_ar=False),
        Strategy("baseline_semiar", "baseline"),
        Strategy("fastdllm_prefix", fd, cache="prefix"),
        Strategy("fastdllm_dual", fd, cache="dual"),
        Strategy("fastdllm_threshold", fd, parallel="threshold"),
        Strategy("fastdllm_factor", fd, parallel="factor"),
        Strategy("fastdllm_prefix_threshold", fd, cache="prefix", parallel="threshold"),
        Strategy("fastdllm_dual_threshold", fd, cache="dual", parallel="threshold"),
        Strategy("bd3lm", "bd3lm", stop_at_eos=True),
    )


def _factorial() -> tuple[Strategy, ...]:
    cells = []
    for cache, rule, stop, semi in itertools.product(CACHES, (None, "threshold"), (False, True), (True, False)):
        name = f"abl_{cache or 'nocache'}_{rule or 'topk'}_{'eos' if stop else 'noeos'}_{'semiar' if semi else 'full'}"
        cells.append(Strategy(name, "fastdllm", cache=cache, parallel=rule, semi_ar=semi, stop_at_eos=stop))
    return tuple(cells)


GRIDS: dict[str, tuple[Strategy, ...]] = {"table1": _table1(), "factorial": _factorial()}
STRATEGIES: dict[str, Strategy] = {s.name: s for grid in GRIDS.values() for s in grid}


def resolve(names: Sequence[str]) -> list[Strategy]:
    """Strategy or grid names -> strategies (grid order, duplicates dropped)."""
    if isinstance(names, str) or not names:
        raise ValueError("strategies must be a non-empty list of strategy or grid names")
    out: dict[str, Strategy] = {}
    for name in names:
        if name in GRIDS:
            out.update((s.name, s) for s in GRIDS[name])
        elif name in STRATEGIES:
            out[name] = STRATEGIES[name]
        else:
            raise ValueError(f"strategies: unknown name {name!r}; grids: {sorted(GRIDS)}; "
                             f"strategies: {sorted(STRATEGIES)}")
    return list(out.values())


@dataclass(frozen=True)
class SamplerCall:
    """``fn(model, input_ids, attention_mask, generator=..., **kwargs) -> GenerateOutput``."""

    fn: Callable
    kwargs: dict = field(default_factory=dict)

    def __call__(self, model, input_ids: Tensor, attention_mask: Optional[Tensor], generator):
        return self.fn(model, input_ids, attention_mask, generator=generator, **self.kwargs)


def build_call(strategy: Strategy, settings: Settings, bd3=None) -> SamplerCall:
    """The one place where a strategy's switches become sampler keyword arguments.

    bd3: the :class:`bd3lm.BD3Config` (block size, alignment) of the BD3-LM model; required for
    ``kind='bd3lm'``. Raises ValueError naming the offending argument before any compute.
    """
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a Strategy, got {type(strategy).__name__}")
    if not isinstance(settings, Settings):
        raise TypeError(f"settings must be a Settings, got {type(settings).__name__}")
    G, steps = settings.gen_length, settings.total_steps
    if strategy.kind == "bd3lm":
        if bd3 is None:
            raise ValueError(f"strategy {strategy.name}: needs a BD3-LM model (bd3 config)")
        L = bd3.block_size
        if G % L:
            raise ValueError(f"gen_length={G} must be a multiple of the BD3-LM block size {L}")
        if (steps * L) % G:
            raise ValueError(f"steps={steps} must be a multiple of the number of BD3-LM blocks ({G // L})")
        from bd3lm import sample

        return SamplerCall(sample, dict(block_size=L, gen_length=G, steps_per_block=steps * L // G,
                                        temperature=settings.temperature, stop_at_eos=strategy.stop_at_eos,
                                        align=bd3.align, mode="topk"))
    block = strategy.block_length(settings)
    try:
        check_blocks(G, block, steps)
    except (TypeError, ValueError) as e:
        raise ValueError(f"strategy {strategy.name}: gen_length / block_length / steps: {e}") from None
    if strategy.kind == "baseline":
        from dlm.sampling import generate

        return SamplerCall(generate, dict(gen_length=G, steps=steps, block_length=block,
                                          temperature=settings.temperature, remasking="low_confidence"))
    import fastdllm

    return SamplerCall(fastdllm.generate, dict(
        gen_length=G, block_length=block, steps=steps, cache=strategy.cache,
        threshold=settings.threshold if strategy.parallel == "threshold" else None,
        factor=settings.factor if strategy.parallel == "factor" else None,
        temperature=settings.temperature, remasking="low_confidence", stop_at_eos=strategy.stop_at_eos))
