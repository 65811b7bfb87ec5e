"""Atomic writes with ordinary permissions, and the temp leftovers of a killed writer.

Every file this library writes atomically goes to a temp name beside its target and is renamed
into place (``os.replace``), so a reader sees the old complete file or the new one. ``tempfile``
creates temp files 0600 and temp dirs 0700; a plain ``open`` would have given 0666 / 0777 minus
the process umask (0644 / 0755 under the usual 022). :func:`file_mode` / :func:`dir_mode` are
those ordinary modes, and every helper here sets them before the rename, so the written results,
tables and checkpoints are readable by whoever could read a file the process wrote by hand.

:func:`write_dir` writes a directory the same way; :func:`trim_jsonl` rewrites a log without the
records past a point (and a last line cut short). Temp names: ``.<target name>.tmp-<random>`` (files and dirs) and ``.<target name>.old-<random>``
(a directory being replaced); :func:`leftover_temps` finds them (and the names older versions of
``dlm.train`` used: ``tmp-*``, ``old-*``, ``.tmp-*``) so a restarted run can remove them.

A write that fails because the disk is full raises :class:`DiskFullError` naming the file or folder
being written (a library's own error, e.g. torch's ``unexpected pos 256064 vs 255952``, becomes
one when the disk has no room left), and the temp file is gone: the target keeps its old content.

Two more things every writer and reader shares: :func:`stable_json` rounds every float to
:data:`DIGITS` significant digits before it is written, so a rebuild on another CPU, BLAS or numpy
(which move the last bits of a least-squares fit or a reduction) writes the same bytes; and
:func:`data_root` is the one place that says where the data mirror is.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import shutil
import math
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Union

PathLike = Union[str, os.PathLike]
#: name patterns of temp files / dirs left behind when a writer is killed mid-write
TEMP_PATTERNS = (".*.tmp-*", ".*.old-*", "tmp-*", "old-*", ".tmp-*")
#: below this many free bytes a failed write is blamed on a full disk
FULL_BELOW = 1 << 20
#: significant digits every written float keeps: BLAS / CPU / numpy noise (~1e-15 relative) is
#: gone, and a 1e-13 relative change of a fit's inputs moves no written byte
DIGITS = 10
#: the checkout this package lives in; the data mirror's default is ``shared/data`` beside it
CHECKOUT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    """The data mirror, read and never committed (real GSM8K, the LM1B / wikitext / PTB samples,
    tinyshakespeare, offline tokenizers, the real LLaDA / Dream configs, the any-order test sets):
    ``$DLM_SHARED_DATA`` when set, else ``shared/data`` beside the checkout. It may be absent:
    everything that does not name one of its files runs without it."""
    return Path(os.environ.get("DLM_SHARED_DATA") or CHECKOUT.parent / "shared" / "data")


def round_floats(value: Any, digits: int = DIGITS) -> Any:
    """``value`` with every float (in nested dicts, lists and tuples) rounded to ``digits``
    significant digits; -0.0 becomes 0.0, non-finite floats stay as they are."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") + 0.0 if math.isfinite(value) else value
    if isinstance(value, dict):
        return {k: round_floats(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(round_floats(v, digits) for v in value)
    return value


def stable_json(value: Any, **kwargs) -> str:
    """``json.dumps`` of :func:`round_floats` (``value``): the text every results file is written
    with, so its bytes do not depend on the machine's last bits (numpy floats are plain floats)."""
    return json.dumps(round_floats(value), **kwargs)


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (``/proc/self/status``);
    elsewhere by setting and restoring it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of a file created by ``open``: ``0o666`` minus the umask (0644 under umask 022)."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """Mode of a directory created by ``os.mkdir``: ``0o777`` minus the umask (0755 under 022)."""
    return 0o777 & ~current_umask()


def fix_modes(path: PathLike) -> None:
    """Give ``path`` (and, for a directory, everything under it) the ordinary modes of
    :func:`file_mode` / :func:`dir_mode`. Symbolic links are left alone."""
    fmode, dmode = file_mode(), dir_mode()
    path = os.fspath(path)
    if os.path.islink(path):
        return
    if not os.path.isdir(path):
        os.chmod(path, fmode)
        return
    os.chmod(path, dmode)
    for root, dirs, files in os.walk(path):
        for name in dirs:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), dmode)
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), fmode)


class DiskFullError(OSError):
    """A write failed because the disk (or the quota) is full: ``<path>: No space left on device``."""


def free_bytes(path: PathLike) -> int:
    """Free bytes for this user on the filesystem holding ``path`` (or its nearest existing parent)."""
    path = os.path.abspath(os.fspath(path))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def disk_full(error: BaseException, path: PathLike) -> DiskFullError | None:
    """A :class:`DiskFullError` naming ``path`` when ``error`` (raised writing it) means a full disk:
    an ``ENOSPC`` / ``EDQUOT`` OSError, or any other error while fewer than :data:`FULL_BELOW` bytes
    are free (torch, safetensors and numpy report a short write in their own words); else None."""
    if isinstance(error, DiskFullError) or not isinstance(error, Exception):
        return None
    full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
    if not full:
        try:
            full = free_bytes(path) < FULL_BELOW
        except OSError:
            full = False
    return DiskFullError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path)) if full else None


@contextmanager
def atomic_path(path: PathLike) -> Iterator[str]:
    """Yield a temp file path beside ``path``; when the block succeeds the file gets
    :func:`file_mode` and replaces ``path``; when it raises the temp file is removed."""
    path = os.fspath(path)
    parent = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        full = disk_full(e, path)
        if full is not None:
            raise full from e
        raise


def atomic_write_bytes(path: PathLike, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temp file, optional fsync, rename), mode
    :func:`file_mode`; the parent directory is created when missing."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8", fsync: bool = True) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded with ``encoding``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    atomic_write_bytes(path, text.encode(encoding), fsync=fsync)


def temp_dir_for(target: PathLike) -> str:
    """A new empty directory beside ``target`` (created with parents), mode :func:`dir_mode`."""
    target = os.path.abspath(os.fspath(target))
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    os.chmod(tmp, dir_mode())
    return tmp


def replace_dir(tmp: PathLike, target: PathLike) -> None:
    """Give ``tmp`` (a complete directory beside ``target``) ordinary modes and swap it in by
    renames: ``target`` is the old complete directory or the new one, never half-written (briefly
    absent between the two renames). On failure ``tmp`` is removed."""
    tmp, target = os.fspath(tmp), os.path.abspath(os.fspath(target))
    try:
        fix_modes(tmp)
        old = None
        if os.path.lexists(target):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target))
            os.rmdir(old)
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_dir(target: PathLike, write: Callable[[str], None]) -> None:
    """``write(tmp)`` fills a temp dir beside ``target``, which then replaces ``target``
    (:func:`replace_dir`); if ``write`` raises, the temp dir is removed and ``target`` untouched."""
    tmp = temp_dir_for(target)
    try:
        write(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full(e, target)
        if full is not None:
            raise full from e
        raise
    replace_dir(tmp, target)


def trim_jsonl(path: PathLike, keep: Callable[[dict], bool]) -> int:
    """Rewrite the JSONL file ``path`` (atomically, only when something goes) with the records
    ``keep`` accepts; a line cut short by a kill (no newline, bad JSON) goes too. Returns the
    number of lines dropped (0 when ``path`` does not exist)."""
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        lines = f.readlines()
    kept = []
    for line in lines:
        try:
            record = json.loads(line) if line.endswith("\n") else None
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and keep(record):
            kept.append(line)
    if len(kept) != len(lines):
        atomic_write_text(path, "".join(kept), fsync=False)
    return len(lines) - len(kept)


def leftover_temps(directory: PathLike) -> list[str]:
    """Names in ``directory`` that are temp files or dirs of an interrupted atomic write
    (:data:`TEMP_PATTERNS`), sorted; [] when ``directory`` does not exist."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in TEMP_PATTERNS))


def remove_leftover_temps(directory: PathLike) -> list[str]:
    """Remove :func:`leftover_temps` of ``directory``; returns the names removed."""
    removed = leftover_temps(directory)
    for name in removed:
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
    return removed
