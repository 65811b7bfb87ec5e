"""Batched accuracy of a sampler on GSM8K-format problems (left padding, shared extraction)."""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import torch

from ..sampling import eos_ids
from ..stats import tail_before_answer
from .gsm8k import Problem, extract_strict, is_correct
from .sft_data import encode_prompt


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) ids and 0/1 attention mask, padded on the left."""
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, P - len(r):] = 1
    return ids, mask


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


@torch.no_grad()
def evaluate_problems(model, tokenizer, problems: Sequence[Problem], sampler: Callable,
                      batch_size: int = 64, shots: Sequence[Problem] = (), mode: str = "strict",
                      **sampler_kwargs) -> dict:
    """Run ``sampler(model, ids, attention_mask=..., **kw)`` over ``problems``.

    Returns {"accuracy", "ci", "n", "records"}; each record has id, prediction, extracted
    answer, correct, tokens_until_eos, first_eos_step, tail_before_answer
    (:func:`dlm.stats.tail_before_answer`; None without an EOS tail) and the call's nfe/seconds.
    """
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    records = []
    for lo in range(0, len(problems), batch_size):
        chunk = problems[lo:lo + batch_size]
        ids, mask = left_pad([encode_prompt(tokenizer, p.question, shots) for p in chunk], pad_id)
        out = sampler(model, ids.to(device), attention_mask=mask.to(device), **sampler_kwargs)
        P = ids.shape[1]
        tails = tail_before_answer(out.sequences[:, P:], out.commit_step, model.config.eos_token_id).tolist()
        for i, p in enumerate(chunk):
            text = decode_until_stop(tokenizer, out.sequences[i, P:].tolist(), eos_ids(model))
            records.append({
                "id": p.id, "prediction": text, "extracted": extract_strict(text),
                "target": p.target_str, "correct": bool(is_correct(text, p.target, mode=mode)),
                "prompt_length": int(mask[i].sum()),
                "tokens_until_eos": int(out.stats.tokens_until_eos[i]),
                "first_eos_step": int(out.stats.first_eos_step[i]) if out.stats.first_eos_step is not None else -1,
                "tail_before_answer": None if math.isnan(tails[i]) else round(tails[i], 4),
                "nfe": out.stats.nfe, "seconds": out.stats.seconds / len(chunk),
            })
    k = sum(r["correct"] for r in records)
    return {"accuracy": k / max(len(records), 1), "ci": wilson_ci(k, len(records)), "n": len(records),
            "records": records}
