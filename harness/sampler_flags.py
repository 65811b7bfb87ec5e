"""The sampler's command-line flags and lm-eval ``model_args``, generated from the registry.

``--policy`` / ``--rule`` / ``--family`` list the registered names; every registered parameter is
one flag (``--threshold``, ``--refresh-every``, ``--top-k``, ...) whose help names the methods it
belongs to. A new method's parameters become flags here without any change to this module.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Mapping, Optional

from dlm import registry
from dlm.spec import SPEC_FIELDS, Sampler

DEFAULT_BLOCK = 32


def _owners(entries) -> str:
    return ", ".join(f"{kind} {name}" for kind, name, _ in entries)


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def option_listing() -> str:
    """Every registered option: its flag, the methods it belongs to, their defaults and its help."""
    lines = ["options of the registered methods (dlm.registry); a flag sets it for the methods that have it:"]
    for name, entries in sorted(registry.every_param(("rule", "policy", "proposal", "family")).items()):
        prm = entries[0][2]
        defaults = ", ".join(sorted({f"{p.default!r}" for _, _, p in entries}))
        choices = f" {{{','.join(map(str, prm.choices))}}}" if prm.choices else ""
        lines += [f"{prm.flag}{choices}  ({_owners(entries)}; default {defaults})", f"    {prm.help}"]
    return "\n".join(lines)


def add_sampler_args(p: argparse.ArgumentParser, gen_length: int = 64) -> None:
    """``--policy --rule --family --gen-length --block-length --steps --stop-at-eos`` and one flag per
    registered option (default: unset, the method's own default), named in the help and described
    by ``--list-options`` (so the help stays short however many methods register)."""
    every = registry.every_param(("rule", "policy", "proposal", "family"))
    g = p.add_argument_group(
        "sampler", "every name and option from the registry (dlm.registry); option flags: "
        + " ".join(prm.flag for prm in (entries[0][2] for _, entries in sorted(every.items())))
        + " (--list-options describes them)")
    g.add_argument("--policy", default="none", choices=registry.names("policy"), help="cache policy (default none)")
    g.add_argument("--rule", default=None, choices=registry.names("rule"),
                   help="commit rule (default: the one rule whose options are given, else topk)")
    g.add_argument("--family", default="auto", choices=("auto", *registry.names("family")),
                   help="whose block rules and proposal run (auto: read from the model's config)")
    g.add_argument("--gen-length", type=int, default=gen_length, metavar="G", help=f"answer tokens (default {gen_length})")
    g.add_argument("--block-length", type=int, default=None, metavar="L",
                   help=f"block length (default {DEFAULT_BLOCK}; a block-model policy: the model's block size)")
    g.add_argument("--steps", type=int, default=None, metavar="S", help="steps of the scheduled rules in all (default G)")
    g.add_argument("--stop-at-eos", action="store_true", help="stop after the block that holds EOS")
    g.add_argument("--list-options", action=_ListOptions, help="describe every option flag and exit")
    for name, entries in sorted(every.items()):
        prm = entries[0][2]
        kind = {bool: _bool, int: int, float: float, str: str}[prm.type]
        g.add_argument(prm.flag, dest=f"opt_{name}", type=kind, default=None, choices=prm.choices,
                       help=argparse.SUPPRESS)


class _ListOptions(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(option_listing())
        parser.exit()


def as_flags(message: str) -> str:
    """A sampler's error with its field and option names as this command's flags
    (``gen_length must be`` -> ``--gen-length must be``)."""
    names = set(SPEC_FIELDS[1:]) | set(registry.every_param())
    return re.sub(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b(?= must| \(an option|=| is not)",
                  lambda m: "--" + m[1].replace("_", "-"), message)


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The registered parameters given on the command line."""
    return {k[len("opt_"):]: v for k, v in vars(args).items() if k.startswith("opt_") and v is not None}


def default_rule(options: Mapping[str, Any]) -> str:
    """The one rule whose parameters are among ``options``, else ``topk``."""
    owners = {name for name in registry.names("rule")
              if any(p.name in options for p in registry.user_params(registry.get("rule", name)))}
    return owners.pop() if len(owners) == 1 else "topk"


def sampler_from_args(args: argparse.Namespace, name: Optional[str] = None,
                      block_model: Optional[tuple[int, str]] = None) -> Sampler:
    """The :class:`Sampler` of the flags; ``block_model``: a block-diffusion model's ``(block_size, align)``."""
    options = given_options(args)
    rule = args.rule or default_rule(options)
    policy = registry.get("policy", args.policy)
    block = args.block_length
    if policy.block_model:
        size, align = block_model or (block or DEFAULT_BLOCK, options.get("align", "prompt"))
        if block is not None and block != size:
            raise ValueError(f"--block-length {block} differs from the model's block size {size} "
                             "(omit it: the block size comes from the model)")
        block, options = size, {**options, "align": align}
    name = name or f"{args.policy}_{rule}"
    return Sampler.of(name, policy=args.policy, rule=rule, family=args.family, gen_length=args.gen_length,
                      block_length=block or DEFAULT_BLOCK, steps=args.steps, stop_at_eos=args.stop_at_eos, **options)


def sampler_from_model_args(name: str, model_args: Mapping[str, Any]) -> Sampler:
    """The :class:`Sampler` of lm-eval ``model_args`` (spec fields and registered parameters; the
    rule defaults as on the command line); an unknown key raises naming it."""
    every = registry.every_param()
    for key in model_args:
        if key not in SPEC_FIELDS and key not in every:
            raise ValueError(f"--model_args {key}=: not a sampler field ({', '.join(SPEC_FIELDS[1:])}) or a "
                             f"registered option ({', '.join(sorted(every))})")
    values = dict(model_args)
    options = {k: v for k, v in values.items() if k not in SPEC_FIELDS}
    values.setdefault("rule", default_rule(options))
    return Sampler.of(name, **values)
