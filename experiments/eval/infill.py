"""The reversal task's infilling probe: one line of a test poem's recitation masked, the model fills
it. It tells "knows the poem" from "knows the question": a model that fills the lines but fails the
``After:`` / ``Before:`` questions memorised the poems and not the question format.

The row is the training layout: ``"Recite poem p:"``, the recitation in the task's format
(:func:`tasks.reversal.recitation_pieces`), EOS padding to ``length`` answer columns. A diffusion
model fills the line from both sides, the most confident masked position first, one token per
step (the ``pure`` decoder restricted to the line); an AR model fills it greedily left to right
from the lines before it (under its causal mask it cannot read the lines after). Correct when the
filled line is the poem's (:func:`tasks.reversal.check`); ``nll`` is the line's mean cross-entropy
in nats per token, the whole line masked (diffusion) or teacher-forced (AR).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlm.attention import causal_mask
from tasks import reversal
from tasks.pairs import Pair


def infill_row(tok, pair: Pair, poems, version: str, length: int) -> tuple[list[int], int, int]:
    """The ids of ``pair``'s full row and the span ``[a, b)`` of its line."""
    p, j = pair.meta
    prompt = tok.encode(pair.prompt, add_special_tokens=False)
    pieces = [tok.encode(x, add_special_tokens=False) for x in reversal.recitation_pieces(poems[p], version)]
    answer = [t for piece in pieces for t in piece]
    a = len(prompt) + sum(len(piece) for piece in pieces[:2 * j])
    return prompt + answer + [tok.eos_token_id] * max(length - len(answer), 1), a, a + len(pieces[2 * j])


def _logits(model, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, L, V) logits, logit ``i`` predicting token ``i`` (from tokens ``< i`` when ``causal``)."""
    if not causal:
        return model(x)
    L = x.shape[1]
    logits = model(x, attn_mask=causal_mask(torch.arange(L, device=x.device), L))
    if not model.config.shift_logits:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits


@torch.no_grad()
def fill(model, tok, pairs: list[Pair], poems, version: str, causal: bool, length: int) -> list[dict]:
    """Per pair ``{"prediction": the filled line, "nll": its mean CE, "nfe": forwards}``, in order.
    Rows of one length go through the model together (no padding)."""
    rows = [infill_row(tok, p, poems, version, length) for p in pairs]
    groups: dict[int, list[int]] = {}
    for i, (ids, _, _) in enumerate(rows):
        groups.setdefault(len(ids), []).append(i)
    out: list[dict] = [{}] * len(pairs)
    for idx in groups.values():
        target = torch.tensor([rows[i][0] for i in idx])  # (B, L)
        spans = [rows[i][1:] for i in idx]
        hole = torch.zeros_like(target, dtype=torch.bool)  # (B, L)
        for k, (a, b) in enumerate(spans):
            hole[k, a:b] = True
        x = target.masked_fill(hole, model.config.mask_token_id) if not causal else target.clone()
        first = _logits(model, target if causal else x, causal)  # teacher-forced (AR) / all masked
        ce = F.cross_entropy(first.float().transpose(1, 2), target, reduction="none")  # (B, L)
        nll = (ce * hole).sum(1) / hole.sum(1)  # (B,)
        steps = max(b - a for a, b in spans)
        if causal:
            for t in range(steps):
                logits = _logits(model, x, True)
                for k, (a, b) in enumerate(spans):
                    if a + t < b:
                        x[k, a + t] = logits[k, a + t].argmax()
        else:
            todo = hole.clone()
            for _ in range(steps):
                conf, pred = _logits(model, x, False).float().softmax(-1).max(-1)  # (B, L)
                pos = conf.masked_fill(~todo, -1.0).argmax(1)  # (B,)
                rows_left = todo.any(1).nonzero().squeeze(1)
                x[rows_left, pos[rows_left]] = pred[rows_left, pos[rows_left]]
                todo[rows_left, pos[rows_left]] = False
        for k, i in enumerate(idx):
            a, b = spans[k]
            out[i] = {"prediction": tok.decode(x[k, a:b].tolist()).strip(), "nll": float(nll[k]), "nfe": steps}
    return out
