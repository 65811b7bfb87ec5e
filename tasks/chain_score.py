"""Chain-step scoring of the arithmetic task (:mod:`tasks.arith`): stricter than the final answer.

A generated answer is right on every chain step when its final answer is right
(:func:`tasks.is_correct`, strict) and its ``a op b = c`` lines (:func:`tasks.reasoning_lines`;
check lines and narrative skipped) give, in order, exactly the intermediate results of the
problem's reference chain (:func:`tasks.parse_chain`). A model can reach the right total through
a wrong intermediate line (``8 - 3 = 6`` for ``9 - 3 = 6`` and so on): right by the final answer,
wrong here.
"""

from __future__ import annotations

from tasks.arith import parse_chain, reasoning_lines
from tasks.gsm8k import Problem, is_correct


def chain_steps_right(prediction: str, problem: Problem) -> bool:
    """Whether ``prediction`` has ``problem``'s final answer and every intermediate result of its
    reference chain, in order (ValueError when the problem's answer is not a chain)."""
    results = [c for *_, c in parse_chain(problem.answer)]
    return is_correct(prediction, problem.target) and [line[3] for line in reasoning_lines(prediction)] == results
