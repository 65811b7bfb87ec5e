"""Tiny random models and prompt batches for tests: the one place test models are built.

Families (float64 unless stated, so implementations can be compared bit-closely):

- :func:`tiny_model`: the native LLaDA-layout model (vocab 40, 2 layers, [MASK] = 39, EOS = 2,
  pad = 0, BOS = 1); :func:`tiny_dream` is the same with Dream's shifted logits and q/k/v bias.
- :func:`fastdllm_model`: the Fast-dLLM tests' model (vocab 64, wider init, random q/k/v biases,
  a zero [MASK] head row, optional EOS push), memoized.
- :func:`micro_model`: the float32 1-layer model of the training / objective tests (vocab 16).
- :func:`tokenizer_model`: a 1-layer model over an embedded tokenizer's ids.

The fixtures of ``conftest.py`` wrap these; modules import them directly where they need
arguments (layers, seeds, overrides).
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from dlm.model import ModelConfig, Transformer


# ------------------------------------------------------------------------------ the tiny model
def tiny_config(**overrides) -> ModelConfig:
    base = dict(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=48,
                max_seq_len=128, rope_theta=10000.0, mask_token_id=39, eos_token_id=2,
                pad_token_id=0, bos_token_id=1)
    base.update(overrides)
    return ModelConfig(**base)


def tiny_model(seed: int = 0, dtype=torch.float64, **overrides) -> Transformer:
    model = Transformer(tiny_config(**overrides))
    model.reset_parameters(std=0.3, generator=torch.Generator().manual_seed(seed))
    return model.to(dtype).eval()


def tiny_dream(seed: int = 0, dtype=torch.float64, **overrides) -> Transformer:
    """:func:`tiny_model` as a Dream-style model: shifted logits and q/k/v bias (zero-initialised)."""
    return tiny_model(seed, dtype, **{"shift_logits": True, "qkv_bias": True, **overrides})


def random_prompts(batch: int, length: int, cfg: ModelConfig, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # avoid special ids 0..3 and the mask id
    return torch.randint(4, cfg.mask_token_id, (batch, length), generator=g)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of token ids -> left-padded ids (B, P) and attention mask (B, P), P the longest row."""
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), P, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):] = torch.as_tensor(r, dtype=torch.long)
        mask[i, P - len(r):] = 1
    return ids, mask


def padded_prompts(cfg: ModelConfig, lengths: Sequence[int] = (5, 3, 4), seed: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of random prompts with ``lengths`` real tokens: ids (B, P), mask (B, P)."""
    rows = [random_prompts(1, n, cfg, seed=seed + i)[0].tolist() for i, n in enumerate(lengths)]
    return left_pad(rows, cfg.pad_token_id)


def unpad(ids: torch.Tensor, mask: torch.Tensor, row: int) -> torch.Tensor:
    """Row ``row`` of a left-padded batch without its padding: (1, P_row)."""
    return ids[row][mask[row].bool()][None]


# ------------------------------------------------------------------------------ Fast-dLLM tests
def fastdllm_config(n_layers: int = 2, shift: bool = False) -> ModelConfig:
    """vocab 64, [MASK] = 63, EOS = 1, pad = 2, no BOS; ``shift``: Dream (shifted logits + bias)."""
    return tiny_config(vocab_size=64, mlp_hidden=64, max_seq_len=64, mask_token_id=63, eos_token_id=1,
                       pad_token_id=2, bos_token_id=None, n_layers=n_layers, shift_logits=shift, qkv_bias=shift)


def fastdllm_prompts(padded: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(3, 6) prompts for :func:`fastdllm_model`; with ``padded`` rows have 6, 3, 4 real tokens
    (left padding) and the attention mask (3, 6), else None."""
    ids = torch.randint(3, 60, (3, 6), generator=torch.Generator().manual_seed(1))
    if not padded:
        return ids, None
    lengths = torch.tensor([6, 3, 4])
    am = (torch.arange(6)[None] >= 6 - lengths[:, None]).long()
    return torch.where(am.bool(), ids, torch.full_like(ids, fastdllm_config().pad_token_id)), am


@functools.lru_cache(maxsize=None)
def fastdllm_model(n_layers: int = 2, shift: bool = False, seed: int = 0, eos_bias: float = 0.0) -> Transformer:
    """Memoized (never mutate it): std-0.5 init, random q/k/v biases, [MASK] head row zero (a
    trained model never proposes [MASK]); ``eos_bias`` pushes the EOS logit up along the mean
    answer hidden state of :func:`fastdllm_prompts`."""
    cfg = fastdllm_config(n_layers, shift)
    g = torch.Generator().manual_seed(seed)
    model = Transformer(cfg).double()
    model.reset_parameters(std=0.5, generator=g)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):  # Dream has q/k/v biases; make them matter
                p.normal_(0.0, 0.5, generator=g)
        model.lm_head.weight[cfg.mask_token_id] = 0.0  # like a trained model: [MASK] is (almost) never proposed
        if eos_bias:  # push the EOS logit up along the mean answer hidden state
            x = torch.cat([fastdllm_prompts()[0], torch.full((3, 24), cfg.mask_token_id)], dim=1)
            h = model(x, return_hidden=True)[:, 6:].reshape(-1, cfg.d_model).mean(0)
            model.lm_head.weight[cfg.eos_token_id] += eos_bias * h / h.pow(2).sum()
    return model.eval()


# ------------------------------------------------------------------------------ training tests
def micro_config(**overrides) -> ModelConfig:
    """vocab 16, 1 layer, d_model 16, [MASK] = 15, no EOS (``eos_token_id=`` to set one)."""
    base = dict(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, mlp_hidden=32,
                max_seq_len=32, mask_token_id=15)
    base.update(overrides)
    return ModelConfig(**base)


def micro_model(seed: int = 0, **overrides) -> Transformer:
    """float32, default (std 0.02) init, train mode."""
    model = Transformer(micro_config(**overrides))
    model.reset_parameters(generator=torch.Generator().manual_seed(seed))
    return model


# ------------------------------------------------------------------------------ tokenizer models
def tokenizer_model(tok, seed: int = 0, max_seq_len: int = 96, dtype=torch.float32, **overrides) -> Transformer:
    """A 1-layer random model over the embedded tokenizer ``tok`` (its special ids), for harness tests."""
    cfg = ModelConfig(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, mlp_hidden=32,
                      max_seq_len=max_seq_len, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, **overrides)
    model = Transformer(cfg)
    model.reset_parameters(std=0.3, generator=torch.Generator().manual_seed(seed))
    return model.to(dtype)
