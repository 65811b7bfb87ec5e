"""Denoising trace of one prompt: which step committed each answer position.

    python -m experiments.trace [--model DIR] [--strategy baseline|fastdllm|bd3lm] [--cache dual]
        [--rule threshold --threshold 0.9] [--gen-length 64 --block-length 16 --steps 64] [--out PNG]
        [--replay [--delay 0.1]]

The sampler flags are those of ``python -m experiments.generate`` (one
:class:`experiments.strategy.Strategy`: a cache policy and a commit rule, or a preset).
Writes a positions x steps heatmap (``--out``, default ``results/trace_<label>.png``): cell
(step s, position j) is coloured by the step that committed j once ``s >= commit_step[j]`` and
left blank while j is still [MASK]; each token is annotated (decoded with the model's tokenizer,
else its id) at the step that committed it; dashed lines mark block boundaries. ``--replay``
prints the answer after every step with masks as ``_`` (no delay unless ``--delay``). The
trajectory is rebuilt from ``GenerateOutput.commit_step`` (:mod:`dlm.trace`): no sampler ever
remasks a committed token. Without ``--model``: the embedded checkpoint if present, else a tiny
random model (seconds on a CPU).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from dlm.trace import replay_lines, step_states, token_labels
from experiments.common import atomic_write_text
from experiments.generate import encode, parser, setup

REPO = Path(__file__).resolve().parents[1]


def plot_trace(commit_step: np.ndarray, labels: list[str], block_length: int, prompt_len: int,
               title: str, path: Path) -> None:
    """Heatmap of a (G,) commit_step with one label per answer token."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    G = commit_step.size
    S = int(commit_step.max()) + 1 if G else 1
    steps = np.arange(S)[:, None]
    grid = np.where((commit_step[None] >= 0) & (commit_step[None] <= steps),
                    commit_step[None].astype(float), np.nan)  # (S, G)
    fig, ax = plt.subplots(figsize=(min(4 + 0.28 * G, 40), min(2.5 + 0.2 * S, 30)))
    im = ax.imshow(grid, aspect="auto", origin="upper", cmap="viridis", interpolation="nearest",
                   extent=(prompt_len - 0.5, prompt_len + G - 0.5, S - 0.5, -0.5))
    font = max(4, min(9, int(400 / max(G, 1))))
    for j in np.nonzero(commit_step >= 0)[0]:
        ax.text(prompt_len + j, commit_step[j], labels[j], ha="center", va="center", rotation=90,
                fontsize=font, color="white" if commit_step[j] < 0.6 * S else "black")
    for b in range(block_length, G, block_length):
        ax.axvline(prompt_len + b - 0.5, color="red", ls="--", lw=0.8)
    ax.set(xlabel="position (column)", ylabel="denoising step", title=title)
    fig.colorbar(im, ax=ax, label="commit step", fraction=0.03)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--out", default=None, help="PNG path (default results/trace_<label>.png)")
    p.add_argument("--replay", action="store_true", help="print the answer after every step")
    p.add_argument("--replay-out", default=None, help="also write the replay (one line per step) to this file")
    p.add_argument("--delay", type=float, default=0.0, help="seconds to sleep between replayed steps")
    args = p.parse_args(argv)
    if args.delay < 0:
        p.error(f"--delay must be >= 0, got {args.delay}")
    run = setup(p, args)
    model, tok, strategy = run.model, run.tokenizer, run.strategy

    _, ids = encode(model, tok, args.prompt)
    ids = ids.to(run.device)
    out = strategy.run(model, ids, generator=torch.Generator(run.device).manual_seed(args.seed))
    P = ids.shape[1]
    answer, cs = out.sequences[0, P:].cpu(), out.commit_step[0].cpu()  # (G,), (G,)
    mid = model.config.mask_token_id
    lines = replay_lines(step_states(answer, cs, mid), mid, tok) if args.replay or args.replay_out else []
    if args.replay:
        for line in lines:
            print(line, flush=True)
            if args.delay:
                time.sleep(args.delay)
    if args.replay_out:
        atomic_write_text(Path(args.replay_out), f"# {args.prompt}\n" + "".join(f"{x}\n" for x in lines))
    path = Path(args.out) if args.out else REPO / "results" / f"trace_{run.label}.png"
    title = (f"{run.label}: G={strategy.gen_length}, block {strategy.block}, "
             f"{out.stats.steps} steps, {out.stats.nfe} forwards")
    plot_trace(cs.numpy(), token_labels(answer.tolist(), tok), strategy.block, P, title, path)
    print(f"[wrote {path}]")
    return {"path": path, "output": out, "prompt_len": P}

if __name__ == "__main__":
    main()
