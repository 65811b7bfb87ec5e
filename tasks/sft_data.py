"""SFT batches for the embedded models: prompt + answer, EOS-padded (LLaDA's SFT recipe).

Every row is ``prompt ++ answer ++ EOS...`` up to the batch length ``T = max prompt + R``, with
the response length ``R`` drawn per batch from ``response_lengths``: short responses keep most of
the compute on the answer tokens, long ones (256, 512) teach the model the long EOS tail (and its
positions) that generation lengths of 256-512 need. Optional few-shot prompts teach long prompts.
A batch is a pure function of the step and its generator, so training resumes exactly.

Curriculum (``short_steps``): the first optimizer steps use only the shortest response length and
zero-shot prompts, so the model learns the task itself (copying operands, carrying digits) on
cheap short rows before the long EOS tails and few-shot prompts take their share of the compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .arith import ArithConfig, generate_problems
from .fewshot import DEFAULT_TEMPLATE, format_prompt


@dataclass(frozen=True)
class SFTDataConfig:
    arith: ArithConfig = field(default_factory=ArithConfig)
    batch_size: int = 64
    response_lengths: tuple[int, ...] = (48, 256, 512)
    response_probs: tuple[float, ...] = (0.8, 0.15, 0.05)
    fewshot_prob: float = 0.25  # share of batches with k-shot prompts (not with the longest of several R)
    max_shots: int = 8
    # one shot count k per batch instead of per row: prompt lengths in a batch then differ only by
    # question lengths, so a layout that starts the response after the *shortest* prompt (BD3-LM's
    # block-aligned SFT) does not turn a long-prompt/short-prompt mix into hundreds of EOS columns
    shots_per_batch: bool = False
    short_steps: int = 0  # curriculum: steps [0, short_steps) use min(response_lengths), no shots
    # share of rows whose answer is only its final line ``#### N`` (no chain of thought): SFT data
    # in which a short answer is plausible for every question, as in real instruction data
    direct_prob: float = 0.0

    def __post_init__(self) -> None:
        if len(self.response_lengths) != len(self.response_probs):
            raise ValueError("response_lengths and response_probs must have the same length")
        if abs(sum(self.response_probs) - 1) > 1e-6 or min(self.response_probs) < 0:
            raise ValueError("response_probs must be a probability vector")
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if isinstance(self.short_steps, bool) or not isinstance(self.short_steps, int) or self.short_steps < 0:
            raise ValueError(f"short_steps must be an int >= 0, got {self.short_steps!r}")
        if isinstance(self.max_shots, bool) or not isinstance(self.max_shots, int) or self.max_shots < 1:
            raise ValueError(f"max_shots must be an int >= 1, got {self.max_shots!r}")
        if not 0 <= self.fewshot_prob <= 1:
            raise ValueError(f"fewshot_prob must lie in [0, 1], got {self.fewshot_prob}")
        if not 0 <= self.direct_prob < 1:
            raise ValueError(f"direct_prob must lie in [0, 1), got {self.direct_prob}")


def encode_prompt(tokenizer, question: str, shots=()) -> list[int]:
    return tokenizer.encode(format_prompt(question, shots), add_special_tokens=False)


def encode_answer(tokenizer, answer: str) -> list[int]:
    return tokenizer.encode(DEFAULT_TEMPLATE.completion(answer), add_special_tokens=False)


def direct_answer(answer: str) -> str:
    """The answer without its chain of thought: only the final ``#### N`` line."""
    return answer.rsplit("\n", 1)[-1]


def pad_rows(prompts: list[list[int]], answers: list[list[int]], response_len: int, eos_id: int,
             multiple: int = 16) -> dict:
    """``input_ids`` (B, T) EOS-padded on the right, and ``prompt_lengths`` (B,), with
    T = max P + R rounded up to ``multiple`` (few distinct shapes keep the CPU allocator from
    fragmenting over a long run)."""
    P = max(len(p) for p in prompts)
    T = -(-(P + response_len) // multiple) * multiple
    rows = []
    for p, a in zip(prompts, answers):
        body = (p + a + [eos_id])[:T]
        rows.append(body + [eos_id] * (T - len(body)))
    return {"input_ids": torch.tensor(rows, dtype=torch.long),
            "prompt_lengths": torch.tensor([len(p) for p in prompts], dtype=torch.long)}


class SFTBatches:
    """``batch_fn(step, generator) -> {"input_ids", "prompt_lengths"}`` for ``dlm.train``."""

    def __init__(self, tokenizer, config: SFTDataConfig = SFTDataConfig()) -> None:
        self.tok, self.cfg = tokenizer, config
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer has no eos_token_id")

    def shots_allowed(self, response_len: int) -> bool:
        """Few-shot prompts go with every response length but the longest (which bounds the row
        length) -- unless there is only one length, which then takes them all. (The generator draws
        exactly as before a single length could take shots, so older recipes replay bit for bit.)"""
        lengths = self.cfg.response_lengths
        return response_len < max(lengths) or (len(set(lengths)) == 1 and self.cfg.fewshot_prob > 0)

    def __call__(self, step: int, generator: torch.Generator) -> dict:
        cfg = self.cfg
        r = torch.multinomial(torch.tensor(cfg.response_probs), 1, generator=generator).item()
        short = step < cfg.short_steps
        response_len = min(cfg.response_lengths) if short else cfg.response_lengths[r]
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        problems = generate_problems(cfg.arith, cfg.batch_size, split="train", seed=seed)
        use_shots = self.shots_allowed(response_len) and \
            float(torch.rand((), generator=generator)) < cfg.fewshot_prob and not short
        prompts = []
        k_batch = int(torch.randint(1, cfg.max_shots + 1, (1,), generator=generator)) \
            if use_shots and cfg.shots_per_batch else None
        for i, pr in enumerate(problems):
            shots = ()
            if use_shots:
                k = k_batch or int(torch.randint(1, cfg.max_shots + 1, (1,), generator=generator))
                shots = generate_problems(cfg.arith, k, split="train", seed=seed + 7919 * (i + 1))
            prompts.append(encode_prompt(self.tok, pr.question, shots))
        texts = [pr.answer for pr in problems]
        if cfg.direct_prob > 0:  # no draw otherwise, so older recipes replay bit for bit
            direct = (torch.rand(len(texts), generator=generator) < cfg.direct_prob).tolist()
            texts = [direct_answer(t) if d else t for t, d in zip(texts, direct)]
        answers = [encode_answer(self.tok, t) for t in texts]
        return pad_rows(prompts, answers, response_len, self.tok.eos_token_id)
