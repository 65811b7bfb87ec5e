"""Countdown: combine the given numbers with + - * / into the target (Dream's Countdown
evaluation; test sets with 3, 4, 5 numbers in ``../shared/data/reasoning/countdown``).

Text: the prompt ``"Countdown: 15,44,79,50"`` (the numbers, then the target), the answer a chain of
equations ``"44-15=29,79-29=50"``, each using two available numbers (given or earlier results).
:func:`check` evaluates the chain: every equation true, each given number used exactly once,
intermediate results used once, the last result the target.

:func:`fixed_set` draws a fixed set of distinct 3-number puzzles (the many-epoch training set of
Ye et al. 2024's diffusion models), none whose :func:`problem_key` is in a given exclusion set
(the held-out and test problems).
"""

from __future__ import annotations

import json
import random
import re
from fractions import Fraction
from pathlib import Path

from .pairs import Pair

OPS = "+-*/"
PREFIX = "Countdown: "  # a prompt is PREFIX + "a,b,c,target"
EQ = re.compile(r"^(\d+)([-+*/])(\d+)=(\d+)$")


def make_pair(id: str, numbers: str, answer: str) -> Pair:
    """The pair of a puzzle ``numbers`` ("a,b,c,target"): its prompt, reference answer and meta."""
    return Pair(id, PREFIX + numbers, answer, (numbers,))


def pair_of_prompt(id: str, prompt: str, answer: str) -> Pair:
    """:func:`make_pair` read back from a stored prompt (a ValueError when it is not a Countdown prompt)."""
    numbers = prompt[len(PREFIX):].strip() if prompt.startswith(PREFIX) else ""
    if not numbers:
        raise ValueError(f"not a Countdown prompt: {prompt!r}")
    return make_pair(id, numbers, answer)


def _apply(a: int, op: str, b: int):
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return Fraction(a, b) if b else None


def solve_chain(rng: random.Random, k: int, max_value: int = 99) -> tuple[list[int], list[str], int]:
    """``k`` numbers and a random left-to-right chain of positive-integer steps over all of them."""
    while True:
        nums = [rng.randint(1, max_value) for _ in range(k)]
        order = rng.sample(nums, k)
        acc, steps = order[0], []
        for b in order[1:]:
            op = rng.choice(OPS)
            x, y = (acc, b) if rng.random() < 0.5 or op in "-/" else (b, acc)
            if op == "-" and x < y:
                x, y = y, x
            r = _apply(x, op, y)
            if r is None or r != int(r) or r <= 0 or r > 999:
                break
            steps.append(f"{x}{op}{y}={int(r)}")
            acc = int(r)
        else:
            return nums, steps, acc


def generate(n: int, seed: int = 0, split: str = "train", numbers: tuple[int, ...] = (3, 4)) -> list[Pair]:
    """``n`` puzzles, each with a count of numbers from ``numbers``; ``split`` salts the seed."""
    rng = random.Random(f"countdown:{split}:{seed}")
    out = []
    for i in range(n):
        nums, steps, target = solve_chain(rng, rng.choice(numbers))
        inp = ",".join(map(str, nums + [target]))
        out.append(make_pair(f"countdown-{split}-{seed}-{i}", inp, ",".join(steps)))
    return out


def problem_key(pair: Pair) -> tuple:
    """What makes two puzzles the same problem: the sorted given numbers and the target."""
    *given, target = (int(x) for x in pair.meta[0].split(","))
    return (*sorted(given), target)


def fixed_set(n: int, seed: int = 0, split: str = "train", exclude=frozenset(), max_target: int = 99) -> list[Pair]:
    """``n`` distinct 3-number puzzles (by :func:`problem_key`) with a target of at most
    ``max_target`` (the shared CD3 test set's targets are two-digit), none whose key is in
    ``exclude``; ``split`` and ``seed`` salt the draw."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"fixed_set size must be an int >= 1, got {n!r}")
    rng = random.Random(f"countdown-fixed:{split}:{seed}")
    seen, out = set(exclude), []
    while len(out) < n:
        nums, steps, target = solve_chain(rng, 3)
        inp = ",".join(map(str, nums + [target]))
        pair = make_pair(f"cd3-{split}-{seed}-{len(out)}", inp, ",".join(steps))
        if target <= max_target and problem_key(pair) not in seen:
            seen.add(problem_key(pair))
            out.append(pair)
    return out


def fixed_sets(train_size: int, seed: int, test: list[Pair], valid_size: int = 100) -> tuple[list[Pair], list[Pair]]:
    """(train, valid): a fixed training set of ``train_size`` puzzles (seeded by ``seed``) and a
    held-out set of ``valid_size`` (always seed 0), disjoint from each other and from ``test``."""
    test_keys = {problem_key(p) for p in test}
    valid = fixed_set(valid_size, 0, "valid", exclude=test_keys)
    train = fixed_set(train_size, seed, "train", exclude=test_keys | {problem_key(p) for p in valid})
    return train, valid


def load(path) -> list[Pair]:
    """A shared test set: jsonl ``{"input": "15,44,79,50", "output": "44-15=29,79-29=50"}``."""
    path = Path(path)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [make_pair(f"{path.stem}-{i}", d["input"], d["output"]) for i, d in enumerate(rows)]


#: what can be wrong with an answer (:func:`faults`), in the order they are listed
FAULTS = ("malformed", "false equation", "number not available", "target missed")


def faults(pair: Pair, output: str) -> tuple[str, ...]:
    """Everything wrong with the chain of equations ``output``, each of :data:`FAULTS` at most once
    (empty: right). ``malformed``: no equations, or one not ``a op b = c``; ``false equation``:
    ``a op b != c``; ``number not available``: an operand neither given nor an earlier unused result
    (a copy failure); ``target missed``: the last result is not the target, or a given number is
    unused. Every equation is checked, its stated result made available whether true or not."""
    *given, target = [int(x) for x in pair.meta[0].split(",")]
    pool, found, result = list(given), set(), None
    eqs = [e for e in output.replace(" ", "").strip().split(",") if e]
    for e in eqs:
        m = EQ.match(e)
        if not m:
            found.add("malformed")
            continue
        a, op, b, r = int(m[1]), m[2], int(m[3]), int(m[4])
        if _apply(a, op, b) != r:
            found.add("false equation")
        for v in (a, b):
            if v in pool:
                pool.remove(v)
            else:
                found.add("number not available")
        pool.append(r)
        result = r
    if not eqs:
        found.add("malformed")
    if result != target or len(pool) != 1:  # every given number used, the last result the target
        found.add("target missed")
    return tuple(f for f in FAULTS if f in found)


def check(pair: Pair, output: str) -> bool:
    """Evaluate the chain of equations in ``output`` against the puzzle: nothing wrong (:func:`faults`)."""
    return not faults(pair, output)


def vocabulary() -> list[str]:
    return ["Countdown"]
