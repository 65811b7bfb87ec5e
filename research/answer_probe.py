"""What an any-order task model has learned of the answer: teacher-forced cross-entropy and argmax
accuracy on the answer's own tokens, the EOS padding left out.

    python -m research.answer_probe --task countdown --models ar=results/checkpoints/anyorder-countdown20k-ar \\
        diffusion=results/checkpoints/anyorder-countdown20k-diffusion --n 100 --out /tmp/probe.json

On ``--n`` held-out pairs of the task (:func:`tasks.anyorder.heldout`, the
items the learning curves score), laid out as in training (prompt, answer, EOS padding to the
task's response length: :class:`tasks.pairs.PairBatches` without a tail):

- an AR model (``objective`` ``ar`` in its config): next-token cross-entropy on every answer token
  given the tokens before it (causal mask; the logit of column ``i`` from hidden state ``i - 1``
  in either layout), the quantity ``ARSFTLoss`` logs as ``answer_loss``;
- a diffusion model, per ``--ratios`` r: round(r x R) of the R response columns masked per row
  (uniformly, seeded; LLaDA's SFT corruption at t = r, Nie et al. 2025, Eq. 5) and one bidirectional
  forward; the cross-entropy and argmax accuracy of the masked answer tokens (EOS padding left out).

``exact``: rows whose scored tokens all equal the reference's (a task with many right answers,
Countdown, has more right rows than this counts). Writes ``--out`` (JSON) and the same table as
Markdown beside it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from dlm.attention import causal_mask
from dlm.checkpoints import load_model
from dlm.io import stable_json
from harness.cli import check_out, markdown_table, run_main, set_threads
from harness.results import atomic_write_text, git_sha
from tasks.anyorder import RESPONSE_LEN, TASKS, heldout
from tasks.pairs import Epochs, PairBatches


def objective_of(path: str) -> str:
    """``ar`` or ``diffusion``, from a train_anyorder checkpoint's recorded flags."""
    extra = json.loads((Path(path) / "config.json").read_text()).get("extra", {})
    objective = extra.get("args", {}).get("objective")
    if objective not in ("ar", "diffusion"):
        raise ValueError(f"{path}/config.json: no extra.args.objective (not an experiments.train.train_anyorder model)")
    return objective


@torch.no_grad()
def probe(model, batch: dict, objective: str, ratio: float, seed: int = 0) -> dict:
    """Cross-entropy (nats per scored token) and argmax accuracy of one batch's answer tokens, and
    the share of rows with every scored token right; see the module docstring."""
    ids, P = batch["input_ids"], batch["prompt_lengths"]  # (B, L), (B,)
    B, L = ids.shape
    cfg = model.config
    cols = torch.arange(L)[None, :]  # (1, L)
    response = cols >= P[:, None]  # (B, L)
    first_eos = torch.where((ids == cfg.eos_token_id) & response, cols, L).amin(1, keepdim=True)  # (B, 1)
    answer = response & (cols < first_eos)  # (B, L) the answer's own tokens
    if objective == "ar":
        logits = model(ids, attn_mask=causal_mask(torch.arange(L), L))  # (B, L, V)
        if not cfg.shift_logits:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # logit i from hidden state i - 1
        scored = answer
    else:
        g = torch.Generator().manual_seed(seed)
        rank = torch.rand(B, L, generator=g).masked_fill(~response, 2.0).argsort(1).argsort(1)  # (B, L)
        n_masked = (ratio * response.sum(1, keepdim=True)).round().long()  # (B, 1)
        masked = rank < n_masked
        logits = model(ids.masked_fill(masked, cfg.mask_token_id))
        scored = masked & answer
    ce = F.cross_entropy(logits[scored].float(), ids[scored], reduction="none")  # (N,)
    right = logits[scored].argmax(-1) == ids[scored]  # (N,)
    row = torch.arange(B)[:, None].expand(B, L)[scored]  # (N,) the row of each scored token
    wrong_rows = torch.zeros(B, dtype=torch.bool).index_fill_(0, row[~right], True)
    has = torch.zeros(B, dtype=torch.bool).index_fill_(0, row, True)
    return {"ratio": ratio, "tokens": int(scored.sum()), "ce": float(ce.mean()), "accuracy": float(right.float().mean()),
            "exact": float((has & ~wrong_rows).sum() / has.sum().clamp(min=1)), "rows": int(has.sum())}


def rows_of(tok, task: str, n: int) -> dict:
    """The held-out pairs as one training-layout batch (no EOS tail)."""
    pairs = heldout(task, n)["accuracy"]
    return PairBatches(tok, Epochs(tuple(pairs)), len(pairs), RESPONSE_LEN[task])(0, torch.Generator().manual_seed(0))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="research.answer_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True, choices=sorted(TASKS))
    p.add_argument("--models", nargs="+", required=True, metavar="NAME=DIR", help="train_anyorder checkpoints")
    p.add_argument("--n", type=int, default=100, help="held-out pairs (default 100)")
    p.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.5, 0.15], metavar="R",
                   help="mask ratios for diffusion models, in (0, 1] (default 1.0 0.5 0.15)")
    p.add_argument("--seed", type=int, default=0, help="the masks' seed (default 0)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    p.add_argument("--out", required=True, metavar="FILE.json", help="writes FILE.json and FILE.md")
    a = p.parse_args(argv)
    if a.n < 1 or any(not 0 < r <= 1 for r in a.ratios):
        raise ValueError(f"--n must be >= 1 and every --ratios value in (0, 1], got {a.n} and {a.ratios}")
    models = dict(m.split("=", 1) if "=" in m else (None, m) for m in a.models)
    if None in models or not all(Path(d).is_dir() for d in models.values()):
        raise ValueError(f"--models: each NAME=DIR with DIR a checkpoint directory, got {a.models}")
    objectives = {name: objective_of(d) for name, d in models.items()}  # before any compute
    out = check_out("--out", a.out, kind="file")
    set_threads(a.threads)
    results = []
    for name, path in models.items():
        model, tok = load_model(path, dtype=torch.float32)
        model.eval()
        batch = rows_of(tok, a.task, a.n)
        for ratio in ([None] if objectives[name] == "ar" else a.ratios):
            results.append({"model": name, "path": path, "objective": objectives[name],
                            **probe(model, batch, objectives[name], ratio, a.seed)})
    body = [[r["model"], r["objective"], "teacher-forced" if r["ratio"] is None else f"{r['ratio']:g}",
             r["tokens"], f"{r['ce']:.3f}", f"{100 * r['accuracy']:.1f}", f"{100 * r['exact']:.1f}", r["rows"]]
            for r in results]
    md = [f"# What the {a.task} models learned of the answer", "",
          f"`python -m research.answer_probe` on {a.n} held-out pairs, git {git_sha()}: the scored answer tokens "
          "(AR: all, teacher-forced; diffusion: the masked ones at each mask ratio), their cross-entropy and argmax "
          "accuracy, and the rows with every scored token equal to the reference's.", "",
          *markdown_table(["model", "objective", "mask ratio", "tokens", "CE nats/token", "accuracy %",
                           "exact rows %", "rows"], body)]
    atomic_write_text(out, stable_json({"task": a.task, "n": a.n, "seed": a.seed, "git_sha": git_sha(),
                                        "results": results}, indent=1) + "\n")
    atomic_write_text(Path(out).with_suffix(".md"), "\n".join(md) + "\n")
    print("\n".join(md))
    return {"results": results}


if __name__ == "__main__":
    run_main(main)
