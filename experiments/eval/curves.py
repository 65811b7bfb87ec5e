"""Learning curves of the any-order runs (issue 52): held-out accuracy and answer-token loss against
steps, per run, with the LR grid's pick.

    python -m experiments.eval.curves --runs runs/i52/countdown-* --out results/anyorder/curves

Each ``--runs`` dir is an ``experiments.train.train_anyorder`` out dir: its ``metrics.jsonl`` (the
held-out ``eval/accuracy`` every ``--eval-every`` steps, ``answer_loss``: the cross-entropy on the
answer's own tokens, EOS padding excluded), its ``model/config.json`` (the flags it ran with) and,
once it finished, ``run.json`` (steps run, whether the flattening rule stopped it, epochs, CPU
seconds, the commit). A run still training is reported as such.

Writes ``curves.md`` (one row per run: task, objective, LR, steps of the cap, stopped flat,
held-out accuracy at every evaluation, best, last answer loss, CPU hours, commit; then per task and
objective the LR the plan picks, the best final held-out accuracy of its grid), ``curves.json``
and ``curves.png`` (held-out accuracy against steps, one panel per task).
"""

from __future__ import annotations

import json
from pathlib import Path

from dlm.io import stable_json
from experiments.train.anyorder_curves import RUN_FILE, read_metrics
from harness.cli import markdown_table, parser, run_main
from harness.results import atomic_write_text


def read_run(path) -> dict:
    """One run's curve and provenance; a dir that is not a train_anyorder run is a ValueError naming it."""
    path = Path(path)
    cfg = path / "model" / "config.json"
    if not (path / "metrics.jsonl").is_file() or not cfg.is_file():
        raise ValueError(f"--runs {path}: not an experiments.train.train_anyorder run (needs metrics.jsonl and "
                         "model/config.json)")
    extra = json.loads(cfg.read_text())["extra"]
    args = extra["args"]
    metrics = read_metrics(path / "metrics.jsonl")
    evals = [(r["step"], r["eval/accuracy"]) for r in metrics if "eval/accuracy" in r]
    losses = [(r["step"], r["answer_loss"]) for r in metrics if "answer_loss" in r]
    done = json.loads((path / RUN_FILE).read_text()) if (path / RUN_FILE).is_file() else None
    return {"run": path.name, "task": args["task"], "objective": args["objective"], "lr": args["lr"],
            "cap": args["steps"], "init": args["init"], "evals": evals, "losses": losses,
            "steps": done["steps"] if done else (max(s for s, _ in evals + losses) if evals or losses else 0),
            "finished": done is not None, "stopped_flat": bool(done and done["stopped_flat"]),
            "epochs": done.get("epochs") if done else None, "cpu_hours": done["cpu_seconds"] / 3600 if done else None,
            "git_sha": (done or extra).get("git_sha", "not recorded")}


def picks(runs: list[dict]) -> dict:
    """(task, objective) -> the run of the LR grid with the best final held-out accuracy (finished
    runs from scratch only; ties: the smaller LR)."""
    out: dict = {}
    for r in sorted(runs, key=lambda r: r["lr"]):
        if not r["finished"] or r["init"] or not r["evals"]:
            continue
        key = f"{r['task']} {r['objective']}"
        if key not in out or r["evals"][-1][1] > out[key]["evals"][-1][1]:
            out[key] = r
    return out


def render(runs: list[dict], chosen: dict) -> str:
    rows = [[r["task"], r["objective"], f"{r['lr']:g}", f"{r['steps']} / {r['cap']}",
             ("flat" if r["stopped_flat"] else "cap") if r["finished"] else "training",
             " ".join(f"{100 * a:.0f}" for _, a in r["evals"]) or "-",
             f"{100 * max(a for _, a in r['evals']):.1f}" if r["evals"] else "-",
             f"{r['losses'][-1][1]:.3f}" if r["losses"] else "-",
             f"{r['cpu_hours']:.2f}" if r["cpu_hours"] is not None else "-", r["git_sha"][:12], r["run"]]
            for r in runs]
    md = ["# Any-order learning curves", "",
          "Held-out accuracy (%, every `--eval-every` steps, on the run's held-out items) and the answer-token loss "
          "(EOS padding excluded) of each run; stop: `flat` when the flattening rule stopped it, `cap` at `--steps`. "
          "Written by `python -m experiments.eval.curves` from the runs' files.", "",
          *markdown_table(["task", "objective", "LR", "steps", "stop", "held-out accuracy per evaluation", "best",
                           "last answer loss", "CPU h", "commit", "run"], rows)]
    if chosen:
        md += ["", "The LR grid's pick (the best final held-out accuracy among finished runs from scratch):", "",
               *markdown_table(["task and objective", "LR", "final held-out accuracy", "run"],
                               [[k, f"{r['lr']:g}", f"{100 * r['evals'][-1][1]:.1f}", r["run"]]
                                for k, r in sorted(chosen.items())])]
    return "\n".join(md) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in runs})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    lrs = sorted({r["lr"] for r in runs})
    for ax, task in zip(axes[0], tasks):
        for r in (r for r in runs if r["task"] == task and r["evals"]):
            ax.plot([s for s, _ in r["evals"]], [100 * a for _, a in r["evals"]], marker="o", ms=3,
                    color="C0" if r["objective"] == "ar" else "C1",
                    ls=("-", "--", ":", "-.")[lrs.index(r["lr"]) % 4], label=f"{r['objective']} lr {r['lr']:g}")
        ax.set(title=task, xlabel="step", ylabel="held-out accuracy %", ylim=(-2, 102))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    p = parser("experiments.eval.curves", __doc__, paragraphs=1)
    p.add_argument("--runs", nargs="+", required=True, metavar="DIR", help="train_anyorder out dirs")
    p.add_argument("--out", required=True, metavar="DIR", help="writes curves.md, curves.json, curves.png here")
    a = p.parse_args(argv)
    runs = sorted((read_run(d) for d in a.runs), key=lambda r: (r["task"], r["objective"], r["lr"], r["run"]))
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
