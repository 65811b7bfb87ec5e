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
#: the config.json key that ties the LM head to the embedding, per layout
TIE_KEYS = {"native": "tie_embeddings", "llada": "weight_tying", "dream": "tie_word_embeddings"}
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


_REQUIRED = object()
_KINDS = {  # kind -> (check, description)
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a JSON integer"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a JSON number"),
    "bool": (lambda v: isinstance(v, bool), "a JSON boolean (true / false)"),
    "id": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)), "a JSON integer or null"),
    "str": (lambda v: isinstance(v, str), "a JSON string"),
}


def _get(c: dict, key: str, kind: str, default=_REQUIRED):
    """``c[key]`` checked to be of ``kind`` (:data:`_KINDS`); ``default`` when absent, else ValueError
    naming the key. Numbers of kind ``float`` come back as floats."""
    if key not in c:
        if default is _REQUIRED:
            raise ValueError(f"missing key {key!r}")
        return default
    check, what = _KINDS[kind]
    value = c[key]
    if not check(value):
        raise ValueError(f"key {key!r} must be {what}, got {value!r}")
    return float(value) if kind == "float" else value


def _llada_config(c: dict) -> ModelConfig:
    if not _get(c, "rope", "bool", True) or _get(c, "alibi", "bool", False):
        raise ValueError("only RoPE LLaDA checkpoints are supported (keys 'rope': true, 'alibi': false)")
    d = _get(c, "d_model", "int")
    n_heads = _get(c, "n_heads", "int")
    hidden = _get(c, "mlp_hidden_size", "id", None) or _get(c, "mlp_ratio", "int", 4) * d
    return ModelConfig(
        vocab_size=_get(c, "embedding_size", "id", None) or _get(c, "vocab_size", "int"),
        d_model=d,
        n_layers=_get(c, "n_layers", "int"),
        n_heads=n_heads,
        n_kv_heads=_get(c, "n_kv_heads", "id", None) or n_heads,
        mlp_hidden=hidden,
        max_seq_len=_get(c, "max_sequence_length", "int", 4096),
        rope_theta=_get(c, "rope_theta", "float", 10000.0),
        norm_eps=_get(c, "rms_norm_eps", "float", 1e-5),
        qkv_bias=_get(c, "include_qkv_bias", "bool", False) or _get(c, "include_bias", "bool", False),
        tie_embeddings=_get(c, "weight_tying", "bool", False),
        shift_logits=False,
        mask_token_id=_get(c, "mask_token_id", "int"),
        eos_token_id=_get(c, "eos_token_id", "id", None),
        pad_token_id=_get(c, "pad_token_id", "id", None),
        bos_token_id=_get(c, "bos_token_id", "id", None),
        layout="llada",
    )


def _dream_config(c: dict) -> ModelConfig:
    n_heads = _get(c, "num_attention_heads", "int")
    return ModelConfig(
        vocab_size=_get(c, "vocab_size", "int"),
        d_model=_get(c, "hidden_size", "int"),
        n_layers=_get(c, "num_hidden_layers", "int"),
        n_heads=n_heads,
        n_kv_heads=_get(c, "num_key_value_heads", "id", None) or n_heads,
        mlp_hidden=_get(c, "intermediate_size", "int"),
        max_seq_len=_get(c, "max_position_embeddings", "int", 32768),
        rope_theta=_get(c, "rope_theta", "float", 10000.0),
        norm_eps=_get(c, "rms_norm_eps", "float", 1e-6),
        qkv_bias=True,
        tie_embeddings=_get(c, "tie_word_embeddings", "bool", False),
        shift_logits=True,
        mask_token_id=_get(c, "mask_token_id", "int"),
        eos_token_id=_get(c, "eos_token_id", "id", None),
        pad_token_id=_get(c, "pad_token_id", "id", None),
        bos_token_id=_get(c, "bos_token_id", "id", None),
        layout="dream",
    )


#: native config.json: ModelConfig field -> kind; every one required but the optional token ids
_NATIVE_FIELDS = {
    "vocab_size": "int", "d_model": "int", "n_layers": "int", "n_heads": "int", "n_kv_heads": "int",
    "mlp_hidden": "int", "max_seq_len": "int", "rope_theta": "float", "norm_eps": "float", "qkv_bias": "bool",
    "tie_embeddings": "bool", "shift_logits": "bool", "mask_token_id": "int",
}
_NATIVE_IDS = ("eos_token_id", "pad_token_id", "bos_token_id", "eot_token_id")
_NATIVE_OTHER = ("model_type", "torch_dtype", "extra", "layout")


def _native_config(c: dict) -> ModelConfig:
    unknown = sorted(set(c) - set(_NATIVE_FIELDS) - set(_NATIVE_IDS) - set(_NATIVE_OTHER))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} (ModelConfig fields: {sorted([*_NATIVE_FIELDS, *_NATIVE_IDS])})")
    if _get(c, "layout", "str", "native") != "native":
        raise ValueError(f"key 'layout' must be 'native' in a model_type {NATIVE_TYPE!r} config, got {c['layout']!r}")
    values = {k: _get(c, k, kind) for k, kind in _NATIVE_FIELDS.items()}
    return ModelConfig(**values, **{k: _get(c, k, "id", None) for k in _NATIVE_IDS})


_READERS: dict[str, Callable[[dict], ModelConfig]] = {
    "native": _native_config, "llada": _llada_config, "dream": _dream_config,
}


def config_from_json(c) -> ModelConfig:
    """ModelConfig of a config.json dict; a missing key or one of the wrong JSON type is a
    ValueError naming the key (the caller adds the file)."""
    if not isinstance(c, dict):
        raise ValueError(f"expected a JSON object, got a JSON {type(c).__name__}")
    layout = detect_layout(c)
    try:
        return _READERS[layout](c)
    except ValueError as e:
        raise ValueError(f"{layout} config: {e}") from None


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
