"""Procedural GSM8K-format arithmetic word problems.

The task is deliberately small and regular so that a tiny masked-diffusion
model can learn it on a CPU: a closed vocabulary (10 names, 10 objects, two or
three phrasings per operation), one to a few operations, and values bounded by
``max_value``.  Example::

    question: "Ann has 12 apples. She buys 7 more. She gives 5 away.
               How many apples does Ann have?"
    answer:   "12 + 7 = 19\\n19 - 5 = 14\\n#### 14"

Train and test are disjoint *by construction*: each problem has a canonical
key made only of its numbers and operators (``"12+7-5"``), the key is hashed
into one of ten buckets, bucket 0 is the test split, and the generator
rejection-samples until the key belongs to the requested split.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

from tasks.gsm8k import Problem

__all__ = [
    "NAMES",
    "OBJECTS",
    "SPLITS",
    "COT_STYLES",
    "ArithConfig",
    "arith_vocabulary",
    "generate_problems",
    "iter_problems",
    "parse_chain",
    "problem_key",
    "reasoning_lines",
    "split_of_key",
]

#: Supported split names.
SPLITS = ("train", "test")
#: Chain-of-thought styles of :class:`ArithConfig`.
COT_STYLES = ("terse", "verbose", "checked", "final_check")
#: One key in ``_BUCKETS`` buckets (bucket 0) belongs to the test split.
_BUCKETS = 10
#: Give up after this many consecutive rejected samples.
_MAX_ATTEMPTS = 20_000

#: (name, subject pronoun) pairs.
NAMES: tuple[tuple[str, str], ...] = (
    ("Ann", "She"), ("Ben", "He"), ("Cara", "She"), ("Dan", "He"), ("Eve", "She"),
    ("Finn", "He"), ("Gina", "She"), ("Hugo", "He"), ("Ivy", "She"), ("Jack", "He"),
)
#: (singular, plural) object nouns.
OBJECTS: tuple[tuple[str, str], ...] = (
    ("apple", "apples"), ("pear", "pears"), ("book", "books"), ("pen", "pens"),
    ("coin", "coins"), ("card", "cards"), ("stamp", "stamps"), ("shell", "shells"),
    ("marble", "marbles"), ("cookie", "cookies"),
)
#: Sentence templates per operator; ``{p}`` is the pronoun, ``{b}`` the operand.
_STEP_TEMPLATES: dict[str, tuple[str, ...]] = {
    "+": ("{p} buys {b} more.", "{p} finds {b} more.", "{p} gets {b} more."),
    "-": ("{p} gives {b} away.", "{p} loses {b}.", "{p} sells {b}."),
    "*": ("{p} now has {b} times as many.", "{p} then has {b} times as many."),
}
#: The repeated step of ``loop=True``: subtract ``{b}`` while at least ``{b}`` is left.
_LOOP_TEMPLATES: tuple[str, ...] = (
    "{p} gives {b} away as many times as {name} has {b}.",
    "{p} sells {b} as many times as {name} has {b}.",
)
_OPENING = "{name} has {a} {obj}."
_CLOSING = "How many {objs} does {name} have?"
#: A reasoning line: the equation ``a op b = c``, after a retold sentence in the verbose style.
_LINE_RE = re.compile(r"(?:[A-Z][a-z]+ [a-z ]*\d+[a-z ]*\. )?(\d+) ([-+*]) (\d+) = (\d+)")
#: A verbose narrative line (the opening and the final amount).
_AMOUNT_RE = re.compile(r"[A-Z][a-z]+ has \d+ [a-z]+\.")
_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
#: The operator that undoes each operator, for the check lines of ``cot="checked"``.
_INVERSE = {"+": "-", "-": "+", "*": "/"}
#: A check line: ``(c inverse-op b = a)``.
_CHECK_RE = re.compile(r"\((\d+) ([-+/]) (\d+) = (\d+)\)")


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class ArithConfig:
    """Shape of the generated problems.

    Attributes:
        min_steps: Fewest operations per problem (>= 1).
        max_steps: Most operations per problem (>= ``min_steps``).
        max_value: Every operand and intermediate result lies in
            ``[0, max_value]``; the starting amount is at least 1.
        ops: Operators to use, a subset of ``("+", "-", "*")``.  Any
            sequence is accepted and stored as a tuple.
        max_factor: Bound on both operands of ``"*"`` (multiplier in
            ``[2, max_factor]``, multiplicand in ``[1, max_factor]``).
        cot: Chain-of-thought style.  ``"terse"``: one ``a op b = c`` line per
            operation.  ``"verbose"``: the opening amount, each operation
            retold in a freshly drawn phrasing before its equation, and the
            final amount, so the answer's length and wording are not fixed by
            the question (see :data:`COT_STYLES`).  ``"checked"``: the terse
            lines, each followed with probability 1/2 by its check, the inverse
            operation in parentheses (``7 - 3 = 4`` then ``(4 + 3 = 7)``), so one
            question of n steps has answers with 0 to n check lines, of as
            many lengths.  ``"final_check"``: the terse lines, and with
            probability 1/2 the check of the last step only, so every reasoning
            line keeps the fixed place it has in ``"terse"`` and one question's
            answers take exactly two lengths (the only optional text is at the end).
        loop: Add one repeated step to every problem, after a random one of
            its stated steps other than the last (after the only one in a
            one-step problem): "She gives 3 away as many
            times as Ann has 3."  The amount ``v`` reached so far is reduced by
            ``b`` in ``[2, max(2, v // 2)]`` while at least ``b`` is left, one
            reasoning line per subtraction, and the stated steps after it go on
            from ``v mod b``.  So the answer's *length* (``v // b`` loop lines)
            is known only once ``v`` is worked out, and later lines only once
            the loop is.  The canonical key spells the subtractions out.
    """

    min_steps: int = 1
    max_steps: int = 2
    max_value: int = 50
    ops: tuple[str, ...] = ("+", "-")
    max_factor: int = 9
    cot: str = "terse"
    loop: bool = False

    def __post_init__(self) -> None:
        _check_int("min_steps", self.min_steps, 1)
        _check_int("max_steps", self.max_steps, 1)
        if self.max_steps < self.min_steps:
            raise ValueError(f"max_steps ({self.max_steps}) must be >= min_steps ({self.min_steps})")
        _check_int("max_value", self.max_value, 2)
        _check_int("max_factor", self.max_factor, 2)
        if isinstance(self.ops, str) or not hasattr(self.ops, "__iter__"):
            raise TypeError(f"ops must be a sequence of operator strings, got {self.ops!r}")
        ops = tuple(self.ops)
        if not ops:
            raise ValueError("ops must not be empty")
        unknown = [op for op in ops if op not in _STEP_TEMPLATES]
        if unknown:
            raise ValueError(f"ops contains unsupported operators {unknown!r}; allowed: {tuple(_STEP_TEMPLATES)}")
        if len(set(ops)) != len(ops):
            raise ValueError(f"ops contains duplicates: {ops!r}")
        object.__setattr__(self, "ops", ops)
        if self.cot not in COT_STYLES:
            raise ValueError(f"cot must be one of {COT_STYLES}, got {self.cot!r}")
        if not isinstance(self.loop, bool):
            raise TypeError(f"loop must be a bool, got {type(self.loop).__name__}")


def split_of_key(key: str) -> str:
    """Return the split (``"train"`` or ``"test"``) that owns a canonical key."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty str, got {key!r}")
    bucket = int.from_bytes(hashlib.sha1(key.encode("utf-8")).digest()[:8], "big") % _BUCKETS
    return "test" if bucket == 0 else "train"


def _make_key(start: int, steps: list[tuple[str, int]]) -> str:
    return str(start) + "".join(f"{op}{b}" for op, b in steps)


def parse_chain(answer: str) -> list[tuple[int, str, int, int]]:
    """Parse an arithmetic answer into ``(a, op, b, c)`` lines.

    Raises:
        ValueError: if a reasoning line is not ``"a op b = c"``, a check line
            ``"(c inv b = a)"`` does not undo the step before it, the final line
            is not ``"#### n"``, or ``n`` differs from the last result.
    """
    if not isinstance(answer, str):
        raise TypeError(f"answer must be a str, got {type(answer).__name__}")
    *lines, final = answer.split("\n")
    chain = []
    for line in lines:
        if _AMOUNT_RE.fullmatch(line):  # verbose narrative line ("Ann has 7 apples.")
            continue
        check = _CHECK_RE.fullmatch(line)
        if check is not None:  # "(c inv b = a)" right after the step "a op b = c" it checks
            a, op, b, c = chain[-1] if chain else (None, None, None, None)
            if (int(check[1]), check[2], int(check[3]), int(check[4])) != (c, _INVERSE.get(op), b, a):
                raise ValueError(f"check line {line!r} does not undo the step before it")
            continue
        match = _LINE_RE.fullmatch(line)
        if match is None:
            raise ValueError(f"answer line is not '[retold sentence. ]a op b = c': {line!r}")
        a, op, b, c = match.groups()
        chain.append((int(a), op, int(b), int(c)))
    if not chain or not re.fullmatch(r"#### \d+", final) or int(final[5:]) != chain[-1][3]:
        raise ValueError(f"answer must end with '#### <last result>': {answer!r}")
    return chain


def reasoning_lines(text: str) -> list[tuple[int, str, int, int, bool]]:
    """The ``a op b = c`` lines of a *generated* answer, leniently: ``(a, op, b, c, right)`` per
    line, ``right`` being whether ``a op b`` really is ``c``.

    Unlike :func:`parse_chain` this never raises: lines of any other form (check lines, the
    ``#### n`` line, verbose narrative, garbage) are skipped, and a wrong line is reported, not
    refused, so one can measure whether a model's chain of thought carries its computation.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    out = []
    for line in text.split("\n"):
        match = _LINE_RE.fullmatch(line.strip())
        if match is not None:
            a, op, b, c = int(match[1]), match[2], int(match[3]), int(match[4])
            out.append((a, op, b, c, _APPLY[op](a, b) == c))
    return out


def problem_key(problem: Problem) -> str:
    """Canonical key (numbers and operators only) of an arithmetic problem."""
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a Problem, got {type(problem).__name__}")
    chain = parse_chain(problem.answer)
    return _make_key(chain[0][0], [(op, b) for _, op, b, _ in chain])


def _operand_range(op: str, current: int, lo: int, hi: int, config: ArithConfig) -> tuple[int, int]:
    """Inclusive range of right operands keeping ``op``'s result in ``[lo, hi]``.

    The range is empty (first > second) when no operand works.
    """
    if op == "+":
        return max(1, lo - current), hi - current
    if op == "-":
        return max(1, current - hi), current - lo
    if not 1 <= current <= config.max_factor:
        return 1, 0
    return max(2, -(-lo // current)), min(config.max_factor, hi // current)


def _sample_arithmetic(rng: random.Random, config: ArithConfig
                       ) -> tuple[int, list[tuple[str, int]], tuple[int, int] | None] | None:
    """Draw ``(start, steps, loop)``, or ``None`` on a dead end: ``steps`` are the
    operations of the answer's lines, and ``steps[loop[0]:loop[1]]`` the spelled-out
    subtractions of ``config.loop`` (``loop`` is ``None`` without it); every other
    step is stated in the question.

    Operators are drawn uniformly first; values are then drawn so that each
    result is a valid input for the next operator (``"*"`` needs a current
    value in ``[1, max_factor]``), which keeps ``"*"`` as frequent as the others.
    """
    ops = [rng.choice(config.ops) for _ in range(rng.randint(config.min_steps, config.max_steps))]
    bounds = [(1, config.max_factor) if op == "*" else (0, config.max_value) for op in ops[1:]]
    bounds.append((0, config.max_value))
    first_hi = min(config.max_factor, config.max_value) if ops[0] == "*" else config.max_value
    start = current = rng.randint(1, first_hi)
    loop_after = rng.randint(1, max(1, len(ops) - 1)) if config.loop else 0
    steps: list[tuple[str, int]] = []
    loop = None
    for i, (op, (lo, hi)) in enumerate(zip(ops, bounds), start=1):
        b_lo, b_hi = _operand_range(op, current, lo, hi, config)
        if b_lo > b_hi:
            return None
        b = rng.randint(b_lo, b_hi)
        current = _APPLY[op](current, b)
        steps.append((op, b))
        if i == loop_after:
            if current < 2:
                return None
            b = rng.randint(2, max(2, current // 2))
            loop = (len(steps), len(steps) + current // b)
            steps += [("-", b)] * (current // b)
            current %= b
    return start, steps, loop


def _render(rng: random.Random, style_rng: random.Random, start: int, steps: list[tuple[str, int]],
            loop: tuple[int, int] | None, cot: str) -> tuple[str, str, int]:
    """Turn arithmetic into (question, answer, final value) text.

    The answer's style choices (``"verbose"``: each retold phrasing; ``"checked"``: which steps
    get a check line; ``"final_check"``: whether the last step does) are drawn from
    ``style_rng``, independently of the question's phrasing, so the problems (and their order)
    are the same in every style.
    """
    name, pronoun = rng.choice(NAMES)
    singular, plural = rng.choice(OBJECTS)

    def amount(n: int) -> str:
        return _OPENING.format(name=name, a=n, obj=singular if n == 1 else plural)

    sentences = [amount(start)]
    lines = [amount(start)] if cot == "verbose" else []
    current = start
    for i, (op, b) in enumerate(steps):
        if loop is None or not loop[0] <= i < loop[1]:
            sentences.append(rng.choice(_STEP_TEMPLATES[op]).format(p=pronoun, b=b))
        elif i == loop[0]:
            sentences.append(rng.choice(_LOOP_TEMPLATES).format(p=pronoun, b=b, name=name))
        result = _APPLY[op](current, b)
        retold = style_rng.choice(_STEP_TEMPLATES[op]).format(p=pronoun, b=b) + " " if cot == "verbose" else ""
        lines.append(f"{retold}{current} {op} {b} = {result}")
        checkable = cot == "checked" or (cot == "final_check" and i == len(steps) - 1)
        if checkable and style_rng.random() < 0.5:
            lines.append(f"({result} {_INVERSE[op]} {b} = {current})")
        current = result
    if cot == "verbose":
        lines.append(amount(current))
    sentences.append(_CLOSING.format(objs=plural, name=name))
    return " ".join(sentences), "\n".join(lines) + f"\n#### {current}", current


def _seeded_rng(split: str, seed: int) -> random.Random:
    # the salt is fixed data (the generator's first home): changing it changes every committed problem
    digest = hashlib.sha256(f"dlm.tasks.arith|{split}|{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def iter_problems(
    config: ArithConfig | None = None,
    split: str = "train",
    seed: int = 0,
    unique: bool = False,
) -> Iterator[Problem]:
    """Yield an endless, deterministic stream of problems from one split.

    Args:
        config: Problem shape; defaults to ``ArithConfig()``.
        split: ``"train"`` or ``"test"``.
        seed: Stream seed; the same ``(config, split, seed)`` always yields the
            same sequence, with ids ``f"{split}-{seed}-{i}"``.
        unique: Skip problems whose canonical key was already yielded.  The
            stream then ends with ``ValueError`` once the keys run out.

    Raises:
        ValueError: for an unknown split, or when no acceptable problem can be
            drawn (config too restrictive / unique keys exhausted).
    """
    config = ArithConfig() if config is None else config
    if not isinstance(config, ArithConfig):
        raise TypeError(f"config must be an ArithConfig, got {type(config).__name__}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return _stream(config, split, seed, unique)


def _stream(config: ArithConfig, split: str, seed: int, unique: bool) -> Iterator[Problem]:
    rng = _seeded_rng(split, seed)
    style_rng = _seeded_rng(f"{split}|cot", seed)
    seen: set[str] = set()
    index = 0
    while True:
        for _ in range(_MAX_ATTEMPTS):
            drawn = _sample_arithmetic(rng, config)
            if drawn is None:
                continue
            key = _make_key(*drawn[:2])
            if split_of_key(key) == split and not (unique and key in seen):
                break
        else:
            detail = f"after {len(seen)} unique problems" if unique else "at all"
            raise ValueError(f"could not draw a {split!r} problem {detail} for {config!r}")
        if unique:
            seen.add(key)
        question, answer, target = _render(rng, style_rng, *drawn, config.cot)
        yield Problem(id=f"{split}-{seed}-{index}", question=question, answer=answer, target=target, split=split)
        index += 1


def generate_problems(
    config: ArithConfig | None = None,
    n: int = 1000,
    split: str = "train",
    seed: int = 0,
    unique: bool = False,
) -> list[Problem]:
    """Return the first ``n`` problems of :func:`iter_problems` (prefix-stable in ``n``).

    Raises:
        ValueError: for ``n < 0`` or an unknown split (see :func:`iter_problems`).
    """
    _check_int("n", n, 0)
    return list(islice(iter_problems(config, split, seed, unique), n))


def arith_vocabulary() -> list[str]:
    """Every word and punctuation mark the generator can emit (digits excluded)."""
    texts = [_OPENING, _CLOSING, *_LOOP_TEMPLATES, *(t for group in _STEP_TEMPLATES.values() for t in group)]
    texts += [w for pair in NAMES + OBJECTS for w in pair]
    texts += list(_APPLY) + ["=", "####"]
    pieces = re.findall(r"####|[A-Za-z]+|[^\sA-Za-z0-9{}]", " ".join(re.sub(r"\{\w+\}", " ", t) for t in texts))
    return sorted(set(pieces))
