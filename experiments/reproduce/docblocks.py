"""The measured numbers of ``docs/*.md``, computed from ``results/``: each lies in a block between
``<!-- generated:NAME (python -m experiments.reproduce.docblocks) -->`` and
``<!-- /generated:NAME -->``, written by the function registered here as ``NAME``. Nothing between
the markers is typed; prose outside them carries no measurement.

    python -m experiments.reproduce.docblocks            # rewrite the blocks whose numbers changed
    python -m experiments.reproduce.docblocks --check    # exit 1 naming each stale doc
    python -m experiments.reproduce.docblocks --results DIR   # a reproduction's DIR: DIR/docs/NAME.md

The blocks live by topic (:mod:`experiments.reproduce.docs_speed`, ``docs_anyorder``); each
reads its files through :func:`harness.results.read_json`, which names the file and the missing
field. A doc naming a block nobody registered is refused, naming both.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from experiments.reproduce import docs_anyorder, docs_speed
from harness.cli import parser, run_main
from harness.results import REPO, write_if_changed

RESULTS = REPO / "results"
DOCS = REPO / "docs"
#: name -> function of the results folder giving the block's markdown
BLOCKS: dict[str, Callable[[Path], str]] = {**docs_speed.BLOCKS, **docs_anyorder.BLOCKS}
START = re.compile(r"<!-- generated:(\w+) \(python -m experiments\.reproduce\.docblocks\) -->")


def markers(name: str) -> tuple[str, str]:
    """The marker lines around block ``name``."""
    return f"<!-- generated:{name} (python -m experiments.reproduce.docblocks) -->", f"<!-- /generated:{name} -->"


def between(text: str, block: str, start: str, end: str, where: str) -> str:
    """``text`` with ``block`` between its one ``start`` marker line and the ``end`` line after it
    (``where`` names the file in the error)."""
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"{where}: needs one '{start}' line and one '{end}' line after it")
    head, rest = text.split(start)
    return head + start + "\n" + block + "\n" + end + rest.split(end, 1)[1]


def filled(text: str, results: Path, where: str = "doc") -> str:
    """``text`` with every generated block recomputed from ``results``."""
    names = START.findall(text)
    if len(names) != text.count("<!-- generated:"):
        raise ValueError(f"{where}: a '<!-- generated:' line is not of the form "
                         f"'{markers('NAME')[0]}'")
    for name in names:
        if name not in BLOCKS:
            raise ValueError(f"{where}: block {name!r} is not registered in experiments.reproduce.docblocks "
                             f"(registered: {', '.join(sorted(BLOCKS))})")
        text = between(text, BLOCKS[name](results).rstrip("\n"), *markers(name), where)
    return text


# -------------------------------------------------------------------------------------- writing
def docs_with_blocks(docs: Path = DOCS) -> list[Path]:
    """The docs holding at least one generated block."""
    return sorted(p for p in docs.glob("*.md") if START.search(p.read_text()))


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = parser("experiments.reproduce.docblocks", __doc__, paragraphs=2)
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each doc whose blocks differ")
    p.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default results/); another "
                   "folder (a reproduction's --out) gets DIR/docs/NAME.md for each doc whose blocks its files give")
    a = p.parse_args(argv)
    if not a.results.is_dir():
        p.error(f"--results {a.results}: not a directory")
    in_place = a.results.resolve() == RESULTS.resolve()
    stale = {}
    for doc in docs_with_blocks():
        text = doc.read_text()
        try:
            want = filled(text, a.results, str(doc))
        except FileNotFoundError as e:
            if in_place:
                raise
            print(f"skipped {doc.name}: {e}", file=sys.stderr)  # a reproduction that did not run that job
            continue
        target = doc if in_place else a.results / "docs" / doc.name
        if not target.is_file() or target.read_text() != want:
            stale[target] = want
    for target, text in stale.items():
        if a.check:
            print(f"{target}: a generated block differs from {a.results} (run python -m experiments.reproduce.docblocks)",
                  file=sys.stderr)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_if_changed(target, text)
            print(f"wrote {target}")
    return 1 if a.check and stale else 0


if __name__ == "__main__":
    run_main(main)
