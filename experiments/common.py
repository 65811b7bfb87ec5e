"""Shared plumbing for experiment scripts: results files that never lose work.

- per-sample JSONL, appended and fsynced one line at a time; a rerun skips ids already written;
- atomic writes (temp file + ``os.replace``) for tables and summaries;
- every results file carries the git SHA and the run's config.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

from dlm.tasks.evaluate import decode_until_stop  # noqa: F401  (re-exported)

REPO = Path(__file__).resolve().parents[1]


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
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


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class JsonlLog:
    """Append-only per-sample results; ``done`` holds the ids already recorded.

    A line cut short by a crash (no trailing newline / invalid JSON) is dropped on open, so a
    killed run resumes with nothing lost or duplicated.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[dict] = []
        if self.path.exists():
            good, text = [], self.path.read_text()
            for line in text.splitlines(keepends=True):
                try:
                    if line.endswith("\n"):
                        self.records.append(json.loads(line))
                        good.append(line)
                except json.JSONDecodeError:
                    pass
            if "".join(good) != text:
                atomic_write_text(self.path, "".join(good))
        self.done = {r["id"] for r in self.records}

    def append(self, records: Iterable[dict]) -> None:
        with open(self.path, "a") as f:
            for r in records:
                if r["id"] in self.done:
                    continue
                f.write(json.dumps(r) + "\n")
                self.records.append(r)
                self.done.add(r["id"])
            f.flush()
            os.fsync(f.fileno())


# --- prompts and decoded answers (shared by experiments.gsm8k and experiments.lm_eval_models) ---

def arith_config_of(model_dir) -> "ArithConfig":
    """The task an embedded checkpoint was trained on (``config.json["extra"]["arith"]``), else
    the default :class:`dlm.tasks.ArithConfig`."""
    from dlm.tasks import ArithConfig

    cfg_file = Path(model_dir) / "config.json"
    extra = (json.loads(cfg_file.read_text()).get("extra") or {}) if cfg_file.is_file() else {}
    if not isinstance(extra.get("arith"), dict):
        return ArithConfig()
    return ArithConfig(**{**extra["arith"], "ops": tuple(extra["arith"].get("ops", ("+", "-")))})


def encode_question(tokenizer, question: str, shots=(), use_chat_template: bool = True) -> list[int]:
    """Token ids of a (few-shot) GSM8K-format prompt.

    With ``use_chat_template`` and a tokenizer that has ``chat_template``, the shots become
    alternating user / assistant turns and the question the last user turn (generation prompt
    added); otherwise :func:`dlm.tasks.format_prompt`. No special tokens are added beyond what
    the template writes.
    """
    from dlm.tasks import format_prompt

    if use_chat_template and getattr(tokenizer, "chat_template", None):
        messages = []
        for shot in shots:
            messages += [{"role": "user", "content": shot.question},
                         {"role": "assistant", "content": shot.answer}]
        messages.append({"role": "user", "content": question})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = format_prompt(question, shots)
    return tokenizer.encode(text, add_special_tokens=False)


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


def read_jsonl(path: Path) -> list[dict]:
    """Complete records of a JSONL file, read-only (a line cut short by a crash is skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines(keepends=True):
        if not line.endswith("\n"):
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def merge_logs(path: Path, sources: Iterable[Path], order_key: str = "index") -> int:
    """Merge ``path`` and ``sources`` into ``path``: deduplicated by ``id`` (first seen wins,
    ``path`` first), sorted by ``order_key``, written atomically. Idempotent. Returns the count."""
    seen: dict = {}
    for src in [Path(path), *sources]:
        for r in read_jsonl(src):
            seen.setdefault(r["id"], r)
    records = sorted(seen.values(), key=lambda r: (r.get(order_key, 0), str(r["id"])))
    atomic_write_text(Path(path), "".join(json.dumps(r) + "\n" for r in records))
    return len(records)
