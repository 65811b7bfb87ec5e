"""What goes into a prompt, checked before the first forward.

- :func:`check_fits`: a prompt that leaves no room for what is generated (or scored) is refused
  with one line naming it, its length and the limit (the GSM8K harness and the lm-eval models);
- :func:`check_shots_unseen`: few-shot examples that are evaluated test questions (same
  normalised text, :func:`question_key`) are refused naming the file and the first ids;
  :func:`check_contexts_unseen` is the same check over lm-eval requests;
- :func:`token_trouble` / :func:`encode_prompts`: a prompt holding the mask token's text (the
  model would take it for a position to fill) is refused naming the problem and the token; text
  the tokenizer cannot represent (encoded as its unk token while the text does not hold that
  token) is reported in one line with the problem id and the pieces.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from harness.results import encode_question, prompt_text
from tasks import Problem


def check_fits(what: str, length: int, gen_length: int, max_seq_len: int, fix: str,
               room_for: str = "gen_length") -> None:
    """ValueError when a prompt of ``length`` tokens plus ``gen_length`` exceeds ``max_seq_len``."""
    if length + gen_length > max_seq_len:
        raise ValueError(f"{what}: the prompt ({length} tokens) + {room_for} {gen_length} exceeds "
                         f"max_seq_len={max_seq_len}: {fix}")


def fit_or_cut(labels: Sequence[str], lengths: Sequence[int], after: Sequence[int], max_seq_len: int, kind: str,
               truncate: bool) -> list[int]:
    """Indices of the prompts that leave no room for their ``after`` tokens. Without ``truncate``
    the first is refused (:func:`check_fits`); with it one warning counts them (the caller cuts)."""
    long = [i for i, (n, a) in enumerate(zip(lengths, after)) if n + a > max_seq_len]
    if long and not truncate:
        i = long[0]
        check_fits(f"{labels[i]} ({len(long)} of {len(lengths)} {kind} requests too long)", lengths[i], after[i],
                   max_seq_len, "use fewer shots (--num_fewshot) or a smaller gen_length, or pass truncate=left "
                   "in --model_args to keep their last tokens", "continuation" if kind == "loglikelihood" else
                   "gen_length")
    if long:
        print(f"warning: truncate=left: {len(long)} of {len(lengths)} {kind} prompts cut to their last tokens to fit "
              f"max_seq_len={max_seq_len} (first: {labels[long[0]]}, {lengths[long[0]]} tokens): their first "
              "few-shot examples are lost", file=sys.stderr)
    return long


def question_key(text: str) -> str:
    """A question's text with case and runs of whitespace ignored."""
    return " ".join(text.split()).casefold()


def check_shots_unseen(shots: Sequence[Problem], problems: Sequence[Problem], source) -> None:
    """Refuse few-shot examples whose question is one of ``problems`` (read from ``source``)."""
    tested = {question_key(p.question): p.id for p in problems}
    seen = [(s.id, tested[question_key(s.question)]) for s in shots if question_key(s.question) in tested]
    if seen:
        pairs = ", ".join(f"{s} = {p}" for s, p in seen[:3])
        raise ValueError(f"--num-fewshot {len(shots)}: {source}: {len(seen)} of the {len(shots)} few-shot examples "
                         f"are evaluated test questions ({pairs}): the prompts would hold their answers; "
                         "take the shots from a file without the test questions")


def check_contexts_unseen(requests: Sequence[tuple[str, str, str]]) -> None:
    """lm-eval's form of :func:`check_shots_unseen`: ``(label, question, context)`` per request; a
    context whose text before its own question holds a test question is refused."""
    requests = list(dict.fromkeys(requests))  # the choices of one question share their context
    keys = {question_key(q): label for label, q, _ in requests}
    for label, question, context in requests:
        text, own = question_key(context), question_key(question)
        head = text[:max(text.rfind(own), 0)]
        hit = next((k for k in keys if k and k in head), None) if head else None
        if hit is not None:
            raise ValueError(f"{label}: a few-shot example of its prompt is the test question of {keys[hit]} "
                             f"({hit[:60]!r}...): the task's few-shot split holds test questions; point its "
                             "few-shot data at a file without them")


def token_trouble(tokenizer, text: str, ids: Sequence[int], mask_id: int | None) -> tuple[bool, list[str]]:
    """(whether ``ids`` hold the mask id, the pieces of ``text`` encoded as the unk token although
    they are not the unk token's own text)."""
    masked = mask_id is not None and mask_id in ids
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or unk not in ids:
        return masked, []
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        spans = [text[a:b].strip() for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if i == unk]
    except NotImplementedError:  # a slow tokenizer: the characters that encode to unk on their own
        spans = [c for c in dict.fromkeys(text) if unk in tokenizer.encode(c, add_special_tokens=False)]
    return masked, [s for s in dict.fromkeys(spans) if s and s != tokenizer.unk_token]


def mask_error(where: str, whose: str, tokenizer, mask_id: int) -> ValueError:
    """The refusal of a prompt that holds the mask token's text."""
    token = tokenizer.convert_ids_to_tokens(mask_id)
    return ValueError(f"{where}: {whose} holds {token!r}, the text of the mask token (id {mask_id}): the model "
                      "would take it for a position to fill; remove it from the data")


def unk_note(where: str, bad: dict[str, list[str]], total: int, unk_token) -> str | None:
    """One line: how many prompts hold unrepresentable text, the first ids and their pieces."""
    if not bad:
        return None
    first = "; ".join(f"{k}: {' '.join(map(repr, v[:6]))}" for k, v in list(bad.items())[:3])
    return (f"warning: {where}: {len(bad)} of {total} prompts hold text the tokenizer cannot represent "
            f"(encoded as {unk_token}): {first}")


def encode_prompts(tokenizer, problems: Sequence[Problem], shots: Sequence[Problem] = (),
                   chat_template: bool = True, *, mask_id: int | None, where: str) -> list[list[int]]:
    """:func:`harness.results.encode_question` of every problem, checked: a prompt holding the mask
    token is refused (ValueError naming ``where``, the problem or shot, and the token); text encoded
    as the unk token is reported on stderr, one line for all prompts."""
    out, bad = [], {}
    for p in problems:
        text = prompt_text(tokenizer, p.question, shots, chat_template)
        ids = encode_question(tokenizer, p.question, shots, chat_template)
        masked, pieces = token_trouble(tokenizer, text, ids, mask_id)
        if masked:
            token = tokenizer.convert_ids_to_tokens(mask_id)
            shot = next((s for s in shots if token in s.question + s.answer), None)
            raise mask_error(where, f"problem {p.id}'s question" if token in p.question or shot is None
                             else f"few-shot example {shot.id}", tokenizer, mask_id)
        if pieces:
            bad[p.id] = pieces
        out.append(ids)
    note = unk_note(where, bad, len(problems), getattr(tokenizer, "unk_token", None))
    if note:
        print(note, file=sys.stderr)
    return out
