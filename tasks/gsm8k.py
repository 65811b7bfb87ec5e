"""GSM8K-format problems: the shared record type, answer extraction and a loader.

Every task in :mod:`tasks` produces :class:`Problem` records whose
``answer`` follows the GSM8K convention: zero or more lines of worked
reasoning followed by a final line ``#### <number>``.  The extraction helpers
here are used both for the procedural arithmetic task and for real GSM8K, so
scores on the two are computed identically.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "GSM8K_NAMES",
    "Problem",
    "extract_flexible",
    "extract_strict",
    "is_correct",
    "load_gsm8k",
    "normalize_number",
]

#: Dataset names that :func:`load_gsm8k` resolves through Hugging Face ``datasets``.
GSM8K_NAMES = frozenset({"openai/gsm8k", "gsm8k"})

# A number as it may appear in free text: optional sign, optional "$", digits with
# optional thousands separators, optional decimal part.  The match may not be
# glued to a preceding word/number/period (so "3-5" yields 3 and 5, and "x1"
# yields nothing).  A trailing sentence period is never consumed because the
# decimal part needs a digit after ".".
_NUMBER = (
    r"(?<![\w.])[-+]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
    r"|(?<![\w.])[-+]?\$?\.\d+"
)
_NUMBER_RE = re.compile(_NUMBER)
_STRICT_RE = re.compile(r"####\s*(" + _NUMBER + ")")
_CANONICAL_RE = re.compile(r"(-?)(\d*)(?:\.(\d+))?")


@dataclass(frozen=True)
class Problem:
    """One GSM8K-format word problem.

    Attributes:
        id: Stable identifier, unique within its source (e.g. ``"test-0-17"``).
        question: The natural-language question.
        answer: Worked solution lines followed by a final ``#### <n>`` line.
        target: The gold final answer.  An ``int`` whenever the normalised
            answer is integral (always the case for the arithmetic task and
            for GSM8K itself); otherwise the canonical string produced by
            :func:`normalize_number` (e.g. ``"2.5"``).
        split: Name of the split the problem belongs to (``"train"``/``"test"``).
    """

    id: str
    question: str
    answer: str
    target: int | str
    split: str

    def __post_init__(self) -> None:
        for name in ("id", "question", "answer", "split"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Problem.{name} must be a str, got {type(getattr(self, name)).__name__}")
        if isinstance(self.target, bool) or not isinstance(self.target, (int, str)):
            raise TypeError(f"Problem.target must be an int or str, got {type(self.target).__name__}")
        if isinstance(self.target, str) and normalize_number(self.target) != self.target:
            raise ValueError(f"Problem.target string must be a normalised number, got {self.target!r}")

    @property
    def target_str(self) -> str:
        """The gold answer as the canonical string used for comparisons."""
        return str(self.target)


def normalize_number(s: str) -> str | None:
    """Return the canonical string form of a number, or ``None``.

    Commas, ``$``, surrounding whitespace, a leading ``+`` and a trailing
    ``.`` are removed; leading zeros and trailing fractional zeros are dropped
    (``"1,234.50"`` -> ``"1234.5"``, ``"12.00"`` -> ``"12"``, ``"-0"`` -> ``"0"``).

    Raises:
        TypeError: if ``s`` is not a string.
    """
    if not isinstance(s, str):
        raise TypeError(f"s must be a str, got {type(s).__name__}")
    text = s.strip().replace(",", "").replace("$", "")
    if text.startswith("+"):
        text = text[1:]
    if text.endswith("."):
        text = text[:-1]
    match = _CANONICAL_RE.fullmatch(text)
    if match is None:
        return None
    sign, whole, frac = match.groups()
    if not whole and not frac:
        return None
    whole = whole.lstrip("0") or "0"
    frac = (frac or "").rstrip("0")
    out = f"{whole}.{frac}" if frac else whole
    return "0" if out == "0" else sign + out


def extract_strict(text: str) -> str | None:
    """Return the normalised number right after the first ``####``, or ``None``.

    This is the GSM8K convention: only ``#### <n>`` counts; anything else in
    the text is ignored.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    marker = text.find("####")
    if marker < 0:
        return None
    match = _STRICT_RE.match(text, marker)
    return normalize_number(match.group(1)) if match else None


def extract_flexible(text: str) -> str | None:
    """Return the normalised last number appearing anywhere in ``text``, or ``None``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    matches = _NUMBER_RE.findall(text)
    return normalize_number(matches[-1]) if matches else None


def is_correct(
    prediction_text: str,
    target: int | float | str,
    mode: Literal["strict", "flexible"] = "strict",
) -> bool:
    """Whether the answer extracted from ``prediction_text`` equals ``target``.

    Args:
        prediction_text: Model output (typically the generated answer).
        target: Gold answer, e.g. :attr:`Problem.target`.
        mode: ``"strict"`` uses :func:`extract_strict`, ``"flexible"`` uses
            :func:`extract_flexible`.

    Raises:
        ValueError: for an unknown ``mode`` or a ``target`` that is not a number.
    """
    if mode == "strict":
        predicted = extract_strict(prediction_text)
    elif mode == "flexible":
        predicted = extract_flexible(prediction_text)
    else:
        raise ValueError(f"mode must be 'strict' or 'flexible', got {mode!r}")
    if isinstance(target, bool) or not isinstance(target, (int, float, str)):
        raise TypeError(f"target must be an int, float or str, got {type(target).__name__}")
    gold = normalize_number(str(target))
    if gold is None:
        raise ValueError(f"target is not a number: {target!r}")
    return predicted == gold


def _target_from_answer(answer: str, where: str) -> int | str:
    gold = extract_strict(answer)
    if gold is None:
        raise ValueError(f"{where}: answer has no '#### <number>' line")
    return int(gold) if re.fullmatch(r"-?\d+", gold) else gold


def _problems_from_rows(rows: list[dict], split: str, source: str) -> list[Problem]:
    problems = []
    for i, row in enumerate(rows):
        where = f"{source} record {i}"
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
            raise ValueError(f"{where}: expected string fields 'question' and 'answer'")
        problems.append(
            Problem(
                id=f"gsm8k-{split}-{i}",
                question=row["question"],
                answer=row["answer"],
                target=_target_from_answer(row["answer"], where),
                split=split,
            )
        )
    return problems


def _read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file; a line that is not UTF-8 or not JSON: ValueError ``<path>:<line>: ...``."""
    rows = []
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text (byte {raw[exc.start]:#04x} at column "
                                 f"{exc.start + 1})") from None
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from exc
    return rows


def _load_hub(config: str, split: str) -> list[dict]:
    """The rows of ``openai/gsm8k`` from the Hugging Face Hub (or its local cache); any failure
    (offline, no ``datasets``) is one ValueError that names the source and the local alternative."""
    source = f"openai/gsm8k[{config}/{split}]"
    local = "pass a local JSONL instead, e.g. --data ../shared/data/gsm8k/test.jsonl"
    try:
        import datasets  # noqa: PLC0415 - optional dependency, imported lazily
    except ImportError:
        raise ValueError(f"{source} needs the 'datasets' package (pip install datasets); or {local}") from None
    try:
        return [dict(row) for row in datasets.load_dataset("openai/gsm8k", config, split=split)]
    except Exception as exc:  # noqa: BLE001 - network, cache and hub errors of a third-party loader
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ValueError(f"{source}: cannot load it from the Hugging Face Hub or its cache "
                         f"({type(exc).__name__}: {reason}); offline? {local}") from exc


def load_gsm8k(path_or_name: str | Path = "openai/gsm8k", split: str = "test", config: str = "main") -> list[Problem]:
    """Load GSM8K problems from a local JSONL file/directory or from the Hub.

    Args:
        path_or_name: One of
            * a ``.jsonl`` file with ``question``/``answer`` fields per line;
            * a directory containing ``<split>.jsonl``;
            * ``"openai/gsm8k"`` (or ``"gsm8k"``), fetched with
              ``datasets.load_dataset("openai/gsm8k", config, split=split)``.
        split: Split label stored in each :class:`Problem` (and the split to
            fetch / file to pick for the Hub and directory forms).
        config: Hub dataset configuration (``"main"`` or ``"socratic"``).

    Returns:
        Problems in file order with ids ``"gsm8k-<split>-<index>"``.

    Raises:
        FileNotFoundError: if a local path does not exist.
        ValueError: for malformed records (naming the file and line: bad UTF-8, bad JSON), an empty
            ``split``, or a Hub form that cannot be loaded (offline, no ``datasets``).
    """
    if not isinstance(split, str) or not split:
        raise ValueError(f"split must be a non-empty str, got {split!r}")
    if not isinstance(path_or_name, (str, Path)):
        raise TypeError(f"path_or_name must be a str or Path, got {type(path_or_name).__name__}")
    if isinstance(path_or_name, str) and path_or_name in GSM8K_NAMES and not Path(path_or_name).exists():
        return _problems_from_rows(_load_hub(config, split), split, f"openai/gsm8k[{config}/{split}]")
    path = Path(path_or_name)
    if path.is_dir():
        path = path / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K file not found: {path}")
    return _problems_from_rows(_read_jsonl(path), split, str(path))
