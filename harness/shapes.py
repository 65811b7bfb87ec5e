"""Model shapes of the speed benchmarks: random weights at a named size, or at a real model's shape.

``mid`` is the speed issue's mid shape (d 512, 8 layers, vocab 32000); ``llada8b`` / ``dream7b``
read LLaDA-8B-Instruct's / Dream-7B's ``config.json`` from the data mirror (``../shared/data/models``,
or ``$DLM_SHARED_DATA/models``), so a GPU run measures the real shape without the weights: the
speed-ups of fixed-step strategies do not depend on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dlm.model import ModelConfig, Transformer

REPO = Path(__file__).resolve().parents[1]
#: random-model shapes: ModelConfig fields
SHAPES = {
    "small": dict(vocab_size=4096, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, mlp_hidden=768),
    "mid": dict(vocab_size=32000, d_model=512, n_layers=8, n_heads=8, n_kv_heads=8, mlp_hidden=1408),
    "base": dict(vocab_size=32000, d_model=1024, n_layers=8, n_heads=16, n_kv_heads=8, mlp_hidden=2816),
}
#: real shapes: name -> the model's folder in the data mirror's models/
REAL = {"llada8b": "LLaDA-8B-Instruct", "dream7b": "Dream-v0-Instruct-7B"}
FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden", "qkv_bias", "shift_logits")


def real_shape(name: str) -> dict:
    """ModelConfig fields of a :data:`REAL` model, from its ``config.json`` in the data mirror."""
    from dlm.io import data_root
    from dlm.layouts import config_from_json

    if name not in REAL:
        raise ValueError(f"shape must be one of {sorted(REAL)}, got {name!r}")
    path = data_root() / "models" / REAL[name] / "config.json"
    if not path.is_file():
        raise ValueError(f"shape {name}: {path} does not exist (the data mirror's models/{REAL[name]}/config.json)")
    cfg = config_from_json(json.loads(path.read_text()))
    return {k: getattr(cfg, k) for k in FIELDS}


def random_model(shape: dict, max_seq_len: int, device="cpu", dtype=torch.float32, std: float = 0.02,
                 seed: int = 0, eos: bool = True) -> Transformer:
    """A Transformer of ``shape`` (ModelConfig fields) with N(0, std) weights from ``seed``, built on
    ``device`` (an 8B model never passes through host memory), then cast to ``dtype``. [MASK] is the
    last id; EOS the one before (none without ``eos``)."""
    vocab = shape["vocab_size"]
    cfg = ModelConfig(**shape, max_seq_len=max_seq_len, mask_token_id=vocab - 1,
                      eos_token_id=vocab - 2 if eos else None)
    with torch.device(device):
        model = Transformer(cfg)
    model.reset_parameters(std=std, generator=torch.Generator(device).manual_seed(seed))
    return model.to(dtype).eval()
