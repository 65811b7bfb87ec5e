"""Tiny random models for tests (float64 so implementations can be compared bit-closely)."""

from __future__ import annotations

import torch

from dlm.model import ModelConfig, Transformer


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


def random_prompts(batch: int, length: int, cfg: ModelConfig, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # avoid special ids 0..3 and the mask id
    return torch.randint(4, cfg.mask_token_id, (batch, length), generator=g)


def tokenizer_model(tok, seed: int = 0, max_seq_len: int = 96, dtype=torch.float32) -> Transformer:
    """A 1-layer random model over the embedded tokenizer ``tok`` (its special ids), for harness tests."""
    cfg = ModelConfig(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, mlp_hidden=32,
                      max_seq_len=max_seq_len, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    model = Transformer(cfg)
    model.reset_parameters(std=0.3, generator=torch.Generator().manual_seed(seed))
    return model.to(dtype)
