"""Closed-vocabulary word-level tokenizer for the small embedded models.

Design (guarantees ``decode(encode(text)) == text`` for in-vocabulary text):

* A normalizer turns every space into the marker ``"▁"``.
* A regex pre-tokenizer cuts text into pieces: a word (letters) or a
  punctuation mark, optionally carrying one leading ``"▁"``; ``"####"`` as a
  single piece; every digit on its own (never carrying a space, so a number
  is always the same digit tokens wherever it appears); ``"\\n"``; and a bare
  ``"▁"`` for any other space (before a digit, or repeated spaces).
* A ``WordLevel`` model maps pieces to ids; anything else becomes ``<|unk|>``.
* The decoder turns ``"▁"`` back into spaces and concatenates.

Special tokens have fixed small ids (``pad=0, bos=1, eos=2, mask=3, unk=4``),
but callers should always read them from the tokenizer.  Encoding adds no
special tokens by itself.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from dlm.tasks.arith import arith_vocabulary
from dlm.tasks.fewshot import DEFAULT_TEMPLATE

__all__ = [
    "PIECE_PATTERN",
    "SPACE",
    "SPECIAL_TOKENS",
    "build_tokenizer",
    "chat_template",
    "default_vocabulary",
    "load_tokenizer",
    "save_tokenizer",
]

#: Marker that stands for a space inside tokens.
SPACE = "\u2581"
#: Special tokens by role, in id order.
SPECIAL_TOKENS: dict[str, str] = {
    "pad_token": "<|pad|>",
    "bos_token": "<|bos|>",
    "eos_token": "<|eos|>",
    "mask_token": "<|mask|>",
    "unk_token": "<|unk|>",
}
#: Pre-tokenization regex (applied after spaces became ``SPACE``).
PIECE_PATTERN = rf"{SPACE}?####|{SPACE}?[A-Za-z]+|[0-9]|{SPACE}?[^A-Za-z0-9{SPACE}\n]|\n|{SPACE}"
_PIECE_RE = re.compile(PIECE_PATTERN)
_BASE_TOKENS = (SPACE, "\n", *string.digits)


def _template_pieces() -> set[str]:
    t = DEFAULT_TEMPLATE
    return set(_pieces(t.query("") + t.completion("") + t.shot_separator))


def default_vocabulary() -> list[str]:
    """Words of the arithmetic task plus those of the default prompt template."""
    return sorted(set(arith_vocabulary()) | _template_pieces())


def _pieces(text: str) -> list[str]:
    """Word/punctuation pieces of ``text`` without space markers, digits or newlines."""
    found = (piece.lstrip(SPACE) for piece in _PIECE_RE.findall(text.replace(" ", SPACE)))
    return [piece for piece in found if piece and piece not in _BASE_TOKENS]


def chat_template() -> str:
    """Jinja chat template rendering messages in the :data:`DEFAULT_TEMPLATE` format.

    User turns become ``"Question: <content>\\nAnswer:"`` and assistant turns
    ``" <content>\\n\\n"``, so alternating messages reproduce
    :func:`dlm.tasks.format_prompt` exactly.
    """
    t = DEFAULT_TEMPLATE
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
    """Build the word-level tokenizer.

    Args:
        vocab_words: Words (or whole texts, which are split into pieces) to
            include; defaults to :func:`default_vocabulary`.  Digits, space,
            newline, ASCII punctuation and the prompt-template words are always
            included.  Each word gets a plain and a space-prefixed token.
        model_max_length: Stored as the tokenizer's ``model_max_length``.

    Raises:
        TypeError: if ``vocab_words`` is a str or contains non-str items.
        ValueError: if ``model_max_length`` is not positive.
    """
    if vocab_words is None:
        vocab_words = default_vocabulary()
    if isinstance(vocab_words, str) or not isinstance(vocab_words, Iterable):
        raise TypeError("vocab_words must be an iterable of str (not a single str)")
    if isinstance(model_max_length, bool) or not isinstance(model_max_length, int) or model_max_length <= 0:
        raise ValueError(f"model_max_length must be a positive int, got {model_max_length!r}")
    pieces = _template_pieces() | set(string.punctuation)
    for i, word in enumerate(vocab_words):
        if not isinstance(word, str):
            raise TypeError(f"vocab_words[{i}] must be a str, got {type(word).__name__}")
        pieces.update(_pieces(word))
    vocab: dict[str, int] = {}
    for token in (*SPECIAL_TOKENS.values(), *_BASE_TOKENS):
        vocab[token] = len(vocab)
    for piece in sorted(pieces):
        for token in (piece, SPACE + piece):
            vocab.setdefault(token, len(vocab))

    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.normalizer = normalizers.Replace(" ", SPACE)
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")
    backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.Fuse()])
    backend.add_special_tokens(list(SPECIAL_TOKENS.values()))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        **SPECIAL_TOKENS,
    )
    tokenizer.chat_template = chat_template()
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    """Save ``tokenizer`` so ``AutoTokenizer.from_pretrained(directory)`` loads it.

    Writes ``tokenizer.json``, ``tokenizer_config.json`` (with the chat
    template inline and ``tokenizer_class = "PreTrainedTokenizerFast"``) and
    ``special_tokens_map.json``.  Returns the directory.
    """
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise TypeError(f"tokenizer must be a PreTrainedTokenizerFast, got {type(tokenizer).__name__}")
    if not isinstance(directory, (str, Path)):
        raise TypeError(f"directory must be a str or Path, got {type(directory).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.pop("backend", None)
    jinja_path = directory / "chat_template.jinja"
    if tokenizer.chat_template is not None:
        config["chat_template"] = tokenizer.chat_template
        jinja_path.unlink(missing_ok=True)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    special = {role: getattr(tokenizer, role) for role in SPECIAL_TOKENS if getattr(tokenizer, role) is not None}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")
    return directory


def load_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved by :func:`save_tokenizer` (no remote code)."""
    directory = Path(directory)
    if not (directory / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {directory}")
    return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)
