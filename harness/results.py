"""Shared plumbing for experiment scripts: results files that never lose work and are never
silently wrong.

- per-sample JSONL, appended and fsynced one batch at a time; a rerun skips ids already written;
- one writer at a time: :func:`results_lock` (an ``fcntl.flock`` on ``<file>.lock`` /
  ``<dir>/.lock``), held by every :class:`JsonlLog` for its lifetime; readers never lock;
- strict loading: a repeated id, a corrupt or id-less line, invalid UTF-8 raise ValueError naming
  the file and line; only a last line without its newline (a crash mid-write) is dropped;
- atomic writes (temp file + ``os.replace``) for tables and summaries;
- every results file carries the git SHA and the run's config.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Iterable, Optional, Union

from tasks.evaluate import decode_until_stop  # noqa: F401  (re-exported)
from dlm.locks import (ResultsLockedError, acquire_lock, lock_file_of, release_lock,  # noqa: F401
                       results_lock)  # re-exported: callers import them from here

REPO = Path(__file__).resolve().parents[1]


def git_sha() -> str:
    """HEAD, plus ``-dirty`` when tracked files outside ``results/`` differ from it. ``results/``
    holds outputs that the runs themselves rewrite (tables, reproduce.json): counting them made
    every SHA taken after a run's first write ``-dirty``, even on a clean clone."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)results"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def repo_relative(path) -> str:
    """``path`` relative to the repository when it lies inside it (a hub id or an outside path is
    returned as given), so results files and config hashes do not depend on where the checkout is."""
    p = Path(str(path))
    if p.exists():
        try:
            return p.resolve().relative_to(REPO).as_posix()
        except ValueError:
            pass
    return str(path)


def config_hash(config: dict) -> str:
    return hashlib.sha1(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:10]


def sample_shas(folder: Path, pattern: str = "*.jsonl") -> str:
    """The git SHAs that produced the samples under ``folder`` (what a table built from them
    records, rather than the commit that rebuilt the table)."""
    shas = {str(r["git_sha"]) for f in sorted(Path(folder).glob(pattern)) for r in read_jsonl(f) if r.get("git_sha")}
    return " ".join(sorted(shas)) or "not recorded (samples written before SHAs were recorded)"


def write_if_changed(path: Path, content: Union[str, bytes]) -> bool:
    """Write ``content`` atomically (temp file, fsync, rename; mode ``0o666 & ~umask``, not
    ``mkstemp``'s 0600: :func:`dlm.io.atomic_write_bytes`) unless ``path`` already holds exactly
    it, so a rebuild that changes nothing rewrites nothing. True when written."""
    from dlm.io import atomic_write_bytes

    path = Path(path)
    data = content.encode() if isinstance(content, str) else content
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    atomic_write_bytes(path, data)
    return True


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`write_if_changed` for text (every table and summary writer uses it)."""
    write_if_changed(path, text)


# --- per-sample JSONL: strict loading, one writer ---

def _parse_line(path: Path, number: int, offset: int, raw: bytes) -> dict:
    """The record of one complete line; ValueError naming the file and line otherwise."""
    where = f"{path}: line {number}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: invalid UTF-8 at byte offset {offset + e.start} of the file") from None
    if not text.strip():
        raise ValueError(f"{where}: empty line (every line must be one JSON record)")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); only a last line without "
                         "its newline (a write cut short) is dropped: repair or delete this line") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a JSON {type(record).__name__} where a record (object) was expected")
    rid = record.get("id")
    if rid is None:
        raise ValueError(f"{where}: record without an 'id'")
    if isinstance(rid, (list, dict)):
        raise ValueError(f"{where}: 'id' must be a string or a number, got {rid!r}")
    return record


def _parse_jsonl(path: Path, data: bytes) -> tuple[list[tuple[int, str, dict]], bool]:
    """(line number, line text, record) of every complete line of ``data``, and whether a last
    line without its newline was dropped (noted on stderr)."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    out, offset = [], 0
    for number, raw in enumerate(lines, 1):
        out.append((number, raw.decode("utf-8", "replace"), _parse_line(path, number, offset, raw)))
        offset += len(raw) + 1
    if tail:
        print(f"{path}: line {len(lines) + 1} has no trailing newline (a write cut short by a crash, or "
              f"one still in progress): dropped ({len(tail)} bytes)", file=sys.stderr)
    return out, bool(tail)


def _first_of_each_id(path: Path, numbered: list[tuple[int, str, dict]], dedupe: bool) -> list[tuple[int, str, dict]]:
    """``numbered`` without repeated ids: ValueError on the first repeat unless ``dedupe``, which
    keeps the first of each and says how many were dropped."""
    first: dict = {}
    kept = []
    for number, text, record in numbered:
        rid = record["id"]
        if rid not in first:
            first[rid] = number
            kept.append((number, text, record))
        elif not dedupe:
            raise ValueError(f"{path}: id {rid!r} is repeated (lines {first[rid]} and {number}); the file "
                             "holds two results for one sample: pass dedupe=True to keep the first of each")
    if len(kept) < len(numbered):
        print(f"{path}: dedupe=True dropped {len(numbered) - len(kept)} repeated-id records (kept the first "
              "of each)", file=sys.stderr)
    return kept


def _load_jsonl(path: Path, dedupe: bool) -> tuple[list[tuple[int, str, dict]], bool]:
    """The unique records of ``path`` (none when absent) and whether the file needs rewriting."""
    if not path.exists():
        return [], False
    numbered, truncated = _parse_jsonl(path, path.read_bytes())
    kept = _first_of_each_id(path, numbered, dedupe)
    return kept, truncated or len(kept) < len(numbered)


def read_jsonl(path: Path, *, dedupe: bool = False) -> list[dict]:
    """The records of a JSONL results file, read-only and without locking ([] when absent).

    Strict: an unparsable, empty, non-object or id-less line, invalid UTF-8 or a repeated id
    raise ValueError naming the file and line(s); ``dedupe=True`` keeps the first record of each
    id instead. Only a last line without its newline (a write cut short) is skipped, with a note.
    """
    return [record for _, record in read_numbered(path, dedupe=dedupe)]


def read_json(path: Path, *fields: str):
    """The JSON value of a results file (a table's .json, a bench's record), refused with one line
    naming the file when it is missing or unparsable, or, with ``fields``, not an object holding
    each of them."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (its plan job writes it: python -m experiments.reproduce --list)")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if fields and not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    missing = [f for f in fields if f not in data]
    if missing:
        raise ValueError(f"{path}: no field {missing[0]!r}")
    return data


def read_numbered(path: Path, *, dedupe: bool = False) -> list[tuple[int, dict]]:
    """:func:`read_jsonl` with each record's line number (for messages that name the line)."""
    return [(number, record) for number, _, record in _load_jsonl(Path(path), dedupe)[0]]


def _file_state(path: Path) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class JsonlLog:
    """Append-only per-sample results of one writer; ``records`` / ``done`` hold what is written.

    Opening takes :func:`results_lock` on the file for the log's lifetime (released by
    :meth:`close`, the ``with`` block, garbage collection or process exit), so a second run
    writing the same file fails at once naming the holder. ``shared=True`` is for processes that
    split the work on one file: each append takes the lock (waiting up to ``wait`` s) and first
    re-reads what the others wrote. Loading is strict as :func:`read_jsonl` (``dedupe=True``
    rewrites the file with the first record of each id); a last line cut short by a crash is
    dropped from the file, so a killed run resumes with nothing lost or duplicated. An id already
    in the file is never appended again.
    """

    def __init__(self, path: Path, *, dedupe: bool = False, shared: bool = False, wait: float = 60.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.dedupe, self.shared, self.wait = dedupe, shared, wait
        self.records: list[dict] = []
        self.done: set = set()
        self._state: Optional[tuple] = None
        self._closed = False
        key = None if shared else acquire_lock(self.path)
        self._finalizer = weakref.finalize(self, release_lock, key) if key else None
        try:
            with self._append_lock():
                self._load()
        except BaseException:
            self.close()
            raise

    def _append_lock(self):
        return results_lock(self.path, self.wait) if self.shared else contextlib.nullcontext()

    def _load(self) -> None:
        kept, rewrite = _load_jsonl(self.path, self.dedupe)
        if rewrite:
            atomic_write_text(self.path, "".join(text + "\n" for _, text, _ in kept))
        self.records = [record for _, _, record in kept]
        self.done = {r["id"] for r in self.records}
        self._state = _file_state(self.path)

    def append(self, records: Iterable[dict]) -> None:
        """Append the records whose id is not in the file yet (fsynced)."""
        if self._closed:
            raise ValueError(f"JsonlLog({self.path}) is closed")
        with self._append_lock():
            if _file_state(self.path) != self._state:  # written by another log since (merge, shared)
                self._load()
            fresh, ids = [], set(self.done)
            for r in records:
                if not isinstance(r, dict) or r.get("id") is None:
                    raise ValueError(f"JsonlLog({self.path}).append: records must be dicts with an 'id', got {r!r:.80}")
                if r["id"] not in ids:
                    ids.add(r["id"])
                    fresh.append(r)
            if fresh:
                self._write(fresh)

    def _write(self, fresh: list[dict]) -> None:
        text = "".join(json.dumps(r) + "\n" for r in fresh)
        self._state = None  # re-read on the next append should this write fail half-way
        with open(self.path, "a") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        self.records += fresh
        self.done.update(r["id"] for r in fresh)
        self._state = _file_state(self.path)

    def close(self) -> None:
        """Release the file's lock; ``records`` stay readable, ``append`` is refused."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> "JsonlLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- prompts and decoded answers (shared by experiments.eval.gsm8k and experiments.cli.lm_eval_models) ---

def arith_config_of(model_dir) -> "ArithConfig":
    """The task an embedded checkpoint was trained on (``config.json["extra"]["arith"]``), else
    the default :class:`tasks.ArithConfig`."""
    from tasks import ArithConfig

    cfg_file = Path(model_dir) / "config.json"
    extra = (json.loads(cfg_file.read_text()).get("extra") or {}) if cfg_file.is_file() else {}
    if not isinstance(extra.get("arith"), dict):
        return ArithConfig()
    return ArithConfig(**{**extra["arith"], "ops": tuple(extra["arith"].get("ops", ("+", "-")))})


def prompt_text(tokenizer, question: str, shots=(), use_chat_template: bool = True) -> str:
    """The text of a (few-shot) GSM8K-format prompt.

    With ``use_chat_template`` and a tokenizer that has ``chat_template``, the shots become
    alternating user / assistant turns and the question the last user turn (generation prompt
    added); otherwise :func:`tasks.format_prompt`.
    """
    from tasks import format_prompt

    if use_chat_template and getattr(tokenizer, "chat_template", None):
        messages = []
        for shot in shots:
            messages += [{"role": "user", "content": shot.question},
                         {"role": "assistant", "content": shot.answer}]
        messages.append({"role": "user", "content": question})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return format_prompt(question, shots)


def encode_question(tokenizer, question: str, shots=(), use_chat_template: bool = True) -> list[int]:
    """Token ids of :func:`prompt_text`; no special tokens are added beyond what the template
    writes (checked encoding of a whole problem set: :func:`harness.prompt_checks.encode_prompts`)."""
    return tokenizer.encode(prompt_text(tokenizer, question, shots, use_chat_template), add_special_tokens=False)


def apply_stop_strings(text: str, until: Iterable[str]) -> str:
    """``text`` cut at the earliest occurrence of any non-empty stop string."""
    cut = len(text)
    for s in until:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


# --- multi-process runs: per-rank logs merged by rank 0 ---

def rank_log_path(path: Path, rank: int) -> Path:
    """``<dir>/<name>.rank{r}.jsonl`` for ``<dir>/<name>.jsonl``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def rank_log_paths(path: Path) -> list[Path]:
    """Existing per-rank logs of ``path``, sorted by rank."""
    path = Path(path)
    found = []
    for p in path.parent.glob(f"{path.stem}.rank*{path.suffix}"):
        tag = p.name[len(path.stem) + len(".rank"):-len(path.suffix)]
        if tag.isdigit():
            found.append((int(tag), p))
    return [p for _, p in sorted(found)]


def merge_logs(path: Path, sources: Iterable[Path], order_key: str = "index") -> int:
    """Merge ``path`` and ``sources`` into ``path`` under its lock: deduplicated by ``id`` across
    files (first seen wins, ``path`` first), sorted by ``order_key``, written atomically.
    Idempotent. Each file is read strictly (a repeated id within one file is a ValueError, as in
    :func:`read_jsonl`). Returns the count."""
    with results_lock(path):
        seen: dict = {}
        for src in [Path(path), *sources]:
            for r in read_jsonl(src):
                seen.setdefault(r["id"], r)
        records = sorted(seen.values(), key=lambda r: (r.get(order_key, 0), str(r["id"])))
        atomic_write_text(Path(path), "".join(json.dumps(r) + "\n" for r in records))
    return len(records)
