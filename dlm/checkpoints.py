"""Load and save HF-format model directories: native, LLaDA and Dream layouts.

A directory holds ``config.json``, ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``) and, optionally, tokenizer files. :func:`load_model` builds the
model on the meta device and assigns the checkpoint tensors directly (an 8B model is never
materialised twice), checking every expected tensor name and shape first.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Union

import torch

from .io import write_dir
from .kind import ModelKind, read_json, read_kind
from .layouts import TIE_KEYS, config_from_json, config_to_json, layout_name_map
from .model import ModelConfig, Transformer

PathLike = Union[str, os.PathLike]
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
#: the files that hold a vocabulary, one set of them is needed beside any tokenizer file
VOCAB_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))
#: the one dtype table (command-line names -> torch dtypes); the short aliases are accepted too
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
_DTYPES = {**DTYPES, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _as_dtype(dtype) -> Optional[torch.dtype]:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise TypeError(f"dtype must be a torch.dtype or one of {sorted(_DTYPES)}, got {dtype!r}")


def _as_device(device) -> torch.device:
    """``device`` (None = CPU) as a torch.device that exists on this machine, else ValueError."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ValueError(f"device {device!r} is not a valid torch device (e.g. 'cpu', 'cuda', 'cuda:0'): "
                         f"{err}") from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(dev)!r} requested but torch.cuda.is_available() is False")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(dev)!r} requested but torch.cuda.device_count() is "
                             f"{torch.cuda.device_count()}")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {str(dev)!r} requested but torch.backends.mps.is_available() is False")
    return dev


def resolve_path(path_or_id: PathLike) -> Path:
    """A local directory, or a hub id downloaded with ``huggingface_hub`` (lazy import)."""
    path = Path(path_or_id)
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"path_or_hub_id {str(path)!r} is a file, expected a checkpoint directory")
    if str(path_or_id).count("/") == 1 and not str(path_or_id).startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download
        except ImportError as e:  # pragma: no cover
            raise FileNotFoundError(f"{path_or_id!r} is not a directory and huggingface_hub is missing") from e
        return Path(snapshot_download(str(path_or_id)))
    raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist")


def read_config(path: PathLike) -> tuple[ModelConfig, dict]:
    """ModelConfig and the raw config.json dict of a checkpoint directory; a missing, malformed or
    incomplete config.json is an error naming the file (and the key)."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"missing {cfg_file}")
    raw = read_json(cfg_file)
    try:
        return config_from_json(raw), raw
    except ValueError as e:
        raise ValueError(f"{cfg_file}: {e}") from None


def model_kind(path_or_hub_id: PathLike) -> ModelKind:
    """The attention the checkpoint was trained with (:mod:`dlm.kind`), read from its metadata."""
    path = resolve_path(path_or_hub_id)
    return read_kind(path, read_config(path)[1])


def _shard_file(path: Path, name, index: Path) -> Path:
    """The shard ``name`` of ``index``, refused unless it is a plain file name inside ``path`` (no
    absolute path, no ``..``, no link out of the folder; a Hub snapshot's links into its blobs are fine)."""
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts \
            or "\\" in name:
        raise ValueError(f"{index}: shard name {name!r} must be a file name inside {path}")
    root = path.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith(("models--", "datasets--")):
        root = root.parent.parent  # huggingface_hub cache: snapshots/<rev>/x -> ../../blobs/<hash>
    file = path / name
    if root not in file.resolve().parents:
        raise ValueError(f"{index}: shard {name!r} resolves to {file.resolve()}, outside {path}")
    return file


def _weight_files(path: Path) -> dict[str, Path]:
    """tensor name -> file, from the shard index (checked against the shards' own tensor lists)
    or the single weights file."""
    index = path / INDEX
    if index.is_file():
        meta = read_json(index)
        weight_map = meta.get("weight_map") if isinstance(meta, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no weight_map object")
        listed = {name: _shard_file(path, f, index) for name, f in weight_map.items()}
        files: dict[str, Path] = {}
        for shard in sorted(set(listed.values())):
            if not shard.is_file():
                raise FileNotFoundError(f"missing weight shard {shard} (listed in {index})")
            files.update((name, shard) for name in _safetensor_keys(shard))
        wrong = sorted(n for n in set(listed) | set(files) if listed.get(n) != files.get(n))
        if wrong:
            n = wrong[0]
            raise ValueError(f"{index} and the shards disagree on {len(wrong)} tensor(s), e.g. {n!r}: index says "
                             f"{listed[n].name if n in listed else 'nothing'}, found in "
                             f"{files[n].name if n in files else 'no shard'}")
        return files
    single = path / WEIGHTS
    if not single.is_file():
        raise FileNotFoundError(f"missing weight file {single} (and no {INDEX})")
    return {name: single for name in _safetensor_keys(single)}


def weights_fingerprint(path_or_hub_id: PathLike, full_limit: int = 256 << 20) -> str:
    """Short content hash of a checkpoint's weight files, for results files and resume checks.

    Files up to ``full_limit`` bytes are hashed whole; bigger shards (an 8B model) contribute their
    size, their safetensors header and 64 evenly spaced 64 KiB windows, which tells two trainings
    apart without reading 16 GB. Raises like :func:`load_model` when the weights are missing.
    """
    path = resolve_path(path_or_hub_id)
    h = hashlib.sha256()
    for file in sorted(set(_weight_files(path).values())):
        size = file.stat().st_size
        h.update(f"{file.name}:{size}:".encode())
        with open(file, "rb") as f:
            if size <= full_limit:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
                continue
            header = int.from_bytes(f.read(8), "little")
            h.update(f.read(min(header, full_limit)))
            for i in range(64):
                f.seek(i * (size - (64 << 10)) // 63)
                h.update(f.read(64 << 10))
    return h.hexdigest()[:12]


def _safetensor_keys(file: Path) -> list[str]:
    from safetensors import safe_open

    with _reading(file):
        with safe_open(str(file), framework="pt") as f:
            return list(f.keys())


@contextmanager
def _reading(file: Path):
    """Relabel only the weight file's own format errors (a safetensors header that does not parse,
    a file cut short) as corruption, keeping the cause; any other error (out of memory, a device
    that fails) keeps its type and gets a note naming the file."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as err:
        raise ValueError(f"cannot read weight file {file} (truncated or corrupt): {err}") from err
    except Exception as err:
        err.add_note(f"while reading weight file {file}")
        raise


def _read_tensors(files: dict[str, Path], wanted: dict[str, str], device, dtype) -> dict[str, torch.Tensor]:
    """Load checkpoint tensors named in ``wanted`` (ckpt name -> native name); a floating tensor with
    a NaN or inf (as stored, or after the cast to ``dtype``) is a ValueError naming it and its file."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for ckpt_name in wanted:
        by_file.setdefault(files[ckpt_name], []).append(ckpt_name)
    out = {}
    for file, names in by_file.items():
        with _reading(file):
            with safe_open(str(file), framework="pt", device=str(device)) as f:
                for n in names:
                    stored = f.get_tensor(n)
                    t = stored.to(dtype) if dtype is not None and stored.is_floating_point() else stored
                    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                        cast = bool(torch.isfinite(stored).all())  # finite as stored: the cast overflowed
                        bad = int((~torch.isfinite(t if cast else stored)).sum())
                        raise ValueError(f"{file}: tensor {n!r} holds {bad} non-finite value(s) (NaN or inf)"
                                         f"{f' after the cast from {stored.dtype} to {t.dtype}' if cast else ''}"
                                         "; refusing to load it")
                    out[wanted[n]] = t
    return out


def _check_all_used(path: Path, cfg: ModelConfig, files: dict[str, Path], used: set[str]) -> None:
    """Every tensor in the weight files is one the model uses, else a ValueError naming them and their file."""
    unused = sorted(set(files) - used)
    if not unused:
        return
    by_file: dict[Path, list[str]] = {}
    for n in unused:
        by_file.setdefault(files[n], []).append(n)
    file, names = next(iter(by_file.items()))
    head = layout_name_map(["lm_head.weight"], cfg.layout)["lm_head.weight"]
    why = (f" (config.json {TIE_KEYS[cfg.layout]!r} is true: the head is the embedding, so {head!r} would be "
           "dropped)" if cfg.tie_embeddings and head in unused else "")
    more = f" and {len(unused) - len(names)} more in other shards" if len(unused) > len(names) else ""
    raise ValueError(f"{file}: {len(names)} tensor(s) the model does not use: {names[:5]}"
                     f"{' ...' if len(names) > 5 else ''}{more}{why}; refusing to drop them")


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape that a ``cfg`` model needs, in ``cfg.layout`` naming."""
    with torch.device("meta"):
        model = Transformer(cfg)
    names = layout_name_map([n for n, _ in model.named_parameters()], cfg.layout)
    return {names[n]: tuple(p.shape) for n, p in model.named_parameters()}


def load_tokenizer(path: PathLike, layout: str = "native"):
    """``transformers.AutoTokenizer`` from the directory, or None when it has no tokenizer files.

    Dream ships a remote-code ``DreamTokenizer``; it is a Qwen2 BPE tokenizer, so it is loaded as
    ``Qwen2Tokenizer`` without running remote code.
    """
    path = Path(path)
    present = [f for f in TOKENIZER_FILES if (path / f).is_file()]
    if not present:
        return None
    if not any(all((path / f).is_file() for f in files) for files in VOCAB_FILES):
        raise ValueError(f"{path}: incomplete tokenizer: has {', '.join(present)} but none of "
                         f"{' / '.join(' + '.join(files) for files in VOCAB_FILES)}")
    from transformers import AutoTokenizer

    tok_cfg_file = path / "tokenizer_config.json"
    tok_cfg = read_json(tok_cfg_file) if tok_cfg_file.is_file() else {}
    if not isinstance(tok_cfg, dict):
        raise ValueError(f"{tok_cfg_file}: expected a JSON object, got {tok_cfg!r}")
    if tok_cfg.get("auto_map") and tok_cfg.get("tokenizer_class") == "DreamTokenizer":
        from transformers import Qwen2Tokenizer

        return Qwen2Tokenizer.from_pretrained(str(path))
    if (path / "tokenizer.json").is_file() and tok_cfg.get("tokenizer_class") in (
            "PreTrainedTokenizerFast", "TokenizersBackend"):
        from transformers import PreTrainedTokenizerFast  # skips AutoConfig's look at config.json

        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def load_model(path_or_hub_id: PathLike, dtype=torch.float32, device=None):
    """Load ``(model, tokenizer)`` from a native, LLaDA or Dream HF-format directory.

    dtype: parameter dtype (default float32; pass ``torch.bfloat16`` for the 7-8B checkpoints).
    device: where the tensors are loaded (default CPU); an invalid device string, or a device this
    machine does not have (``'cuda'`` without CUDA), is a ValueError before any file is read.
    The tokenizer is None when the directory has no tokenizer files. The model is in eval mode.
    The checkpoint is checked whole first: config keys present and typed, every tensor expected
    present and every stored tensor used, all weights finite, shard names inside the folder, its
    BD3-LM metadata consistent; each failure is a ValueError naming the file and the key or tensor.
    A weight file that does not parse (bad header, cut short) is a ValueError naming the file with
    the safetensors error as its cause; other errors (e.g. out of memory) keep their type.
    """
    dtype = _as_dtype(dtype)
    device = _as_device(device)
    path = resolve_path(path_or_hub_id)
    cfg, raw = read_config(path)
    read_kind(path, raw)  # its BD3-LM metadata, when there is some, is consistent
    tokenizer = load_tokenizer(path, cfg.layout)
    if tokenizer is not None and cfg.eot_token_id is None:
        eot = tokenizer.convert_tokens_to_ids("<|eot_id|>") if "<|eot_id|>" in tokenizer.get_vocab() else None
        if eot is not None:
            cfg = ModelConfig.from_dict({**cfg.to_dict(), "eot_token_id": eot})
    files = _weight_files(path)
    with torch.device("meta"):
        model = Transformer(cfg)
    name_map = layout_name_map([n for n, _ in model.named_parameters()], cfg.layout)
    missing = [c for c in name_map.values() if c not in files]
    if missing:
        raise ValueError(f"checkpoint {path} is missing tensor(s) {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''} ({len(missing)} in all)")
    _check_all_used(path, cfg, files, set(name_map.values()))
    tensors = _read_tensors(files, {c: n for n, c in name_map.items()}, device, dtype)
    for n, p in model.named_parameters():
        if tuple(tensors[n].shape) != tuple(p.shape):
            raise ValueError(f"{files[name_map[n]]}: tensor {name_map[n]!r} has shape {tuple(tensors[n].shape)}, "
                             f"expected {tuple(p.shape)}")
    model.load_state_dict(tensors, strict=True, assign=True)
    return model.eval(), tokenizer


def save_model(model: Transformer, tokenizer, out_dir: PathLike, dtype=None, layout: str = "native",
               extra_config: Optional[dict] = None, max_shard_bytes: Optional[int] = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (+ tokenizer files) atomically.

    layout: ``native`` (default), ``llada`` or ``dream`` naming (for tiny test checkpoints in the
    real layouts). dtype: storage dtype (e.g. ``torch.bfloat16``). extra_config: JSON-able
    metadata stored under ``config.json["extra"]`` (e.g. BD3-LM block size, schedule clipping).
    max_shard_bytes: split into ``model-0000k-of-0000n.safetensors`` + index when set.
    The directory is written beside ``out_dir`` and renamed into place, so ``out_dir`` is always
    either the old complete checkpoint or the new one.
    """
    from safetensors.torch import save_file

    dtype = _as_dtype(dtype)
    out_dir = Path(out_dir)
    cfg_json = config_to_json(model.config, layout)
    if extra_config:
        cfg_json["extra"] = extra_config
    if dtype is not None:
        cfg_json["torch_dtype"] = str(dtype).removeprefix("torch.")
    names = layout_name_map([n for n, _ in model.named_parameters()], layout)
    tensors = {}
    for n, p in model.named_parameters():
        t = p.detach()
        t = t.to(dtype) if dtype is not None else t
        tensors[names[n]] = t.to("cpu").contiguous()

    def write(tmp: str) -> None:
        (Path(tmp) / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")
        if max_shard_bytes is None:
            save_file(tensors, str(Path(tmp) / WEIGHTS), metadata={"format": "pt"})
        else:
            _save_sharded(tensors, Path(tmp), max_shard_bytes)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    write_dir(out_dir, write)  # ordinary file / dir modes (not tempfile's 0600 / 0700), then the swap
    return out_dir


def _save_sharded(tensors: dict[str, torch.Tensor], out: Path, max_bytes: int) -> None:
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
