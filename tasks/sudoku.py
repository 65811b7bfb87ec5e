"""4x4 Sudoku, the any-order task where every cell constrains every other (Dream's Sudoku
evaluation; test sets by number of blanks in ``../shared/data/reasoning/sudoku``).

Text: the prompt ``"Sudoku:\\n1000\\n0002\\n4003\\n0000"`` (rows, 0 = blank), the answer the solved rows.
:func:`check` verifies the output grid (every row, column and 2x2 box a permutation of 1-4, the
clues kept), so any valid solution counts, not only the reference's.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .pairs import Pair

BOXES = [[(r, c) for r in range(br, br + 2) for c in range(bc, bc + 2)] for br in (0, 2) for bc in (0, 2)]


def _prompt(grid: str) -> str:
    return "Sudoku:\n" + "\n".join(grid[i:i + 4] for i in range(0, 16, 4))


def solved_grid(rng: random.Random) -> list[list[int]]:
    """A uniformly shuffled valid 4x4 grid: a base pattern with digits, row pairs within bands,
    bands, column pairs within stacks and stacks permuted."""
    base = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]
    digits = rng.sample(range(1, 5), 4)
    rows = [r for band in rng.sample([[0, 1], [2, 3]], 2) for r in rng.sample(band, 2)]
    cols = [c for stack in rng.sample([[0, 1], [2, 3]], 2) for c in rng.sample(stack, 2)]
    return [[digits[base[r][c] - 1] for c in cols] for r in rows]


def generate(n: int, seed: int = 0, split: str = "train", blanks: tuple[int, int] = (4, 12)) -> list[Pair]:
    """``n`` puzzles with ``blanks`` (inclusive range) empty cells; ``split`` salts the seed."""
    rng = random.Random(f"sudoku:{split}:{seed}")
    out = []
    for i in range(n):
        grid = solved_grid(rng)
        k = rng.randint(*blanks)
        holes = set(rng.sample(range(16), k))
        puzzle = "".join("0" if j in holes else str(grid[j // 4][j % 4]) for j in range(16))
        solution = "".join(str(v) for row in grid for v in row)
        out.append(Pair(f"sudoku-{split}-{seed}-{i}", _prompt(puzzle), "\n".join(solution[r:r + 4] for r in range(0, 16, 4)),
                        (puzzle,)))
    return out


def load(path) -> list[Pair]:
    """A shared test set: jsonl ``{"input": "1000\\n...", "output": ...}`` or d1's csv ``Puzzle,Solution``."""
    path = Path(path)
    rows = []
    if path.suffix == ".csv":
        for line in path.read_text().splitlines()[1:]:
            puzzle, solution = line.strip().split(",")
            rows.append((puzzle, solution))
    else:
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                rows.append((d["input"].replace("\n", ""), d["output"].replace("\n", "")))
    return [Pair(f"{path.stem}-{i}", _prompt(p), "\n".join(s[r:r + 4] for r in range(0, 16, 4)), (p,))
            for i, (p, s) in enumerate(rows)]


def check(pair: Pair, output: str) -> bool:
    """The output's first 16 digits form a valid grid that keeps the puzzle's clues."""
    digits = [int(ch) for ch in output if ch.isdigit()][:16]
    if len(digits) != 16:
        return False
    grid = [digits[r * 4:r * 4 + 4] for r in range(4)]
    groups = grid + [list(col) for col in zip(*grid)] + [[grid[r][c] for r, c in box] for box in BOXES]
    if any(sorted(g) != [1, 2, 3, 4] for g in groups):
        return False
    return all(ch == "0" or int(ch) == digits[j] for j, ch in enumerate(pair.meta[0]))


def vocabulary() -> list[str]:
    return ["Sudoku"]
