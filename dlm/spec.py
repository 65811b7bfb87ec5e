"""One sampler spec and one entry: ``generate(model, input_ids, attention_mask, sampler)``.

A :class:`Sampler` names a registered cache policy, commit rule and model family
(:mod:`dlm.registry`), the lengths, and ``options``: every registered parameter set away from its
default (``threshold``, ``refresh_every``, ``temperature``, ...). Which component an option
belongs to is read from the registry, so a new method's parameters are sampler options without
any change here.

The *family* says whose block rules and proposal a model gets (:class:`Family`): ``llada``
(:mod:`dlm.llada`: the rule as registered, LLaDA's proposal) or ``dream`` (Fast-dLLM's Dream block
rules and Dream's proposal, :mod:`fastdllm.dream`). ``family="auto"`` reads it once from the
model's config (:meth:`Family.matches`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from . import registry
from .compiled import compiled
from .sample import Callback, GenerateOutput, denoise
from .validate import check_blocks, prepare_batch

SPEC_FIELDS = ("name", "policy", "rule", "family", "gen_length", "block_length", "steps", "stop_at_eos")


class Family:
    """Base of the registered model families: ``matches(config)`` (for ``family="auto"``) and
    ``compose(rule, options, steps_per_block, policy)`` -> (commit rule, proposal, the policy's
    derived ``at_block``). The default composition builds the rule and its proposal as registered."""

    proposal = "llada"  # the family's proposal unless the rule names its own

    @classmethod
    def matches(cls, config) -> bool:
        return False

    def proposal_of(self, rule_cls, policy_cls) -> str:
        return getattr(rule_cls, "proposal", None) or self.proposal

    def compose(self, rule: str, options: dict, steps_per_block: int, policy_cls):
        rule_cls = registry.get("rule", rule)
        proposal = self.proposal_of(rule_cls, policy_cls)
        return (registry.build("rule", rule, _own(rule_cls, options), {"steps_per_block": steps_per_block}),
                registry.build("proposal", proposal, _own(registry.get("proposal", proposal), options)), False)


def _own(cls, options: dict) -> dict:
    names = {p.name for p in registry.user_params(cls)}
    return {k: v for k, v in options.items() if k in names}


def resolve_family(family: str, config) -> str:
    """``family`` with ``"auto"`` decided by the registered families' ``matches(config)``."""
    if family != "auto":
        return family
    found = [name for name in registry.names("family") if registry.get("family", name).matches(config)]
    return found[0] if found else "llada"


@dataclass(frozen=True)
class Sampler:
    """One sampler configuration (a row of a results table).

    block_length None: one block of ``gen_length`` (full-sequence diffusion); a block-diffusion
    policy needs the model's block size. steps: total denoising steps of the scheduled rules
    (default ``gen_length``), split evenly over the blocks. options: ``{parameter: value}`` or pairs,
    each a parameter of the policy, the rule, a proposal or the family
    (:func:`dlm.registry.every_param`), stored sorted without those at their default however the
    sampler is built; build with :meth:`of`, change with :meth:`with_`.
    """

    name: str = "baseline"
    policy: str = "none"
    rule: str = "topk"
    family: str = "auto"
    gen_length: int = 256
    block_length: Optional[int] = 32
    steps: Optional[int] = None
    stop_at_eos: bool = False
    options: tuple = ()

    @classmethod
    def of(cls, name: str = "baseline", **values) -> "Sampler":
        """A sampler from spec fields and options alike
        (``Sampler.of("x", policy="dual", rule="threshold", threshold=0.95)``)."""
        return cls(name).with_(**values)

    def with_(self, **values) -> "Sampler":
        """A copy with spec fields and options changed; an option set to None or to its default is dropped."""
        spec = {k: values.pop(k) for k in list(values) if k in SPEC_FIELDS}
        return Sampler(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **spec,
                          "options": {**dict(self.options), **values}})

    def _normalized(self) -> tuple:
        """``options`` as recorded: sorted pairs, without those unset (None) or at their own
        components' default, so one computation has one spec however it was built."""
        options = dict(self.options)
        every = registry.every_param()
        mine = self._owners(self.policy, self.rule)
        for k, v in list(options.items()):
            if k not in every:
                raise ValueError(f"{k!r} is no registered option (options: {', '.join(sorted(every))})")
            holders = [p for kind, name, p in every[k] if (kind, name) in mine]
            if v is None or (holders and all(v == p.default and type(v) is type(p.default) for p in holders)):
                del options[k]  # (an option of no component of this sampler is kept, and refused when built)
        return tuple(sorted(options.items()))

    @staticmethod
    def _owners(policy: str, rule: str) -> set[tuple[str, str]]:
        """(kind, name) of every component a sampler of ``policy`` and ``rule`` may build."""
        return ({("policy", policy), ("rule", rule)} | {("proposal", n) for n in registry.names("proposal")}
                | {("family", n) for n in registry.names("family")})

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    def for_block_model(self, block_size: int, align: str) -> "Sampler":
        """This sampler on a block-diffusion model of ``block_size`` and ``align`` (a block-model
        policy's block length is the model's block size; other samplers are returned unchanged)."""
        if not registry.get("policy", self.policy).block_model:
            return self
        return self.with_(block_length=block_size, align=align)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name or "." in self.name:
            raise ValueError(f"sampler name must be a non-empty str without '/' or '.', got {self.name!r}")
        try:
            object.__setattr__(self, "options", self._normalized())
            self._validate()
        except (TypeError, ValueError) as e:
            raise type(e)(f"sampler {self.name}: {e}") from None

    def _validate(self) -> None:
        policy = registry.get("policy", self.policy)
        registry.get("rule", self.rule)
        if self.family != "auto":
            registry.get("family", self.family)
        if not isinstance(self.stop_at_eos, bool):
            raise TypeError("stop_at_eos must be a bool")
        if self.block_length is None and policy.block_model:
            raise ValueError(f"policy {self.policy!r} needs the model's block size as block_length")
        check_blocks(self.gen_length, self.block, self.total_steps)
        for family in registry.names("family") if self.family == "auto" else (self.family,):
            self.components(family)  # every option lands on a component and is checked there
        policy.check(self.block_length, self.rule)

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

    def components(self, family: str):
        """(cache policy, commit rule, proposal) under ``family`` (a registered name, not auto)."""
        options = dict(self.options)
        policy_cls = registry.get("policy", self.policy)
        fam_cls = registry.get("family", family)
        fam = registry.build("family", family, _own(fam_cls, options))
        rule, proposal, at_block = fam.compose(self.rule, options, self.steps_per_block, policy_cls)
        used = {p.name for c in (policy_cls, fam_cls, type(proposal), registry.get("rule", self.rule))
                for p in registry.user_params(c)}
        for key in options:
            if key not in used:
                owners = ", ".join(f"{kind} {name!r}" for kind, name, _ in registry.every_param().get(key, ()))
                raise ValueError(f"{key} is not an option of policy {self.policy!r}, rule {self.rule!r}, proposal "
                                 f"{type(proposal).name!r} or family {family!r} (it is one of {owners})")
        policy = registry.build("policy", self.policy, _own(policy_cls, options),
                                {"block_length": self.block, "at_block": at_block})
        return policy, rule, proposal

    def as_dict(self) -> dict:
        """The spec as recorded with every sample (its fields and options)."""
        out = {k: v for k, v in asdict(self).items() if k != "options"}
        return {**out, **dict(self.options)}

    def resolved(self, family: str) -> dict:
        """What runs under ``family``: each component's class and every field, defaults included
        (a config hash over it changes when a method's default does)."""
        return dict(zip(("policy", "rule", "proposal"), map(describe, self.components(family))))


def describe(component) -> dict:
    """``{"class": name, field: value, ...}`` of a (nested) dataclass component."""
    out = {"class": type(component).__qualname__}
    for f in fields(component):
        v = getattr(component, f.name)
        out[f.name] = describe(v) if is_dataclass(v) else v
    return out


@torch.no_grad()
def generate(model, input_ids: Tensor, attention_mask: Optional[Tensor], sampler: Sampler, *,
             generator: Optional[torch.Generator] = None, callback: Optional[Callback] = None,
             backend: str = "sdpa", mask_id: Optional[int] = None, compile: bool = False,
             timed: bool = False) -> GenerateOutput:
    """Decode ``sampler.gen_length`` columns after the left-padded prompts ``input_ids`` (B, P)
    with the one loop; the family is read once from ``model.config`` when ``sampler.family`` is auto.
    ``compile``: the forward under ``torch.compile`` (:mod:`dlm.compiled`; same tokens); ``timed``:
    synchronised forward timings in ``stats`` (:func:`dlm.sample.denoise`)."""
    if not isinstance(sampler, Sampler):
        raise TypeError(f"sampler must be a dlm.spec.Sampler, got {type(sampler).__name__}")
    if not isinstance(compile, bool):
        raise TypeError(f"compile must be a bool, got {type(compile).__name__}")
    batch = prepare_batch(model, input_ids, attention_mask, sampler.gen_length, mask_id)  # before any compute
    model = compiled(model) if compile else model
    policy, rule, proposal = sampler.components(resolve_family(sampler.family, model.config))
    blocks = policy.layout(batch.prompt_len, sampler.gen_length, sampler.block, attention_mask)
    return denoise(model, batch, blocks, policy, rule, proposal, stop_at_eos=sampler.stop_at_eos,
                   generator=generator, backend=backend, callback=callback, timed=timed)
