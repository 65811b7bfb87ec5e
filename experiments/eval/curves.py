"""Learning curves of the any-order runs (issue 52): held-out accuracy and answer-token loss against
steps, per run, with the LR grid's pick.

    python -m experiments.eval.curves --runs runs/reproduce/i52/countdown-* --out /tmp/curves
    python -m experiments.eval.curves --records results/anyorder/curves/runs --out results/anyorder/curves

Each ``--runs`` item is an ``experiments.train.train_anyorder`` out dir (its ``metrics.jsonl``: the
held-out ``eval/accuracy`` every ``--eval-every`` steps, ``answer_loss``: the cross-entropy on the
answer's own tokens, EOS padding excluded; its ``model/config.json``: the flags it ran with; once it
finished, ``run.json``: steps run, whether the flattening rule stopped it, epochs, CPU seconds, the
commits) or a run's record file (``record.json`` of a finished run, committed under
``results/anyorder/curves/runs/`` by the plan's training jobs); ``--records DIR`` reads every
``DIR/*.json``. A run still training is reported as such.

Writes ``curves.md`` (one row per run: task, objective, LR, steps of the cap, stopped flat,
held-out accuracy at every evaluation, best, last answer loss, CPU hours, commit; then per task and
objective the LR the plan picks, the best final held-out accuracy of its grid), ``curves.json``
and ``curves.png`` (per task: held-out accuracy, and below it the answer-token loss, against steps).
"""

from __future__ import annotations

from pathlib import Path

from dlm.io import stable_json
from harness.run_records import read_record, run_record
from harness.cli import markdown_table, parser, run_main
from harness.results import atomic_write_text


def read_run(path) -> dict:
    """A run's record: a train_anyorder out dir (:func:`run_record`) or a committed record file
    (:func:`read_record`, checked)."""
    return read_record(path) if Path(path).suffix == ".json" else run_record(path)


def grids(runs: list[dict]) -> dict[str, list[dict]]:
    """The LR grids: finished runs from scratch with a held-out curve, grouped by task, objective and
    step cap (a full run at the cap the grid chose for forms its own group), by rising LR."""
    out: dict = {}
    for r in sorted(runs, key=lambda r: r["lr"]):
        if r["finished"] and not r["init"] and r["evals"]:
            out.setdefault(f"{r['task']} {r['objective']}, cap {r['cap']}", []).append(r)
    return out


def tail_loss(r: dict) -> float:
    """A run's mean answer loss over its last evaluation interval (the logged steps after the
    evaluation before the last): one objective's runs compare on it where accuracy cannot."""
    after = r["evals"][-2][0] if len(r["evals"]) > 1 else -1
    tail = [v for s, v in r["losses"] if s > after]
    return sum(tail) / len(tail) if tail else float("inf")


def picks(runs: list[dict]) -> dict:
    """Each grid's (:func:`grids`; two LRs or more: a full run alone at its cap picks nothing) run with
    the best final held-out accuracy; ties (a grid whose curves all sit at 0 has nothing else) go to
    the lower :func:`tail_loss`, then the smaller LR."""
    return {k: min(g, key=lambda r: (-r["evals"][-1][1], tail_loss(r), r["lr"]))
            for k, g in grids(runs).items() if len(g) > 1}


def render(runs: list[dict], chosen: dict) -> str:
    rows = [[r["task"], r["objective"], f"{r['lr']:g}", f"{r['steps']} / {r['cap']}",
             ("flat" if r["stopped_flat"] else "cap") if r["finished"] else "training",
             " ".join(f"{100 * a:.0f}" for _, a in r["evals"]) or "-",
             f"{100 * max(a for _, a in r['evals']):.1f}" if r["evals"] else "-",
             f"{r['losses'][-1][1]:.3f}" if r["losses"] else "-",
             cpu_cell(r), " ".join(sha[:12] for sha in r["git_sha"].split()), r["run"]]
            for r in runs]
    md = ["# Any-order learning curves", "",
          "Held-out accuracy (%, every `--eval-every` steps, on the run's held-out items) and the answer-token loss "
          "(EOS padding excluded) of each run; stop: `flat` when the flattening rule stopped it, `cap` at `--steps`. "
          "The two objectives' losses are not on one scale: AR's is next-token cross-entropy, diffusion's the "
          "masked answer tokens' at a mask ratio drawn per row. CPU h: the summed CPU time of the invocations "
          "that ended (a killed one's seconds are unknown; the steps covered are named when short of all). "
          "Written by `python -m experiments.eval.curves` from the runs' files.", "",
          *markdown_table(["task", "objective", "LR", "steps", "stop", "held-out accuracy per evaluation", "best",
                           "last answer loss", "CPU h", "commit", "run"], rows)]
    if chosen:
        grid = grids(runs)
        md += ["", "The LR grid's pick (the best final held-out accuracy among finished runs from scratch; ties: "
               "the lower mean answer loss over the last evaluation interval, then the smaller LR), with the LRs "
               "it chose among and their tail losses:", "",
               *markdown_table(["task, objective, cap", "LR", "final held-out accuracy", "LRs finished (tail loss)",
                                "run"],
                               [[k, f"{r['lr']:g}", f"{100 * r['evals'][-1][1]:.1f}",
                                 " ".join(f"{g['lr']:g} ({tail_loss(g):.3f})" for g in grid[k]), r["run"]]
                                for k, r in sorted(chosen.items())])]
    return "\n".join(md) + "\n"


def cpu_cell(r: dict) -> str:
    """A run's CPU hours, with the steps they cover when a killed invocation left some out."""
    if r["cpu_hours"] is None or r["cpu_steps"] == 0:
        return "unknown"  # no invocation that trained a step left its CPU time
    short = r["cpu_steps"] is not None and r["cpu_steps"] < r["steps"]
    return f"{r['cpu_hours']:.2f}" + (f" ({r['cpu_steps']} of {r['steps']} steps)" if short else "")


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in runs})
    fig, axes = plt.subplots(2, len(tasks), figsize=(5.5 * len(tasks), 7.5), squeeze=False)
    lrs = sorted({r["lr"] for r in runs})
    for col, task in enumerate(tasks):
        for r in (r for r in runs if r["task"] == task):
            style = dict(color="C0" if r["objective"] == "ar" else "C1", ls=("-", "--", ":", "-.")[lrs.index(r["lr"]) % 4],
                         label=f"{r['run']}, lr {r['lr']:g}" + (f" from {r['init']}" if r["init"] else ""))
            if r["evals"]:
                axes[0, col].plot([s for s, _ in r["evals"]], [100 * a for _, a in r["evals"]], marker="o", ms=3, **style)
            if r["losses"]:
                axes[1, col].plot([s for s, _ in r["losses"]], [v for _, v in r["losses"]], lw=0.8, **style)
        axes[0, col].set(title=task, xlabel="step", ylabel="held-out accuracy %", ylim=(-2, 102))
        axes[1, col].set(xlabel="step", ylabel="answer-token loss (nats, log scale)", yscale="log")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    p = parser("experiments.eval.curves", __doc__, paragraphs=1)
    p.add_argument("--runs", nargs="+", default=[], metavar="PATH", help="train_anyorder out dirs or record files")
    p.add_argument("--records", default=None, metavar="DIR", help="also every DIR/*.json run record")
    p.add_argument("--out", required=True, metavar="DIR", help="writes curves.md, curves.json, curves.png here")
    a = p.parse_args(argv)
    paths = list(a.runs)
    if a.records is not None:
        if not Path(a.records).is_dir():
            raise ValueError(f"--records {a.records}: not a directory")
        paths += sorted(str(f) for f in Path(a.records).glob("*.json"))
    if not paths:
        raise ValueError(f"no runs: give --runs, or a --records dir holding run records ({a.records})")
    runs = sorted((read_run(d) for d in paths), key=lambda r: (r["task"], r["objective"], r["lr"], r["run"]))
    names = [r["run"] for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"runs named twice: {sorted({n for n in names if names.count(n) > 1})}")
    chosen = picks(runs)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "curves.md", render(runs, chosen))
    atomic_write_text(out / "curves.json", stable_json({"runs": runs, "picks": {k: r["run"] for k, r in chosen.items()}},
                                                       indent=1) + "\n")
    plot(runs, out / "curves.png")
    return {"runs": runs, "picks": chosen}


if __name__ == "__main__":
    run_main(main)
