"""Why each Countdown row fails: every committed answer's faults (:func:`tasks.countdown.faults`:
malformed, a false equation, a number not available, the target missed), counted per row.

    python -m research.countdown_failures --samples results/anyorder --out results/anyorder/countdown_failures.md

Reads ``countdown_<row>.jsonl`` under ``--samples`` (the any-order harness's per-sample files,
checked on read); the puzzle is the record's prompt (``Countdown: a,b,c,target``), so nothing is
decoded again. A row of mostly ``number not available`` writes equations but does not copy the
given numbers into them; ``false equation`` without it: it copies them and cannot do the arithmetic.
An answer can have several faults, so a row's fault shares need not add up.
Writes the table as Markdown and JSON (``--out`` with ``.json``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dlm.io import stable_json
from harness.cli import check_out, markdown_table, run_main
from harness.results import atomic_write_text, read_jsonl
from tasks import countdown


def fault_counts(path: Path) -> dict[str, int]:
    """``n``, ``right`` and each :data:`tasks.countdown.FAULTS` entry's count over one per-sample
    file; a record whose stored ``correct`` disagrees with the checker is a ValueError naming it."""
    counts = dict.fromkeys(("n", "right", *countdown.FAULTS), 0)
    for r in read_jsonl(path):
        try:
            pair = countdown.pair_of_prompt(r["id"], r["prompt"], r["reference"])
        except ValueError as e:
            raise ValueError(f"{path}: record {r['id']}: {e}") from None
        found = countdown.faults(pair, r["prediction"])
        if (not found) != bool(r["correct"]):
            raise ValueError(f"{path}: record {r['id']} says correct={r['correct']}, the checker finds {found or 'none'}")
        counts["n"] += 1
        counts["right"] += not found
        for f in found:
            counts[f] += 1
    return counts


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="research.countdown_failures", description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", required=True, metavar="DIR", help="holds countdown_<row>.jsonl")
    p.add_argument("--out", required=True, metavar="FILE.md", help="writes FILE.md and FILE.json")
    a = p.parse_args(argv)
    files = sorted(Path(a.samples).glob("countdown_*.jsonl"))
    if not files:
        raise ValueError(f"--samples {a.samples}: no countdown_<row>.jsonl")
    out = check_out("--out", a.out, kind="file")
    rows = {f.stem.removeprefix("countdown_"): fault_counts(f) for f in files}
    body = [[row, c["n"], *(f"{c[k]} ({100 * c[k] / max(c['n'], 1):.0f}%)" for k in ("right", *countdown.FAULTS))]
            for row, c in rows.items()]
    md = ["# Countdown: what is wrong with each row's answers", "",
          "From the rows' per-sample files `countdown_<row>.jsonl` (`python -m research.countdown_failures`, "
          "tasks.countdown.faults: every equation checked; an answer can have several faults).", "",
          *markdown_table(["row", "n", "right", *countdown.FAULTS], body)]
    atomic_write_text(out, "\n".join(md) + "\n")
    atomic_write_text(Path(out).with_suffix(".json"), stable_json(rows, indent=1) + "\n")
    print("\n".join(md))
    return rows


if __name__ == "__main__":
    run_main(main)
