"""Closed-vocabulary word-level tokenizer (generic: the words come from the caller).

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

This module knows no task: :func:`build_word_tokenizer` takes the vocabulary, the text whose
pieces are always included (a prompt template's literal words) and the chat template as
arguments. The embedded models' tokenizer (arithmetic words + the few-shot template) is
:func:`tasks.tokenizer.build_tokenizer`.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

__all__ = [
    "PIECE_PATTERN",
    "SPACE",
    "SPECIAL_TOKENS",
    "build_word_tokenizer",
    "load_tokenizer",
    "save_tokenizer",
    "word_pieces",
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


def word_pieces(text: str) -> list[str]:
    """Word/punctuation pieces of ``text`` without space markers, digits or newlines."""
    found = (piece.lstrip(SPACE) for piece in _PIECE_RE.findall(text.replace(" ", SPACE)))
    return [piece for piece in found if piece and piece not in _BASE_TOKENS]


def build_word_tokenizer(vocab_words: Iterable[str], fixed_text: str = "", chat_template: Optional[str] = None,
                         model_max_length: int = 4096) -> PreTrainedTokenizerFast:
    """Build the word-level tokenizer.

    Args:
        vocab_words: Words (or whole texts, which are split into pieces) to
            include.  Digits, space, newline, ASCII punctuation and the pieces
            of ``fixed_text`` are always included.  Each word gets a plain and a
            space-prefixed token.
        fixed_text: Text whose pieces are always in the vocabulary (e.g. the
            literal words of a prompt template).
        chat_template: Jinja chat template stored on the tokenizer (or None).
        model_max_length: Stored as the tokenizer's ``model_max_length``.

    Raises:
        TypeError: if ``vocab_words`` is a str or contains non-str items, or
            ``fixed_text`` is not a str.
        ValueError: if ``model_max_length`` is not positive.
    """
    if isinstance(vocab_words, str) or not isinstance(vocab_words, Iterable):
        raise TypeError("vocab_words must be an iterable of str (not a single str)")
    if not isinstance(fixed_text, str):
        raise TypeError(f"fixed_text must be a str, got {type(fixed_text).__name__}")
    if isinstance(model_max_length, bool) or not isinstance(model_max_length, int) or model_max_length <= 0:
        raise ValueError(f"model_max_length must be a positive int, got {model_max_length!r}")
    pieces = set(word_pieces(fixed_text)) | set(string.punctuation)
    for i, word in enumerate(vocab_words):
        if not isinstance(word, str):
            raise TypeError(f"vocab_words[{i}] must be a str, got {type(word).__name__}")
        pieces.update(word_pieces(word))
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
    tokenizer.chat_template = chat_template
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
