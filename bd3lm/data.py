"""Language-modelling data for BD3-LM: LM1B-style and OpenWebText/GPT-2-style token chunks.

- ``lm1b`` (BD3-LM sec. 6.1, "LM1B, wrapped"): ``bert-base-uncased``; every sentence is wrapped
  ``[CLS] ... [SEP]``, the stream is concatenated and cut into chunks of 128 tokens (the
  remainder is dropped). The mask token is BERT's ``[MASK]``.
- ``owt`` (OpenWebText with the GPT-2 tokenizer): every document is followed by
  ``<|endoftext|>``, the stream is concatenated and cut into chunks of ``1024 - 2`` tokens, each
  wrapped ``<|endoftext|> ... <|endoftext|>`` (BOS = EOS in GPT-2), as MDLM / BD3-LM's wrapped
  OWT. GPT-2 has no mask token: ``[MASK]`` is the extra id ``len(tokenizer)``.
- ``char`` (character level, e.g. tinyshakespeare): the raw text (newlines kept), optionally cut
  to a character span ``(lo, hi)`` (fractions of the file's characters), encoded with
  :class:`CharTokenizer` (tokenizer name ``char``) and cut into chunks of ``seq_len`` characters
  with no special tokens, so every scored token is a character of the text.

Sources: local text files (one sentence / document per non-empty line, e.g. the LM1B heldout
``1b_benchmark.dev.tokens``) or a Hugging Face dataset name (``datasets`` is imported lazily).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Union

import torch
from torch import Tensor

from dlm.io import data_root

STYLES = ("lm1b", "owt", "char")
DEFAULT_TOKENIZERS = {"lm1b": "bert-base-uncased", "owt": "gpt2", "char": "char"}
DEFAULT_LENGTHS = {"lm1b": 128, "owt": 1024, "char": 256}


@dataclass(frozen=True)
class SpecialIds:
    """Token ids a BD3-LM needs; ``vocab_size`` includes an added mask id when there was none."""

    bos: int
    eos: int
    mask: int
    pad: int
    vocab_size: int


class CharTokenizer:
    """Character-level tokenizer built in code (no files, no hub): ids 0-4 are ``[PAD] [BOS]
    [EOS] [MASK] [UNK]``, then ``\\n`` and printable ASCII 32..126 in code-point order (vocab 101).
    Any other character encodes as ``[UNK]``. Exposes what :func:`special_ids` and
    :func:`build_dataset` use (``__call__``, ``__len__``, ``*_token_id``) plus ``decode``."""

    SPECIALS = ("[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]")
    CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
    pad_token_id, bos_token_id, eos_token_id, mask_token_id, unk_token_id = range(5)
    cls_token_id = sep_token_id = None
    name_or_path = "char"

    def __init__(self) -> None:
        self.vocab = {tok: i for i, tok in enumerate(self.SPECIALS + tuple(self.CHARS))}
        self._chars = {c: i + len(self.SPECIALS) for i, c in enumerate(self.CHARS)}

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return [self._chars.get(c, self.unk_token_id) for c in text]

    def __call__(self, texts, add_special_tokens: bool = False) -> dict:
        one = isinstance(texts, str)
        ids = [self.encode(t) for t in ([texts] if one else texts)]
        if add_special_tokens:
            ids = [[self.bos_token_id] + i + [self.eos_token_id] for i in ids]
        return {"input_ids": ids[0] if one else ids}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        n = len(self.SPECIALS)
        out = []
        for i in (ids.tolist() if isinstance(ids, Tensor) else ids):
            i = int(i)
            if not 0 <= i < len(self):
                raise ValueError(f"ids: {i} is outside the vocabulary 0..{len(self) - 1}")
            if i >= n:
                out.append(self.CHARS[i - n])
            elif not skip_special_tokens:
                out.append(self.SPECIALS[i])
        return "".join(out)


def char_span(text: str, span: Optional[tuple] = None) -> str:
    """``text[round(lo * n):round(hi * n)]`` for ``span = (lo, hi)`` fractions of its ``n``
    characters (None: all); adjacent spans such as (0, .9) and (.9, 1) are disjoint and cover it."""
    if span is None:
        return text
    if (not isinstance(span, (tuple, list)) or len(span) != 2
            or not all(isinstance(x, (int, float)) for x in span) or not 0 <= span[0] < span[1] <= 1):
        raise ValueError(f"span must be (lo, hi) with 0 <= lo < hi <= 1, got {span!r}")
    n = len(text)
    return text[round(span[0] * n):round(span[1] * n)]


def load_tokenizer(name_or_path: Union[str, os.PathLike]):
    """A transformers tokenizer from a local directory or hub name.

    Falls back to the slow-format classes for bare ``vocab.txt`` (BERT) or
    ``vocab.json`` + ``merges.txt`` (GPT-2) directories, and to the copies under
    the data mirror's ``tokenizers/`` (:func:`dlm.io.data_root`) for the names ``bert-base-uncased`` / ``gpt2``.
    ``char``: :class:`CharTokenizer`.
    """
    if str(name_or_path) == "char":
        return CharTokenizer()
    path, mirrored = Path(name_or_path), data_root() / "tokenizers" / str(name_or_path)
    if not path.is_dir() and mirrored.is_dir():
        path = mirrored
    if path.is_dir():
        if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
            from transformers import GPT2Tokenizer

            return GPT2Tokenizer.from_pretrained(str(path))
        if (path / "vocab.txt").is_file():
            from transformers import BertTokenizer

            return BertTokenizer.from_pretrained(str(path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(name_or_path))


def special_ids(tokenizer) -> SpecialIds:
    """BOS/EOS/mask/pad ids: BERT ``[CLS]/[SEP]/[MASK]/[PAD]``; GPT-2 ``<|endoftext|>`` and an
    added mask id ``len(tokenizer)``."""
    bos = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    eos = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if bos is None or eos is None:
        raise ValueError("tokenizer: needs BOS/CLS and EOS/SEP tokens")
    vocab = len(tokenizer)
    mask = tokenizer.mask_token_id
    if mask is None:
        mask, vocab = vocab, vocab + 1
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return SpecialIds(int(bos), int(eos), int(mask), int(pad), int(vocab))


def read_lines(paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
               max_lines: Optional[int] = None) -> list[str]:
    """Non-empty stripped lines of local text files."""
    files = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[str] = []
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"text file {str(f)!r} does not exist")
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if line:
                    out.append(line)
                    if max_lines is not None and len(out) >= max_lines:
                        return out
    return out


def hf_texts(name: str, split: str = "train", config: Optional[str] = None, field: str = "text",
             max_lines: Optional[int] = None) -> list[str]:
    """Texts of a Hugging Face dataset (lazy ``datasets`` import)."""
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - optional dependency
        raise ImportError(f"loading the HF dataset {name!r} needs the `datasets` package") from e
    ds = datasets.load_dataset(name, config, split=split)
    if max_lines is not None:
        ds = ds.select(range(min(max_lines, len(ds))))
    return [t for t in ds[field] if t and t.strip()]


def wrap_chunks(token_lists: Iterable[list[int]], seq_len: int, bos: Optional[int] = None,
                eos: Optional[int] = None) -> Tensor:
    """Concatenate id lists and cut into (N, seq_len) chunks; with ``bos``/``eos`` each chunk is
    ``[bos] + (seq_len - 2) ids + [eos]``. The incomplete tail is dropped."""
    if not isinstance(seq_len, int) or seq_len < (3 if bos is not None else 1):
        raise ValueError(f"seq_len must be an int >= {3 if bos is not None else 1}, got {seq_len!r}")
    flat = [t for ids in token_lists for t in ids]
    body = seq_len - (2 if bos is not None else 0)
    n = len(flat) // body
    if n == 0:
        raise ValueError(f"dataset is empty: {len(flat)} tokens do not fill one chunk of {seq_len}")
    chunks = torch.tensor(flat[: n * body], dtype=torch.long).view(n, body)
    if bos is not None:
        col = torch.full((n, 1), bos, dtype=torch.long)
        chunks = torch.cat([col, chunks, torch.full((n, 1), eos, dtype=torch.long)], dim=1)
    return chunks


def build_dataset(source: Union[str, os.PathLike, Sequence], style: str = "lm1b", tokenizer=None,
                  seq_len: Optional[int] = None, split: str = "train", max_lines: Optional[int] = None,
                  hf_config: Optional[str] = None, span: Optional[tuple] = None) -> tuple[Tensor, SpecialIds]:
    """Token chunks (N, seq_len) and the special ids for ``source`` in ``style``.

    source: a text file / list of text files / list of strings, or a HF dataset name (``char``:
    one text file or a list of strings, joined with newlines; ``span``: its character span).
    tokenizer: a tokenizer object or name/path (default per style). Empty -> ValueError.
    """
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    if span is not None and style != "char":
        raise ValueError(f"span: only the char style cuts character spans, got style {style!r}")
    seq_len = DEFAULT_LENGTHS[style] if seq_len is None else seq_len
    if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer or DEFAULT_TOKENIZERS[style])
    ids = special_ids(tokenizer)
    if style == "char":
        if isinstance(source, (list, tuple)):
            text = "\n".join(source)
        elif Path(source).is_file():
            text = Path(source).read_text(encoding="utf-8")
        else:
            raise ValueError(f"source: the char style reads a text file or strings, {source!r} is neither")
        text = char_span(text, span)
        if max_lines is not None:
            text = "".join(text.splitlines(keepends=True)[:max_lines])
        if not text:
            raise ValueError(f"dataset {source!r} is empty (span {span})")
        return wrap_chunks([tokenizer(text)["input_ids"]], seq_len), ids
    if isinstance(source, (list, tuple)) and all(isinstance(s, str) and not Path(s).is_file() for s in source):
        texts = [s.strip() for s in source if s.strip()][:max_lines]
    elif isinstance(source, (list, tuple)) or Path(source).exists():
        texts = read_lines(source, max_lines)
    else:
        texts = hf_texts(str(source), split, hf_config, max_lines=max_lines)
    if not texts:
        raise ValueError(f"dataset {source!r} is empty (no non-empty lines / texts)")
    enc = tokenizer(texts, add_special_tokens=False)["input_ids"]
    if style == "lm1b":
        seqs = ([ids.bos] + e + [ids.eos] for e in enc)
        return wrap_chunks(seqs, seq_len), ids
    seqs = (e + [ids.eos] for e in enc)
    return wrap_chunks(seqs, seq_len, bos=ids.bos, eos=ids.eos), ids


def iterate_batches(chunks: Tensor, batch_size: int, *, shuffle: bool = False,
                    generator: Optional[torch.Generator] = None, drop_last: bool = False) -> Iterator[dict]:
    """``{"input_ids": (b, seq_len)}`` batches over the chunks (one pass)."""
    if not isinstance(chunks, Tensor) or chunks.dim() != 2 or chunks.shape[0] == 0:
        raise ValueError("chunks: need a non-empty (N, L) tensor")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    order = torch.randperm(chunks.shape[0], generator=generator) if shuffle else torch.arange(chunks.shape[0])
    for i in range(0, chunks.shape[0], batch_size):
        idx = order[i:i + batch_size]
        if drop_last and idx.numel() < batch_size:
            return
        yield {"input_ids": chunks[idx]}


def batch_fn(chunks: Tensor, batch_size: int):
    """``batch_fn(step, generator)`` for :func:`dlm.train.train`: random rows each step."""
    if not isinstance(chunks, Tensor) or chunks.dim() != 2 or chunks.shape[0] == 0:
        raise ValueError("chunks: need a non-empty (N, L) tensor")

    def fn(step: int, generator: torch.Generator) -> dict:
        idx = torch.randint(0, chunks.shape[0], (batch_size,), generator=generator)
        return {"input_ids": chunks[idx]}

    return fn
