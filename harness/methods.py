"""The methods table of the README: every registered cache policy, commit rule, proposal and model
family (:mod:`dlm.registry`) with its module, its options and their defaults, and the first
sentence of its docstring. Generated, so a new method is listed by registering."""

from __future__ import annotations

import re

from dlm import registry

KIND_TITLES = {"policy": "cache policy", "rule": "commit rule", "proposal": "proposal", "family": "model family"}


def summary(cls) -> str:
    """The first sentence of ``cls``'s docstring on one line, its reST roles as code spans."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", " ".join((cls.__doc__ or "").split())).replace("``", "`")
    end = re.search(r"(?<!Fig)(?<!eq)(?<!Alg)\.(\s|$)", text)
    return text if end is None else text[:end.start() + 1]


def methods_table() -> list[str]:
    """Markdown lines: one row per registered method, by kind."""
    lines = ["| kind | name | module | options (default) | what it is |", "|---|---|---|---|---|"]
    for kind, title in KIND_TITLES.items():
        for name in registry.names(kind):
            cls = registry.get(kind, name)
            options = ", ".join(f"`{p.name}`={p.default!r}" for p in registry.user_params(cls)) or "-"
            lines.append(f"| {title} | `{name}` | `{cls.__module__}` | {options} | {summary(cls)} |")
    return lines
