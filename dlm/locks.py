"""One writer at a time: exclusive advisory locks (``fcntl.flock``) on results files and folders.

A lock file beside the locked path records the holder (pid, host, start time); the kernel
releases a flock when its process dies, so a lock left by a killed run is taken over (with a
note), and :func:`remove_stale_locks` removes the ones no process holds. A second writer fails at
once with :class:`ResultsLockedError` naming the holder. The harness locks its results folders
and files, :func:`dlm.train.train` its run folder: one implementation, here in the core.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Optional


class ResultsLockedError(ValueError):
    """Another process holds the lock of a results file or directory."""


#: this process's locks: (pid, lock file) -> [fd, holders]; re-entrant within one process
_HELD: dict[tuple[int, str], list] = {}
_HELD_GUARD = threading.Lock()


def lock_file_of(path) -> Path:
    """The lock file of a results path: ``<dir>/.lock`` for an existing directory, ``<file>.lock``
    for a file (existing or not; its name needs a suffix, so a directory that does not exist yet
    is never mistaken for a file: that would give it two lock files)."""
    p = Path(path)
    if p.is_dir():
        return p / ".lock"
    if not p.exists() and not p.suffix:
        raise ValueError(f"results_lock: {p} does not exist; create the directory first (or name a file "
                         "with a suffix, e.g. .jsonl)")
    return p.with_name(p.name + ".lock")


def _holder_of(text: str) -> dict:
    """The holder record in a lock file's text ({} when empty or unreadable)."""
    try:
        holder = json.loads(text or "{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict) -> str:
    if not holder:
        return "an unknown process (its lock file names no holder yet)"
    return f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('since')}"


def _locked_error(path, lock: Path) -> ResultsLockedError:
    holder = {}
    for _ in range(20):  # the holder writes its record just after taking the lock
        with contextlib.suppress(OSError):
            holder = _holder_of(lock.read_text())
        if holder:
            break
        time.sleep(0.01)
    return ResultsLockedError(f"{path} is locked by {_describe(holder)} (another run is writing there; "
                              f"lock file {lock})")


def _try_flock(lock: Path) -> Optional[int]:
    """An fd of ``lock`` holding its flock, or None when another open file holds it. Retries
    when the file was unlinked / replaced between open and flock (a holder releasing it)."""
    for _ in range(100):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise ResultsLockedError(f"{lock}: the lock file keeps being replaced; is something deleting it?")


def _take_over(fd: int, lock: Path) -> None:
    """Record this process as the holder; note a record left by a process that died holding it."""
    old = _holder_of(os.read(fd, 4096).decode("utf-8", "replace").strip())
    if old:
        gone = old.get("host") == socket.gethostname() and not _alive(old.get("pid"))
        print(f"results_lock: taking over {lock} left by {_describe(old)} "
              f"({'that process is gone' if gone else 'it no longer holds the lock'})", file=sys.stderr)
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except OSError:  # exists, not ours
        pass
    return True


def acquire_lock(path, wait: float = 0.0) -> tuple[int, str]:
    """Take the lock of ``path`` (see :func:`results_lock`); returns the key for :func:`release_lock`."""
    lock = lock_file_of(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    key = (os.getpid(), str(lock.resolve()))
    deadline = time.monotonic() + wait
    while True:
        with _HELD_GUARD:
            if key in _HELD:
                _HELD[key][1] += 1
                return key
            fd = _try_flock(lock)
            if fd is not None:
                _take_over(fd, lock)
                _HELD[key] = [fd, 1]
                return key
        if time.monotonic() >= deadline:
            raise _locked_error(path, lock)
        time.sleep(0.05)


def release_lock(key: tuple[int, str]) -> None:
    """Drop one hold of ``key``; the last one removes the lock file and releases the flock.
    A no-op in another process (a forked child) and for a key not held."""
    pid, lock = key
    with _HELD_GUARD:
        entry = _HELD.get(key)
        if pid != os.getpid() or entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _HELD[key]
        fd = entry[0]
        try:
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                os.unlink(lock)
        except OSError:
            pass
        os.close(fd)  # never LOCK_UN: a forked child sharing the fd would lose the lock with us


@contextlib.contextmanager
def results_lock(path, wait: float = 0.0) -> Iterator[Path]:
    """Hold the exclusive advisory lock of a results file or directory for the ``with`` block.

    The lock is an ``fcntl.flock`` on :func:`lock_file_of` ``(path)`` (a directory must exist to
    be locked as one), which records the holder's pid, host and start time. Another process
    asking for it fails after ``wait`` seconds (default: at once) with :class:`ResultsLockedError`
    (a ValueError): "<path> is locked by pid N on host H since T (another run is writing there)".
    The kernel drops the flock of a process that dies, so a stale lock file is simply taken over
    (with a note on stderr). Re-entrant within one process. Yields the lock file.
    """
    key = acquire_lock(path, wait)
    try:
        yield Path(key[1])
    finally:
        release_lock(key)


def remove_stale_locks(directory) -> list[str]:
    """Remove the lock files in ``directory`` (``*.lock``, ``.lock``) that no process holds: left
    by a killed run (e.g. ``<strategy>.rank0.jsonl.lock`` of a killed torchrun). A held one (by
    another process, or by this one) stays. Returns the names removed ([] when ``directory`` does
    not exist)."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".lock"))
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for name in names:
        lock = Path(directory) / name
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a holder's flock (ours too) refuses this
        except BlockingIOError:
            os.close(fd)
            continue
        try:  # whoever opens it next finds it replaced and retries (_try_flock)
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                os.unlink(lock)
                removed.append(name)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed
