"""Shared plumbing of the entry points: their parser (:func:`parser`), how they end
(:func:`run_main`), the common flags (model, device, dtype, seed, threads), threading defaults,
and markdown tables. argparse lives only in entry points; this module builds their parsers.

Every entry point (``python -m experiments.<role>.X``) ends through :func:`run_main`: a user error
(a bad flag value, a missing file or folder, a malformed checkpoint or data file, an output folder
that cannot be written or that another run holds, a full disk) is one line on stderr,
``python -m experiments.<role>.X: error: ...``, and exit status 2, like argparse's own errors; a
bug keeps its traceback. ``DLM_TRACEBACK=1`` shows the traceback of user errors too.

Output folders: :func:`check_out` refuses, before any compute, an ``--out`` that is a file, lies
under a file or cannot be written; :func:`writing_to` also creates it, holds its lock
(:mod:`dlm.locks`) for the run, and removes it again when the run fails before writing anything."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

import torch

from dlm.checkpoints import DTYPES
from dlm.io import DiskFullError, remove_leftover_temps
from dlm.locks import ResultsLockedError, remove_stale_locks, results_lock

REPO = Path(__file__).resolve().parents[1]
#: OS errors that name a path the user gave, or a full disk (any other OS error keeps its traceback)
PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError,
               DiskFullError)


# ------------------------------------------------------------------------------ user errors
class UserError(ValueError):
    """A mistake of the user's (flag value, path, data file): one line on stderr, exit status 2."""


@contextlib.contextmanager
def reading(flag: str, value) -> Iterator[None]:
    """Errors while reading what ``flag`` names (missing, not a checkpoint, malformed) become one
    :class:`UserError` naming the flag and its value (``--model DIR: ...``; ``key=`` flags: ``key=DIR: ...``)."""
    try:
        yield
    except UserError:
        raise
    except (OSError, ValueError) as e:
        raise UserError(f"{flag}{'' if flag.endswith('=') else ' '}{value}: {_message(e)}") from e


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return str(e) or type(e).__name__


def _raised_here(e: BaseException) -> bool:
    """Whether ``e`` was raised by this repository's code (its own checks), not by a library."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    path = Path(tb.tb_frame.f_code.co_filename).resolve()
    return REPO in path.parents and "site-packages" not in path.parts


def user_error(e: BaseException) -> Optional[str]:
    """The one-line message of an exception that means a user error, else None (a bug): a
    :class:`UserError`, an OS error naming a path, or a ValueError raised by this repository's own
    checks (a ValueError from inside torch, numpy or another library is a bug and keeps its traceback)."""
    if isinstance(e, UserError) or isinstance(e, PATH_ERRORS) or (isinstance(e, ValueError) and _raised_here(e)):
        return " ".join(_message(e).split())
    return None


# ---------------------------------------------------------------------------- output folders
def check_out(flag: str, path, kind: str = "dir") -> Path:
    """``path`` (what ``flag`` names: a folder to write into, or with ``kind="file"`` a file) when it
    can be written, else a :class:`UserError` naming the flag and the path: it is a file (a
    folder), it lies under a file, or the folder it would be written in is not writable.
    Creates nothing: every entry point calls it on its output flags before any compute."""
    p = Path(path)
    where = f"{flag} {path}"
    if kind == "dir" and p.exists() and not p.is_dir():
        raise UserError(f"{where}: is a file, not a directory")
    if kind == "file" and p.is_dir():
        raise UserError(f"{where}: is a directory, not a file")
    full = p.absolute()
    existing = next(q for q in (full, *full.parents) if q.exists())
    if existing != full and not existing.is_dir():
        raise UserError(f"{where}: {existing} is a file, not a directory")
    target = existing if existing.is_dir() or existing == full else existing.parent
    if not os.access(target, os.W_OK | (os.X_OK if target.is_dir() else 0)):
        raise UserError(f"{where}: {target} is not writable (permission denied or a read-only file system)")
    return p


@contextlib.contextmanager
def writing_to(flag: str, path) -> Iterator[Path]:
    """Write into the folder ``flag`` names for the ``with`` block: :func:`check_out`, create it,
    hold its lock (another run holding it: a :class:`UserError` naming the flag and that run's pid
    and start time), and remove the temp files and unheld lock files killed runs left there
    (:func:`dlm.io.remove_leftover_temps`, :func:`dlm.locks.remove_stale_locks`). When the block
    raises and the folder was created here and still holds no file, it is removed again."""
    p = check_out(flag, path)
    top = None  # the outermost folder this call creates
    for q in (p.absolute(), *p.absolute().parents):
        if q.exists():
            break
        top = q
    p.mkdir(parents=True, exist_ok=True)
    try:
        try:
            lock = results_lock(p)
            lock.__enter__()
        except ResultsLockedError as e:
            raise UserError(f"{flag} {path}: {e}") from None
        try:
            removed = remove_leftover_temps(p) + remove_stale_locks(p)
            if removed:
                print(f"{path}: removed what an interrupted run left: {', '.join(removed)}", file=sys.stderr)
            yield p
        finally:
            lock.__exit__(None, None, None)
    except BaseException:
        if top is not None and not any(files for _, _, files in os.walk(top)):
            shutil.rmtree(top, ignore_errors=True)
        raise


# ------------------------------------------------------------------------- messages in flags
def flags_of(p: argparse.ArgumentParser) -> dict[str, str]:
    """Each dest of ``p`` and the flag that sets it: ``{"warmup": "--warmup", "gen_length": "--gen-length"}``."""
    return {a.dest: max(a.option_strings, key=len) for a in p._actions if a.option_strings}


#: a field a message names: ``Owner.field`` or ``field`` followed by ``=value``, `` must`` or `` (an option``
_FIELD = re.compile(r"\b(?:[A-Z]\w*\.)?(\w+)(?:(=)|(?=\s+(?:must\b|\(an option)))")


def in_flags(message: str, names: dict[str, str]) -> str:
    """``message`` with every field of ``names`` (field -> flag) it names written as that flag:
    ``TrainConfig.warmup_steps=60 > max_steps=10`` -> ``--warmup 60 > --steps 10``."""
    def flag(m: re.Match) -> str:
        name = names.get(m.group(1))
        return m.group(0) if name is None else name + (" " if m.group(2) else "")

    return _FIELD.sub(flag, message)


#: TrainConfig fields set by a flag of another name; every other field by the flag of its own name
TRAIN_FLAG_DESTS = {"out_dir": "out", "max_steps": "steps", "warmup_steps": "warmup", "ema_decay": "ema"}


def train_config(p: argparse.ArgumentParser, args: argparse.Namespace, **fixed):
    """The run's :class:`dlm.train.TrainConfig`: each field from the flag that sets it (``--steps``
    -> ``max_steps``, :data:`TRAIN_FLAG_DESTS`; else the flag of the field's name), the others
    from ``fixed``. An invalid value is a :class:`UserError` naming the flags, not the fields
    (``--warmup 60 > --steps 10``)."""
    from dlm.train import TrainConfig

    flags, given = flags_of(p), vars(args)
    values, names = {}, {}
    for f in dataclasses.fields(TrainConfig):
        dest = TRAIN_FLAG_DESTS.get(f.name, f.name)
        if f.name not in fixed and dest in given and dest in flags:
            values[f.name], names[f.name] = given[dest], flags[dest]
    try:
        return TrainConfig(**values, **fixed)
    except (TypeError, ValueError) as e:
        raise UserError(in_flags(str(e), names)) from None


def _command(module: str) -> str:
    """What follows ``python -m`` to run ``module`` (``pkg.__main__`` runs as ``pkg``)."""
    return module.removesuffix(".__main__")


def _prog(main: Callable) -> str:
    module = sys.modules.get(main.__module__)
    name = getattr(getattr(module, "__spec__", None), "name", None) or main.__module__
    return f"python -m {_command(name)}"


def run_main(main: Callable, argv: Optional[Sequence[str]] = None) -> None:
    """Run an entry point's ``main(argv)`` and exit: its int return value is the exit status (else
    0); a user error (:func:`user_error`) is one line on stderr and status 2; other exceptions keep
    their traceback. Every ``if __name__ == "__main__"`` of experiments/ and harness/ is ``run_main(main)``."""
    try:
        rc = main(None if argv is None else list(argv))
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading: no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except Exception as e:
        message = None if os.environ.get("DLM_TRACEBACK") else user_error(e)
        if message is None:
            raise
        print(f"{_prog(main)}: error: {message}", file=sys.stderr)
        sys.exit(2)
    sys.exit(rc if type(rc) is int else 0)


# ---------------------------------------------------------------------------------- parsers
class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help with the description kept as written and a wider flag column."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 28, width=None) -> None:
        super().__init__(prog, indent_increment, max_help_position, width)


class _Parser(argparse.ArgumentParser):
    """An entry point's parser: a one-line usage (positionals, required flags, ``[options]``) and
    one-line errors (status 2, as argparse's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")

    def _compact_usage(self) -> str:
        parts = ["%(prog)s"]
        for a in self._actions:
            name = a.metavar or ("{" + ",".join(map(str, a.choices)) + "}" if a.choices else None)
            if not a.option_strings:
                name = name or a.dest
                parts.append(f"[{name}]" if a.nargs in ("?", "*") else name)
            elif a.required:
                parts.append(f"{a.option_strings[-1]} {name or a.dest.upper()}")
        return " ".join(parts + ["[options]"])

    def format_usage(self) -> str:
        self.usage = self.usage or self._compact_usage()
        return super().format_usage()

    def format_help(self) -> str:
        self.usage = self.usage or self._compact_usage()
        return super().format_help()


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an int >= ``minimum``, else argparse's one-line error naming the flag
    (``argument --steps: must be an int >= 1, got '0'``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an int >= {minimum}, got {text!r}")
        return value

    return parse


def add_list_flag(p: argparse.ArgumentParser, flag: str, text: Callable[[], str], help: str) -> None:
    """``flag`` prints ``text()`` and exits 0 (argparse's ``--version`` kind): long lists of names
    stay out of ``--help``."""

    class _Print(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print(text())
            parser.exit(0)

    p.add_argument(flag, nargs=0, action=_Print, help=help)


def parser(module: str, doc: str, paragraphs: int | Sequence[int] = 1,
           epilog: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>`` (the entry point's dotted name; a package's
    ``pkg.__main__`` is run as ``python -m pkg``): its description the first ``paragraphs`` of
    ``doc`` (the module docstring), or those at the given indices; ``--help`` stays short and the
    rest is one ``pydoc`` away."""
    parts = doc.strip("\n").split("\n\n")
    keep = range(paragraphs) if isinstance(paragraphs, int) else paragraphs
    more = f"Details: python -m pydoc {module}"
    return _Parser(prog=f"python -m {_command(module)}", description="\n\n".join(parts[i] for i in keep),
                   formatter_class=_Formatter, epilog=f"{epilog}\n{more}" if epilog else more)


def add_train_args(p: argparse.ArgumentParser, steps: int, lr: float, warmup: int, batch_size: int = 64) -> None:
    """``--steps --batch-size --lr --warmup`` with one meaning in every training entry point (the
    defaults are each recipe's)."""
    count = at_least(1)
    p.add_argument("--steps", type=count, default=steps, metavar="N", help=f"optimizer steps (default {steps})")
    p.add_argument("--batch-size", type=count, default=batch_size, metavar="B",
                   help=f"rows per step (default {batch_size})")
    p.add_argument("--lr", type=float, default=lr, help=f"peak learning rate (default {lr:g})")
    p.add_argument("--warmup", type=int, default=warmup, metavar="N", help=f"warm-up steps (default {warmup})")


def add_shape_args(p: argparse.ArgumentParser, d_model: int, n_layers: int, n_heads: int) -> None:
    """``--d-model --n-layers --n-heads`` of a model trained from scratch."""
    count = at_least(1)
    p.add_argument("--d-model", type=count, default=d_model, metavar="D", help=f"width (default {d_model})")
    p.add_argument("--n-layers", type=count, default=n_layers, metavar="N", help=f"layers (default {n_layers})")
    p.add_argument("--n-heads", type=count, default=n_heads, metavar="N", help=f"heads (default {n_heads})")


def add_run_args(p: argparse.ArgumentParser, model: Optional[str] = None, model_help: str = "checkpoint dir",
                 dtype: str = "auto", device: Optional[str] = None, seed: bool = True) -> None:
    """``--model --device --dtype --threads`` (and ``--seed``) with one meaning everywhere:
    dtype ``auto`` is bfloat16 on CUDA and float32 on the CPU; threads default to the cores that
    no other running process uses (:func:`default_threads`: oversubscribed threads make small
    models several times slower on a shared machine)."""
    p.add_argument("--model", default=model, metavar="DIR",
                   help=model_help if model is None else f"{model_help} (default: {model})")
    p.add_argument("--device", default=device,
                   help=f"torch device (default: {device or 'cuda if available, else cpu'})")
    p.add_argument("--dtype", default=dtype, choices=["auto", *DTYPES], metavar="DTYPE",
                   help=f"auto (bf16 on CUDA, fp32 on CPU) or {'|'.join(DTYPES)} (default {dtype})")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads (default: OMP_NUM_THREADS, else the free cores)")
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

    Measured on the 2-core CI machine (``experiments.eval.gsm8k``, 16 problems, baseline + dual, gen
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
