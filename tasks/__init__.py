"""The tasks as data: GSM8K-format (procedural arithmetic, real GSM8K, answer extraction, prompts)
and the any-order tasks (Sudoku, Countdown, the reversal poems: :mod:`tasks.anyorder`)."""

from tasks.arith import (
    COT_STYLES,
    ArithConfig,
    arith_vocabulary,
    generate_problems,
    iter_problems,
    parse_chain,
    problem_key,
    reasoning_lines,
    split_of_key,
)
from tasks.chain_score import chain_steps_right
from tasks.fewshot import DEFAULT_TEMPLATE, PromptTemplate, fewshot_examples, format_prompt, sample_shots
from tasks.gsm8k import Problem, extract_flexible, extract_strict, is_correct, load_gsm8k, normalize_number

__all__ = [
    "DEFAULT_TEMPLATE",
    "COT_STYLES",
    "ArithConfig",
    "Problem",
    "PromptTemplate",
    "arith_vocabulary",
    "chain_steps_right",
    "extract_flexible",
    "extract_strict",
    "fewshot_examples",
    "format_prompt",
    "generate_problems",
    "is_correct",
    "iter_problems",
    "load_gsm8k",
    "normalize_number",
    "parse_chain",
    "problem_key",
    "reasoning_lines",
    "sample_shots",
    "split_of_key",
]
