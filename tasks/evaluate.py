"""Evaluation helpers shared by the entry points: left padding (and batches of similar prompt
lengths, with the padding they waste), decoding up to the first stop id,
the Wilson interval and the exact McNemar test (the evaluation loop is ``harness.evaluate``)."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) ids and 0/1 attention mask, padded on the left."""
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, P - len(r):] = 1
    return ids, mask


def length_batches(lengths: Sequence[int], batch_size: int, sort: bool = True) -> list[list[int]]:
    """Indices into ``lengths`` grouped into batches of ``batch_size``: longest prompts first
    (stable) when ``sort``, so a left-padded batch holds prompts of similar length; else in order."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i]) if sort else list(range(len(lengths)))
    return [order[lo:lo + batch_size] for lo in range(0, len(order), batch_size)]


def padding_waste(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Share of the prompt columns of left-padded ``batches`` that are padding:
    1 - sum of lengths / sum over batches of (rows x longest prompt)."""
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    return 1.0 - sum(lengths[i] for b in batches for i in b) / padded if padded else 0.0


def decode_until_stop(tokenizer, ids: list[int], stop_ids: Iterable[int]) -> str:
    """Text of generated ``ids`` up to (excluding) the first stop id, special tokens skipped."""
    stops = set(stop_ids)
    cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
    return tokenizer.decode(ids[:cut], skip_special_tokens=True)


def wilson_ci(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion."""
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (centre - half, centre + half)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for paired binary outcomes.

    ``b`` and ``c`` count the discordant pairs (solved only by A / only by B). Under H0 each
    discordant pair goes either way with probability 1/2, so the p-value is
    ``min(1, 2 * P[Binomial(b + c, 1/2) <= min(b, c)])``.
    """
    for name, v in (("b", b), ("c", c)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)
