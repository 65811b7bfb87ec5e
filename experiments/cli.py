"""Shared plumbing of the entry points: the common flags (model, device, dtype, seed, threads),
threading defaults, and markdown tables. argparse lives only in entry points; this module only
adds arguments to their parsers."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Iterable, Optional, Sequence

import torch

from dlm.checkpoints import DTYPES


def add_run_args(p: argparse.ArgumentParser, model: Optional[str] = None, model_help: str = "checkpoint dir",
                 dtype: str = "auto", device: Optional[str] = None, seed: bool = True) -> None:
    """``--model --device --dtype --threads`` (and ``--seed``) with one meaning everywhere:
    dtype ``auto`` is bfloat16 on CUDA and float32 on the CPU; threads default to the cores that
    no other running process uses (:func:`default_threads`: oversubscribed threads make small
    models several times slower on a shared machine)."""
    p.add_argument("--model", default=model, help=f"{model_help} (default: {model})")
    p.add_argument("--device", default=device, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default=dtype, choices=["auto", *DTYPES],
                   help=f"parameter dtype (default {dtype}; auto: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: OMP_NUM_THREADS if set, else the cores no other "
                        "running process uses, at least 1)")
    if seed:
        p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def device_of(arg: Optional[str]) -> torch.device:
    return torch.device(arg or ("cuda" if torch.cuda.is_available() else "cpu"))


def dtype_of(arg: str, device: torch.device) -> torch.dtype:
    """``--dtype`` as a torch dtype (``auto``: bfloat16 on CUDA, float32 elsewhere)."""
    if arg == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if arg not in DTYPES:
        raise ValueError(f"--dtype must be 'auto' or one of {sorted(DTYPES)}, got {arg!r}")
    return DTYPES[arg]


def busy_cpus() -> int:
    """Runnable tasks on the machine besides this one, from ``/proc/loadavg``'s instantaneous
    ``running/total`` field (0 where it cannot be read)."""
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, running - 1)


def default_threads() -> int:
    """The cores this process may use minus the ones other running tasks occupy, at least 1.

    Measured on the 2-core CI machine (``experiments.gsm8k``, 16 problems, baseline + dual, gen
    256): alone, 2 threads take 26 s and 1 thread 42 s; two such runs at once take 47 s with 1
    thread each and 224 s with 2 each (oversubscribed intra-op threads spin against each other).
    So: all free cores when the machine is idle, one thread when it is busy."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - busy_cpus())


def set_threads(threads: Optional[int]) -> int:
    """Torch CPU threads: ``threads``, else ``OMP_NUM_THREADS``, else :func:`default_threads`.
    Returns the number set."""
    if threads is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(env) if env.isdigit() and int(env) > 0 else default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads!r}")
    torch.set_num_threads(threads)
    return threads


def markdown_table(header: Sequence[str], rows: Iterable[Sequence], align: Optional[str] = None) -> list[str]:
    """Lines of a markdown table; ``align``: one of ``l``/``r`` per column (default: left)."""
    header = [str(h) for h in header]
    marks = ["---:" if a == "r" else "---" for a in (align or "l" * len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    for row in rows:
        cells = [str(c).replace("|", "\\|") for c in row]
        if len(cells) != len(header):
            raise ValueError(f"a row has {len(cells)} cells, the header {len(header)}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines
