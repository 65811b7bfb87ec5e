"""One-off: re-evaluate ``experiments.perplexity`` runs with more eval passes, keeping their training.

    python -m research.convert_perplexity_passes results/perplexity_char-s0.jsonl ... --passes 16
    python -m experiments.perplexity eval --preset char        # recomputes the evaluation records

A run's config now carries ``eval.passes`` (the NELBO averaged over that many passes over the test
set; absent when 1). This keeps the config record and the ``train/*`` records of a one-pass run,
rewritten under the config with ``eval.passes`` set (every other field unchanged, asserted, as
:mod:`research.convert_perplexity_v2` does), and drops its evaluation records (``ppl``, ``mc``,
``search``, ``var``), which the ``eval`` command then recomputes from the same checkpoints.
Idempotent: a run already at ``--passes`` is left as it is. ``--check`` writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from research.convert_perplexity_v2 import checked_records, rehash


def convert(path: Path, passes: int, check: bool) -> str:
    records, cfg = checked_records(path)
    if cfg["config"]["eval"].get("passes", 1) == passes:
        return f"{path}: already at {passes} passes"
    kept = [r for r in records if r["kind"] in ("config", "train")]
    new_cfg = {**cfg["config"], "eval": {**cfg["config"]["eval"], "passes": passes}}
    return rehash(path, kept, cfg["config_hash"], new_cfg, check) + f", {len(records) - len(kept)} eval records dropped"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="perplexity_<run>.jsonl files")
    p.add_argument("--passes", type=int, required=True, help="eval passes of the new config (>= 2)")
    p.add_argument("--check", action="store_true", help="check and report, write nothing")
    args = p.parse_args(argv)
    if args.passes < 2:
        raise ValueError(f"--passes must be >= 2, got {args.passes}")
    for f in args.files:
        print(convert(Path(f), args.passes, args.check))


if __name__ == "__main__":
    sys.exit(main())
