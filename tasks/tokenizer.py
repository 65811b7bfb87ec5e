"""The embedded models' tokenizer: the arithmetic task's words plus the few-shot prompt template.

:func:`build_tokenizer` is :func:`dlm.tokenizer.build_word_tokenizer` (the generic closed-vocabulary
word-level tokenizer) with the vocabulary of :func:`tasks.arith.arith_vocabulary`, the literal
pieces of :data:`tasks.fewshot.DEFAULT_TEMPLATE` and a chat template rendering that format.
The task depends on the core tokenizer, never the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable

from transformers import PreTrainedTokenizerFast

from tasks.arith import arith_vocabulary
from tasks.fewshot import DEFAULT_TEMPLATE, PromptTemplate
from dlm.tokenizer import build_word_tokenizer, word_pieces

__all__ = ["build_tokenizer", "chat_template", "default_vocabulary", "template_text"]


def template_text(template: PromptTemplate = DEFAULT_TEMPLATE) -> str:
    """The literal text of ``template`` (its words are always in the vocabulary)."""
    return template.query("") + template.completion("") + template.shot_separator


def default_vocabulary() -> list[str]:
    """Words of the arithmetic task plus those of the default prompt template."""
    return sorted(set(arith_vocabulary()) | set(word_pieces(template_text())))


def chat_template(template: PromptTemplate = DEFAULT_TEMPLATE) -> str:
    """Jinja chat template rendering messages in the ``template`` format.

    User turns become ``"Question: <content>\\nAnswer:"`` and assistant turns
    ``" <content>\\n\\n"``, so alternating messages reproduce
    :func:`tasks.format_prompt` exactly.
    """
    t = template
    user = t.question_prefix + "{{ message['content'] }}\n" + t.answer_prefix
    assistant = t.answer_separator + "{{ message['content'] }}" + t.shot_separator
    return (
        "{% for message in messages %}"
        f"{{% if message['role'] == 'user' %}}{user}"
        f"{{% elif message['role'] == 'assistant' %}}{assistant}"
        "{% else %}{{ raise_exception('only user and assistant roles are supported') }}"
        "{% endif %}{% endfor %}"
    )


def build_tokenizer(vocab_words: Iterable[str] | None = None, model_max_length: int = 4096) -> PreTrainedTokenizerFast:
    """The embedded tokenizer (:func:`dlm.tokenizer.build_word_tokenizer`).

    Args:
        vocab_words: Words (or whole texts) to include; defaults to
            :func:`default_vocabulary`.  The prompt-template words are always
            included.
        model_max_length: Stored as the tokenizer's ``model_max_length``.
    """
    return build_word_tokenizer(default_vocabulary() if vocab_words is None else vocab_words,
                                fixed_text=template_text(), chat_template=chat_template(),
                                model_max_length=model_max_length)
