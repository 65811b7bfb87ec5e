"""The rows of one report table over the same problems, or a note saying they are not.

A harness folder may hold rows run over different problems (a sweep at ``--limit 100`` beside
rows of 300). :func:`align` keeps each row over its own problems and returns the note the table
prints, or, with ``common=True`` (``python -m harness.report --common-problems``), restricts every
row to the problems all rows share and notes how many each row lost. A row that shares no problem
with the reference row (the one speed-ups and McNemar tests are taken against) is refused.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class ProblemSets:
    """How the rows' problems differ: ``common`` problems shared by all, each row's own count."""
    common: int
    rows: dict  # strategy -> problems it ran, before any restriction
    restricted: bool
    note: str


def _grouped(counts: dict[str, int]) -> list[tuple[int, list[str]]]:
    groups: dict[int, list[str]] = defaultdict(list)
    for name, n in counts.items():
        groups[n].append(name)
    return sorted(groups.items(), reverse=True)


def align(runs: dict[str, list[dict]], reference: str,
          common: bool = False) -> tuple[dict[str, list[dict]], ProblemSets | None]:
    """``runs`` (strategy -> records) as the table reports them, and the note (None when every
    row ran the same problems). ValueError naming the row when one shares no problem with
    ``reference``'s row."""
    ids = {name: {r["id"] for r in records} for name, records in runs.items()}
    if len({frozenset(s) for s in ids.values()}) <= 1:
        return runs, None
    ref = ids[reference]
    for name, s in ids.items():
        if not s & ref:
            raise ValueError(f"{name}.jsonl shares no problem with the reference row {reference} ({len(s)} and "
                             f"{len(ref)} problems): the table would compare different problems; run both over "
                             "the same --data and --limit, or report them from separate folders")
    shared = set.intersection(*ids.values())
    if common and not shared:
        raise ValueError(f"--common-problems: no problem is common to all {len(ids)} rows; leave out the flag "
                         "(each row over its own problems, noted) or report the rows from separate folders")
    counts = {name: len(s) for name, s in ids.items()}
    if common:
        dropped = _grouped({name: n - len(shared) for name, n in counts.items() if n > len(shared)})
        note = (f"**Restricted to the {len(shared)} problems common to all rows** (--common-problems): dropped "
                + "; ".join(f"{k} from {', '.join(names)}" for k, names in dropped) + ".")
        runs = {name: [r for r in records if r["id"] in shared] for name, records in runs.items()}
    else:
        sizes = "; ".join(f"{n} for {len(names)} row{'s' * (len(names) > 1)}" for n, names in _grouped(counts))
        note = (f"**Rows over different problems** (n: {sizes}; {len(shared)} common to all rows): accuracy and "
                "tokens/s of rows with different problems compare different problems; each McNemar test pairs "
                f"its row with {reference} on the problems both ran (`--common-problems` restricts every row to "
                "the common ones).")
    return runs, ProblemSets(len(shared), counts, common, note)
