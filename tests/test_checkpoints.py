"""Checkpoint layouts (native, LLaDA, Dream): meta-device checks of the real 8B/7B configs,
round trips, numerical equivalence with transformers' Llama/Qwen2, and bad checkpoints."""

import json
import shutil

import pytest
import torch

from conftest import find_shared_data
from dlm import load_model, save_model
from dlm.attention import causal_mask
from dlm.checkpoints import expected_tensors, read_config
from dlm.layouts import config_from_json
from dlm.model import ModelConfig, Transformer
from tiny import random_prompts, tiny_model


def _real_config(name: str) -> ModelConfig:
    return config_from_json(json.loads(find_shared_data(f"models/{name}/config.json").read_text()))


def test_llada_8b_layout_on_meta_device(shared_data):
    cfg = _real_config("LLaDA-8B-Instruct")
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.mlp_hidden) == (4096, 32, 32, 32, 12288)
    assert cfg.mask_token_id == 126336 and cfg.eos_token_id == 126081 and not cfg.shift_logits
    exp = expected_tensors(cfg)
    assert len(exp) == 1 + 32 * 9 + 2
    assert exp["model.transformer.wte.weight"] == (126464, 4096)
    assert exp["model.transformer.ff_out.weight"] == (126464, 4096)
    assert exp["model.transformer.ln_f.weight"] == (4096,)
    for i in (0, 31):
        p = f"model.transformer.blocks.{i}."
        assert exp[p + "q_proj.weight"] == (4096, 4096)
        assert exp[p + "k_proj.weight"] == (4096, 4096)
        assert exp[p + "v_proj.weight"] == (4096, 4096)
        assert exp[p + "attn_out.weight"] == (4096, 4096)
        assert exp[p + "ff_proj.weight"] == (12288, 4096)
        assert exp[p + "up_proj.weight"] == (12288, 4096)
        assert exp[p + "ff_out.weight"] == (4096, 12288)
        assert exp[p + "attn_norm.weight"] == exp[p + "ff_norm.weight"] == (4096,)
    assert not any("bias" in n for n in exp)
    assert 7.9e9 < cfg.num_params() < 8.1e9


def test_dream_7b_layout_on_meta_device(shared_data):
    cfg = _real_config("Dream-v0-Instruct-7B")
    assert cfg.shift_logits and cfg.qkv_bias and cfg.mask_token_id == 151666
    exp = expected_tensors(cfg)
    assert len(exp) == 1 + 28 * 12 + 2
    assert exp["model.embed_tokens.weight"] == (152064, 3584)
    assert exp["lm_head.weight"] == (152064, 3584)
    p = "model.layers.27."
    assert exp[p + "self_attn.q_proj.weight"] == (3584, 3584)
    assert exp[p + "self_attn.q_proj.bias"] == (3584,)
    assert exp[p + "self_attn.k_proj.weight"] == (512, 3584)  # 4 KV heads x 128
    assert exp[p + "self_attn.v_proj.bias"] == (512,)
    assert exp[p + "self_attn.o_proj.weight"] == (3584, 3584)
    assert exp[p + "mlp.gate_proj.weight"] == (18944, 3584)
    assert exp[p + "mlp.down_proj.weight"] == (3584, 18944)
    assert exp[p + "input_layernorm.weight"] == exp[p + "post_attention_layernorm.weight"] == (3584,)
    assert 7.5e9 < cfg.num_params() < 7.7e9


@pytest.mark.parametrize("layout,overrides", [
    ("native", {}), ("native", {"tie_embeddings": True}),
    ("llada", {}), ("dream", {"shift_logits": True, "qkv_bias": True}),
])
def test_round_trip(tmp_path, layout, overrides):
    model = tiny_model(**overrides, layout=layout)
    save_model(model, None, tmp_path / "ckpt", layout=layout)
    loaded, tok = load_model(tmp_path / "ckpt", dtype=torch.float64)
    assert tok is None
    assert loaded.config == model.config
    x = random_prompts(2, 10, model.config)
    torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)


def test_sharded_and_bf16(tmp_path):
    model = tiny_model(layout="llada")
    save_model(model, None, tmp_path / "s", layout="llada", dtype=torch.bfloat16, max_shard_bytes=20_000)
    assert (tmp_path / "s" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "s").glob("model-*.safetensors"))) > 1
    loaded, _ = load_model(tmp_path / "s")
    assert next(loaded.parameters()).dtype == torch.float32
    ref = model.to(torch.bfloat16).to(torch.float32)
    for (n, a), (_, b) in zip(loaded.named_parameters(), ref.named_parameters()):
        assert torch.equal(a, b), n
    bf, _ = load_model(tmp_path / "s", dtype="bf16")
    assert next(bf.parameters()).dtype == torch.bfloat16


def test_save_is_atomic_replace(tmp_path):
    a, b = tiny_model(seed=0), tiny_model(seed=1)
    save_model(a, None, tmp_path / "m")
    save_model(b, None, tmp_path / "m")
    loaded, _ = load_model(tmp_path / "m", dtype=torch.float64)
    x = random_prompts(1, 6, a.config)
    torch.testing.assert_close(loaded(x), b(x), atol=0, rtol=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp dirs left


def _hf_llama_from(model: Transformer):
    transformers = pytest.importorskip("transformers")
    c = model.config
    hf_cfg = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.mlp_hidden,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_embeddings, attention_bias=False, mlp_bias=False)
    return transformers, hf_cfg


def test_llada_layout_matches_transformers_llama(tmp_path):
    """A LLaDA block is a LLaMA block: under a causal mask our model reproduces
    transformers' LlamaForCausalLM loaded from the same (renamed) tensors."""
    model = tiny_model(layout="llada", n_kv_heads=2)
    transformers, hf_cfg = _hf_llama_from(model)
    save_model(model, None, tmp_path / "l", layout="llada")
    from safetensors.torch import load_file
    sd = load_file(str(tmp_path / "l" / "model.safetensors"))
    rename = {"model.transformer.wte.weight": "model.embed_tokens.weight",
              "model.transformer.ln_f.weight": "model.norm.weight",
              "model.transformer.ff_out.weight": "lm_head.weight"}
    sub = {"attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
           "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj", "ff_norm": "post_attention_layernorm",
           "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "ff_out": "mlp.down_proj"}
    hf_sd = {}
    for k, v in sd.items():
        if k in rename:
            hf_sd[rename[k]] = v
        else:
            _, _, _, i, part, w = k.split(".")
            hf_sd[f"model.layers.{i}.{sub[part]}.{w}"] = v
    hf = transformers.LlamaForCausalLM(hf_cfg).double().eval()
    hf.load_state_dict(hf_sd, strict=True)
    x = random_prompts(2, 12, model.config)
    with torch.no_grad():
        ref = hf(x).logits
        ours = model(x, attn_mask=causal_mask(torch.arange(12), 12))
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)  # HF builds RoPE tables in fp32


def test_dream_layout_matches_transformers_qwen2(tmp_path):
    """Dream = Qwen2 weights + bidirectional attention + shifted logits: under a causal mask,
    our Dream model's logit i equals Qwen2ForCausalLM's logit i-1."""
    transformers = pytest.importorskip("transformers")
    model = tiny_model(layout="dream", shift_logits=True, qkv_bias=True, n_kv_heads=2)
    save_model(model, None, tmp_path / "d", layout="dream")
    c = model.config
    hf_cfg = transformers.Qwen2Config(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.mlp_hidden,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_embeddings)
    from safetensors.torch import load_file
    hf = transformers.Qwen2ForCausalLM(hf_cfg).double().eval()
    hf.load_state_dict(load_file(str(tmp_path / "d" / "model.safetensors")), strict=True)
    x = random_prompts(2, 12, model.config)
    with torch.no_grad():
        ref = hf(x).logits
        ours = model(x, attn_mask=causal_mask(torch.arange(12), 12))
    torch.testing.assert_close(ours[:, 1:], ref[:, :-1], atol=1e-5, rtol=0)  # HF RoPE tables are fp32


def test_dream_tokenizer_loads_without_remote_code(tmp_path, shared_data):
    src = find_shared_data("models/Dream-v0-Instruct-7B")
    ckpt = tmp_path / "dream"
    model = tiny_model(layout="dream", shift_logits=True, qkv_bias=True, vocab_size=151667 + 1,
                       mask_token_id=151666, eos_token_id=151643, tie_embeddings=True, d_model=8,
                       n_heads=2, n_kv_heads=1, mlp_hidden=8, n_layers=1)
    save_model(model, None, ckpt, layout="dream", dtype=torch.bfloat16)
    for f in ("tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json"):
        shutil.copy(src / f, ckpt / f)
    loaded, tok = load_model(ckpt)
    assert tok is not None and tok.mask_token == "<|mask|>"
    assert tok.mask_token_id == loaded.config.mask_token_id
    assert tok.eos_token_id == loaded.config.eos_token_id
    ids = tok("What is 2 + 3?", return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == "What is 2 + 3?"


def test_bad_checkpoints(tmp_path):
    model = tiny_model()
    save_model(model, None, tmp_path / "ok")
    # unknown model_type
    bad = tmp_path / "bad_type"
    shutil.copytree(tmp_path / "ok", bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt-j"}))
    with pytest.raises(ValueError, match="unknown model_type"):
        load_model(bad)
    # missing tensor
    from safetensors.torch import load_file, save_file
    miss = tmp_path / "missing"
    shutil.copytree(tmp_path / "ok", miss)
    sd = load_file(str(miss / "model.safetensors"))
    sd.pop("layers.1.mlp.up_proj.weight")
    save_file(sd, str(miss / "model.safetensors"))
    with pytest.raises(ValueError, match="layers.1.mlp.up_proj.weight"):
        load_model(miss)
    # truncated weight file
    trunc = tmp_path / "trunc"
    shutil.copytree(tmp_path / "ok", trunc)
    data = (trunc / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated"):
        load_model(trunc)
    # no weights, no config, no dir
    now = tmp_path / "noweights"
    shutil.copytree(tmp_path / "ok", now)
    (now / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(now)
    (now / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        read_config(now)
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "does-not-exist")
    with pytest.raises(TypeError, match="dtype"):
        load_model(tmp_path / "ok", dtype="float13")


def test_weights_fingerprint_follows_content_not_path(tmp_path):
    from dlm.checkpoints import weights_fingerprint

    model = tiny_model()
    a = save_model(model, None, tmp_path / "a")
    b = save_model(model, None, tmp_path / "b")
    assert weights_fingerprint(a) == weights_fingerprint(b)
    assert weights_fingerprint(a, full_limit=64) == weights_fingerprint(b, full_limit=64)  # sampled mode
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1.0
    save_model(model, None, b)
    assert weights_fingerprint(a) != weights_fingerprint(b)
    with pytest.raises(FileNotFoundError):
        weights_fingerprint(tmp_path / "missing")


def test_load_model_device_errors_are_not_called_corruption(tmp_path, monkeypatch):
    save_model(tiny_model(), None, tmp_path / "ok")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device 'cuda' requested but torch\.cuda\.is_available\(\) is False") as e:
        load_model(tmp_path / "ok", device="cuda")
    assert "corrupt" not in str(e.value)
    with pytest.raises(ValueError, match=r"device 'cuda:1'"):
        load_model(tmp_path / "ok", device=torch.device("cuda", 1))
    with pytest.raises(ValueError, match=r"device 'gpu0' is not a valid torch device") as e:
        load_model(tmp_path / "ok", device="gpu0")
    assert "corrupt" not in str(e.value)


def test_weight_read_errors_keep_their_cause_and_name_the_file(tmp_path, monkeypatch):
    import safetensors

    save_model(tiny_model(), None, tmp_path / "ok")
    weights = tmp_path / "ok" / "model.safetensors"
    data = weights.read_bytes()
    # a real format error: relabelled, the safetensors error kept as the cause
    weights.write_bytes(data[:-100])
    with pytest.raises(ValueError, match="truncated or corrupt") as e:
        load_model(tmp_path / "ok")
    assert str(weights) in str(e.value) and isinstance(e.value.__cause__, safetensors.SafetensorError)
    weights.write_bytes(data)
    # anything else (out of memory, a device error) keeps its type and names the file in a note
    import safetensors as st

    real_open = st.safe_open

    class Boom:
        """safe_open whose tensor reads run out of memory."""

        def __init__(self, *args, **kwargs):
            self.real = real_open(*args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def keys(self):
            return list(self.real.keys())

        def get_tensor(self, name):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(st, "safe_open", Boom)
    with pytest.raises(torch.OutOfMemoryError, match="out of memory") as e:
        load_model(tmp_path / "ok")
    assert "corrupt" not in str(e.value)
    assert any(str(weights) in note for note in getattr(e.value, "__notes__", []))
