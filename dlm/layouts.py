"""Checkpoint layouts: how native, LLaDA and Dream (Qwen2) name configs and tensors.

Each layout maps a HF ``config.json`` to a :class:`~dlm.model.ModelConfig` and back, and native
parameter names to the layout's tensor names and back. Nothing here touches weights.
"""

from __future__ import annotations

import re
from typing import Callable

from .model import ModelConfig

NATIVE_TYPE = "dlm"

# native per-layer suffix -> (llada suffix, dream suffix)
_LAYER_NAMES = {
    "attn_norm.weight": ("attn_norm.weight", "input_layernorm.weight"),
    "attn.q_proj.weight": ("q_proj.weight", "self_attn.q_proj.weight"),
    "attn.k_proj.weight": ("k_proj.weight", "self_attn.k_proj.weight"),
    "attn.v_proj.weight": ("v_proj.weight", "self_attn.v_proj.weight"),
    "attn.q_proj.bias": ("q_proj.bias", "self_attn.q_proj.bias"),
    "attn.k_proj.bias": ("k_proj.bias", "self_attn.k_proj.bias"),
    "attn.v_proj.bias": ("v_proj.bias", "self_attn.v_proj.bias"),
    "attn.o_proj.weight": ("attn_out.weight", "self_attn.o_proj.weight"),
    "mlp_norm.weight": ("ff_norm.weight", "post_attention_layernorm.weight"),
    "mlp.gate_proj.weight": ("ff_proj.weight", "mlp.gate_proj.weight"),  # act(ff_proj(x)) * up_proj(x)
    "mlp.up_proj.weight": ("up_proj.weight", "mlp.up_proj.weight"),
    "mlp.down_proj.weight": ("ff_out.weight", "mlp.down_proj.weight"),
}
_GLOBAL_NAMES = {
    "embed.weight": ("model.transformer.wte.weight", "model.embed_tokens.weight"),
    "norm.weight": ("model.transformer.ln_f.weight", "model.norm.weight"),
    "lm_head.weight": ("model.transformer.ff_out.weight", "lm_head.weight"),
}
_LAYER_PREFIX = ("model.transformer.blocks.{i}.", "model.layers.{i}.")
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")


def detect_layout(config: dict) -> str:
    """``native`` | ``llada`` | ``dream`` from a config.json dict; ValueError otherwise."""
    model_type = str(config.get("model_type", "")).lower()
    if model_type == NATIVE_TYPE:
        return "native"
    if model_type == "llada":
        return "llada"
    if model_type in ("dream", "qwen2"):
        return "dream"
    raise ValueError(
        f"unknown model_type {config.get('model_type')!r} in config.json; "
        f"expected one of {NATIVE_TYPE!r}, 'llada', 'Dream'"
    )


def native_to_layout_name(name: str, layout: str) -> str:
    if layout == "native":
        return name
    col = 0 if layout == "llada" else 1
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name][col]
    m = _LAYER_RE.match(name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise KeyError(f"no {layout} name for parameter {name!r}")
    return _LAYER_PREFIX[col].format(i=m.group(1)) + _LAYER_NAMES[m.group(2)][col]


def layout_name_map(param_names, layout: str) -> dict[str, str]:
    """native name -> checkpoint tensor name for every parameter of a model."""
    return {n: native_to_layout_name(n, layout) for n in param_names}


# ------------------------------------------------------------------------------------------
# config.json <-> ModelConfig
# ------------------------------------------------------------------------------------------


def _llada_config(c: dict) -> ModelConfig:
    if not c.get("rope", True) or c.get("alibi", False):
        raise ValueError("only RoPE LLaDA checkpoints are supported (rope=true, alibi=false)")
    d = c["d_model"]
    hidden = c.get("mlp_hidden_size") or c.get("mlp_ratio", 4) * d
    return ModelConfig(
        vocab_size=c.get("embedding_size") or c["vocab_size"],
        d_model=d,
        n_layers=c["n_layers"],
        n_heads=c["n_heads"],
        n_kv_heads=c.get("n_kv_heads") or c["n_heads"],
        mlp_hidden=hidden,
        max_seq_len=c.get("max_sequence_length", 4096),
        rope_theta=float(c.get("rope_theta", 10000.0)),
        norm_eps=float(c.get("rms_norm_eps", 1e-5)),
        qkv_bias=bool(c.get("include_qkv_bias", False) or c.get("include_bias", False)),
        tie_embeddings=bool(c.get("weight_tying", False)),
        shift_logits=False,
        mask_token_id=c.get("mask_token_id", 126336),
        eos_token_id=c.get("eos_token_id"),
        pad_token_id=c.get("pad_token_id"),
        bos_token_id=c.get("bos_token_id"),
        layout="llada",
    )


def _dream_config(c: dict) -> ModelConfig:
    if "mask_token_id" not in c:
        raise ValueError("Dream config.json has no mask_token_id")
    return ModelConfig(
        vocab_size=c["vocab_size"],
        d_model=c["hidden_size"],
        n_layers=c["num_hidden_layers"],
        n_heads=c["num_attention_heads"],
        n_kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
        mlp_hidden=c["intermediate_size"],
        max_seq_len=c.get("max_position_embeddings", 32768),
        rope_theta=float(c.get("rope_theta", 10000.0)),
        norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        qkv_bias=True,
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        shift_logits=True,
        mask_token_id=c["mask_token_id"],
        eos_token_id=c.get("eos_token_id"),
        pad_token_id=c.get("pad_token_id"),
        bos_token_id=c.get("bos_token_id"),
        layout="dream",
    )


def _native_config(c: dict) -> ModelConfig:
    d = {k: v for k, v in c.items() if k not in ("model_type", "torch_dtype", "extra")}
    return ModelConfig.from_dict(d)


_READERS: dict[str, Callable[[dict], ModelConfig]] = {
    "native": _native_config, "llada": _llada_config, "dream": _dream_config,
}


def config_from_json(c: dict) -> ModelConfig:
    layout = detect_layout(c)
    try:
        return _READERS[layout](c)
    except KeyError as e:
        raise ValueError(f"{layout} config.json is missing field {e.args[0]!r}") from None


def config_to_json(cfg: ModelConfig, layout: str) -> dict:
    """A config.json dict in ``layout`` that :func:`config_from_json` reads back to ``cfg``."""
    if layout == "native":
        return {"model_type": NATIVE_TYPE, **cfg.to_dict(), "layout": "native"}
    if layout == "llada":
        if cfg.shift_logits:
            raise ValueError("LLaDA layout cannot store a shift_logits model")
        return {
            "model_type": "llada", "architectures": ["LLaDAModelLM"], "block_type": "llama",
            "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
            "n_kv_heads": cfg.n_kv_heads, "mlp_hidden_size": cfg.mlp_hidden,
            "vocab_size": cfg.vocab_size, "embedding_size": cfg.vocab_size,
            "max_sequence_length": cfg.max_seq_len, "rope": True, "alibi": False,
            "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.norm_eps,
            "include_qkv_bias": cfg.qkv_bias, "include_bias": False,
            "weight_tying": cfg.tie_embeddings, "mask_token_id": cfg.mask_token_id,
            "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
            "bos_token_id": cfg.bos_token_id, "activation_type": "silu",
            "layer_norm_type": "rms",
        }
    if layout == "dream":
        if not (cfg.shift_logits and cfg.qkv_bias):
            raise ValueError("Dream layout needs shift_logits=True and qkv_bias=True")
        return {
            "model_type": "Dream", "architectures": ["DreamModel"],
            "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
            "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
            "intermediate_size": cfg.mlp_hidden, "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_seq_len, "rope_theta": cfg.rope_theta,
            "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
            "mask_token_id": cfg.mask_token_id, "eos_token_id": cfg.eos_token_id,
            "pad_token_id": cfg.pad_token_id, "bos_token_id": cfg.bos_token_id,
            "hidden_act": "silu",
        }
    raise ValueError(f"unknown layout {layout!r}")
