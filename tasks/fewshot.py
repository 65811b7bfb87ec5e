"""Few-shot prompt formatting shared by the arithmetic task and real GSM8K.

A prompt is ``k`` worked examples followed by the query::

    Question: <q1>
    Answer: <a1>

    Question: <q>
    Answer:

The model's completion is ``" " + answer`` (see :meth:`PromptTemplate.completion`),
so ``format_prompt(q, shots) + template.completion(a)`` reads exactly like one
more worked example.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from tasks.arith import ArithConfig, generate_problems
from tasks.gsm8k import Problem

__all__ = ["DEFAULT_TEMPLATE", "PromptTemplate", "fewshot_examples", "format_prompt", "sample_shots"]


@dataclass(frozen=True)
class PromptTemplate:
    """Literal pieces of the ``Question: ... Answer: ...`` format.

    Attributes:
        question_prefix: Text before each question.
        answer_prefix: Text (after a newline) that ends the prompt.
        answer_separator: Text between ``answer_prefix`` and the answer.
        shot_separator: Text after each worked example.
    """

    question_prefix: str = "Question: "
    answer_prefix: str = "Answer:"
    answer_separator: str = " "
    shot_separator: str = "\n\n"

    def __post_init__(self) -> None:
        for name in ("question_prefix", "answer_prefix", "answer_separator", "shot_separator"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"PromptTemplate.{name} must be a str")

    def query(self, question: str) -> str:
        """The prompt tail for one question, ending right after ``answer_prefix``."""
        return f"{self.question_prefix}{question}\n{self.answer_prefix}"

    def completion(self, answer: str) -> str:
        """What a model should generate after :meth:`query`."""
        return f"{self.answer_separator}{answer}"

    def shot(self, question: str, answer: str) -> str:
        """One worked example including its trailing separator."""
        return self.query(question) + self.completion(answer) + self.shot_separator


#: The format used everywhere in the project (and by the tokenizer chat template).
DEFAULT_TEMPLATE = PromptTemplate()


def format_prompt(question: str, shots: Sequence[Problem] = (), template: PromptTemplate = DEFAULT_TEMPLATE) -> str:
    """Render ``shots`` as worked examples followed by ``question``.

    Raises:
        TypeError: if ``question`` is not a str, a shot is not a
            :class:`Problem`, or ``template`` is not a :class:`PromptTemplate`.
    """
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    if not isinstance(template, PromptTemplate):
        raise TypeError(f"template must be a PromptTemplate, got {type(template).__name__}")
    if isinstance(shots, (str, Problem)):
        raise TypeError("shots must be a sequence of Problem, not a single item")
    parts = []
    for i, shot in enumerate(shots):
        if not isinstance(shot, Problem):
            raise TypeError(f"shots[{i}] must be a Problem, got {type(shot).__name__}")
        parts.append(template.shot(shot.question, shot.answer))
    return "".join(parts) + template.query(question)


def fewshot_examples(config: ArithConfig | None = None, k: int = 4, seed: int = 0) -> list[Problem]:
    """``k`` worked arithmetic examples with distinct keys from the TRAIN split.

    Equivalent to ``generate_problems(config, k, "train", seed, unique=True)``,
    so the shots never share arithmetic with the test split.
    """
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return generate_problems(config, k, split="train", seed=seed, unique=True)


def sample_shots(pool: Sequence[Problem], k: int, seed: int = 0, exclude_id: str | None = None) -> list[Problem]:
    """Deterministically draw ``k`` distinct shots from ``pool`` (e.g. GSM8K train).

    Args:
        pool: Candidate worked examples.
        k: Number of shots.
        seed: Seed of the draw.
        exclude_id: A problem id never to use (the query itself).

    Raises:
        ValueError: if ``k`` is negative or exceeds the usable pool size.
    """
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    candidates = [p for p in pool if p.id != exclude_id]
    if not 0 <= k <= len(candidates):
        raise ValueError(f"k must be in [0, {len(candidates)}], got {k}")
    return random.Random(seed).sample(candidates, k)
