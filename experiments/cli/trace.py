"""Denoising trace of one prompt: which step committed each answer position.

    python -m experiments.cli.trace [--model DIR] [--strategy baseline|fastdllm|bd3lm] [--cache dual]
        [--rule threshold --threshold 0.9] [--gen-length 64 --block-length 16 --steps 64] [--out PNG]
        [--replay [--step-delay 0.1]]

The sampler flags are those of ``python -m experiments.cli.generate`` (one
:class:`dlm.spec.Sampler`: a cache policy and a commit rule, or a preset).
Writes a positions x steps heatmap (``--out``, default ``results/trace_<label>.png``): cell
(step s, position j) is coloured by the step that committed j once ``s >= commit_step[j]`` and
left blank while j is still [MASK]; each token is annotated (decoded with the model's tokenizer,
else its id) at the step that committed it; dashed lines mark block boundaries. ``--replay``
prints the answer after every step with masks as ``_`` (no delay unless ``--step-delay``). The
trajectory is rebuilt from ``GenerateOutput.commit_step`` (:mod:`dlm.trace`): no sampler ever
remasks a committed token. Without ``--model``: the embedded checkpoint if present, else a tiny
random model (seconds on a CPU).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from dlm.spec import generate
from dlm.trace import replay_lines, step_states, token_labels
from harness.results import atomic_write_text
from harness.cli import check_out, run_main
from experiments.cli.generate import encode, parser, setup

REPO = Path(__file__).resolve().parents[2]


MAX_COLUMNS = 32  # answer positions per row of the picture: 32 x 0.36 in at 100 dpi keeps it under 1400 px
DPI, CELL_W, TOKEN_FONT = 100, 0.36, 8  # dots per inch, inches per column, points


def glyph(label: str) -> str:
    """A token label short enough for one cell: ``<|eos|>`` -> ``eos``, blanks -> ``␣``, longer
    pieces cut to 4 characters (``…`` marks the cut)."""
    text = label[2:-2] if label.startswith("<|") and label.endswith("|>") else label
    text = text.strip() or "␣"
    return text if len(text) <= 4 else text[:3] + "…"


def trace_rows(commit_step: np.ndarray, max_columns: int = MAX_COLUMNS) -> list[tuple[int, int, int, int]]:
    """(first column, end column, first step, last step) of each row of the picture: the answer
    wrapped into rows of at most ``max_columns`` positions, each showing the steps in which its own
    positions were committed (earlier steps are blank there, later ones full)."""
    G = commit_step.size
    out = []
    for a in range(0, max(G, 1), max_columns):
        b = min(a + max_columns, G)
        done = commit_step[a:b][commit_step[a:b] >= 0]
        out.append((a, b, int(done.min()) if done.size else 0, int(done.max()) if done.size else 0))
    return out


def draw_trace(commit_step: np.ndarray, labels: list[str], block_length: int, prompt_len: int, title: str,
               max_columns: int = MAX_COLUMNS):
    """The trace as rows of at most ``max_columns`` positions (one steps x positions heatmap per
    row, one shared colour scale): returns (figure, the rows' axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    G = commit_step.size
    S = int(commit_step.max()) + 1 if G else 1
    rows = trace_rows(commit_step, max_columns)
    width = min(G, max_columns) if G else 1
    heights = [hi - lo + 1 for _, _, lo, hi in rows]
    step_h = min(0.22, max(0.07, 4.5 / sum(heights)))  # inches per step: 7 px when there are many
    left, right, top, gap, bottom = 0.75, 1.2, 0.5, 0.45, 0.6  # inches; gap: x ticks between rows
    fig_w = max(6.0, left + width * CELL_W + right)
    fig_h = top + sum(h * step_h for h in heights) + gap * (len(rows) - 1) + bottom
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=DPI)
    fig.text(0.5, 1 - 0.25 / fig_h, title, ha="center", va="center", fontsize=11)
    cmap = matplotlib.colormaps["viridis"]
    axes, y = [], fig_h - top
    for (a, b, lo, hi), h in zip(rows, heights):
        y -= h * step_h
        ax = fig.add_axes((left / fig_w, y / fig_h, (b - a) * CELL_W / fig_w, h * step_h / fig_h))
        y -= gap
        cs = commit_step[a:b]
        steps = np.arange(lo, hi + 1)[:, None]
        grid = np.where((cs[None] >= 0) & (cs[None] <= steps), cs[None].astype(float), np.nan)  # (h, b - a)
        im = ax.imshow(grid, aspect="auto", origin="upper", cmap=cmap, vmin=0, vmax=max(S - 1, 1),
                       interpolation="nearest", extent=(prompt_len + a - 0.5, prompt_len + b - 0.5, hi + 0.5, lo - 0.5))
        for j in np.nonzero(cs >= 0)[0]:
            r, g, bl, _ = cmap(cs[j] / max(S - 1, 1))
            at, va = ((lo - 0.5, "top") if cs[j] == lo and h > 1 else (hi + 0.5, "bottom") if cs[j] == hi and h > 1
                      else (cs[j], "center"))  # an edge row's glyph stays inside the axes
            ax.text(prompt_len + a + j, at, glyph(labels[a + j]), ha="center", va=va, fontsize=TOKEN_FONT,
                    parse_math=False, color="white" if 0.299 * r + 0.587 * g + 0.114 * bl < 0.55 else "black")
        for edge in range((a // block_length + 1) * block_length, b, block_length):
            ax.axvline(prompt_len + edge - 0.5, color="red", ls="--", lw=1.0)
        ax.set_xticks([prompt_len + j for j in range(a, b) if j % 4 == 0 or j == b - 1])
        ax.yaxis.set_major_locator(MaxNLocator(nbins=max(2, min(6, h)), integer=True))
        ax.tick_params(labelsize=8)
        ax.set_ylabel("step", fontsize=9)
        axes.append(ax)
    axes[-1].set_xlabel("position (column); red dashes: block boundaries", fontsize=9)
    low = axes[-1].get_position().y0  # the colour bar spans the rows
    cax = fig.add_axes(((left + width * CELL_W + 0.25) / fig_w, low, 0.18 / fig_w, 1 - top / fig_h - low))
    fig.colorbar(im, cax=cax).set_label("commit step", fontsize=9)
    return fig, axes


def plot_trace(commit_step: np.ndarray, labels: list[str], block_length: int, prompt_len: int,
               title: str, path: Path, max_columns: int = MAX_COLUMNS) -> None:
    """Write :func:`draw_trace`'s picture of a (G,) commit_step with one label per answer token:
    cell (step s, position j) coloured by j's commit step once ``s >= commit_step[j]``, blank while
    j is [MASK], the token written in the cell of its commit step; at most ``max_columns``
    positions per row, so it reads at 100% (fixed dpi: about 1350 px wide at 32 columns)."""
    import matplotlib.pyplot as plt

    fig, _ = draw_trace(commit_step, labels, block_length, prompt_len, title, max_columns)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def main(argv=None) -> dict:
    p = parser("experiments.cli.trace", __doc__)
    p.add_argument("--out", default=None, help="PNG path (default results/trace_<label>.png)")
    p.add_argument("--replay", action="store_true", help="print the answer after every step")
    p.add_argument("--replay-out", default=None, help="also write the replay (one line per step) to this file")
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep between replayed steps")
    args = p.parse_args(argv)
    if args.out:
        check_out("--out", args.out, kind="file")
    if args.step_delay < 0:
        p.error(f"--step-delay must be >= 0, got {args.step_delay}")
    run = setup(p, args)
    model, tok, strategy = run.model, run.tokenizer, run.strategy

    _, ids = encode(model, tok, args.prompt)
    ids = ids.to(run.device)
    out = generate(model, ids, None, strategy, generator=torch.Generator(run.device).manual_seed(args.seed))
    P = ids.shape[1]
    answer, cs = out.sequences[0, P:].cpu(), out.commit_step[0].cpu()  # (G,), (G,)
    mid = model.config.mask_token_id
    lines = replay_lines(step_states(answer, cs, mid), mid, tok) if args.replay or args.replay_out else []
    if args.replay:
        for line in lines:
            print(line, flush=True)
            if args.step_delay:
                time.sleep(args.step_delay)
    if args.replay_out:
        atomic_write_text(Path(args.replay_out), f"# {args.prompt}\n" + "".join(f"{x}\n" for x in lines))
    path = Path(args.out) if args.out else REPO / "results" / f"trace_{run.label}.png"
    title = (f"{run.label}: G={strategy.gen_length}, block {strategy.block}, "
             f"{out.stats.steps} steps, {out.stats.nfe} forwards")
    plot_trace(cs.numpy(), token_labels(answer.tolist(), tok), strategy.block, P, title, path)
    print(f"[wrote {path}]")
    return {"path": path, "output": out, "prompt_len": P}

if __name__ == "__main__":
    run_main(main)
