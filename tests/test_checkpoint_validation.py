"""A checkpoint is validated whole at load: config keys present and typed (naming file and key), every
tensor used, weights finite, shards inside the folder, BD3-LM metadata consistent, attention enforced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_runs_reliability import one_line_error as _one_line
from tiny import tiny_model, tokenizer_model

from dlm import load_model, save_model
from dlm.checkpoints import load_tokenizer, model_kind, read_config

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "results" / "checkpoints"


# ------------------------------------------------------------------------------------ helpers
@pytest.fixture()
def ok(tmp_path) -> Path:
    return save_model(tiny_model(), None, tmp_path / "ok")


def _edit_config(path: Path, **changes) -> Path:
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))
    return path / "config.json"


def _tensors(path: Path) -> dict:
    return load_file(str(path / "model.safetensors"))


def _write_tensors(path: Path, tensors: dict) -> None:
    save_file(tensors, str(path / "model.safetensors"))


def _harness_ckpt(tmp_path, name: str, extra=None, bd3=None) -> Path:
    from tasks.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model = tokenizer_model(tok)
    if bd3 is not None:
        from bd3lm import BD3Config, save_bd3

        return save_bd3(model, tok, tmp_path / name, BD3Config(block_size=bd3, align="prompt"))
    return save_model(model, tok, tmp_path / name, extra_config=extra)


# ----------------------------------------------------------------------------- config.json
@pytest.mark.parametrize("key", ["mask_token_id", "n_layers", "vocab_size", "shift_logits"])
def test_a_missing_config_key_names_the_file_and_the_key(ok, key):
    file = _edit_config(ok, **{key: None})
    with pytest.raises(ValueError) as e:
        load_model(ok)
    assert str(e.value) == f"{file}: native config: missing key {key!r}"


@pytest.mark.parametrize("layout,key", [("llada", "mask_token_id"), ("dream", "mask_token_id"),
                                        ("llada", "n_layers"), ("dream", "num_hidden_layers")])
def test_llada_and_dream_configs_need_their_keys_too(tmp_path, layout, key):
    over = {"shift_logits": True, "qkv_bias": True} if layout == "dream" else {}
    path = save_model(tiny_model(layout=layout, **over), None, tmp_path / layout, layout=layout)
    file = _edit_config(path, **{key: None})
    with pytest.raises(ValueError, match=f"^{file}: {layout} config: missing key {key!r}$"):
        load_model(path)


@pytest.mark.parametrize("key,value,what", [
    ("tie_embeddings", "no", "a JSON boolean (true / false)"), ("qkv_bias", 1, "a JSON boolean (true / false)"),
    ("n_layers", 2.0, "a JSON integer"), ("n_layers", True, "a JSON integer"), ("mask_token_id", "39", "a JSON integer"),
    ("rope_theta", "1e4", "a JSON number"), ("eos_token_id", [2, 3], "a JSON integer or null")])
def test_config_field_types_are_checked(ok, key, value, what):
    file = _edit_config(ok, **{key: value})
    with pytest.raises(ValueError) as e:
        load_model(ok)
    assert str(e.value) == f"{file}: native config: key {key!r} must be {what}, got {value!r}"


def test_llada_weight_tying_must_be_a_bool(tmp_path):
    path = save_model(tiny_model(layout="llada"), None, tmp_path / "l", layout="llada")
    file = _edit_config(path, weight_tying="no")
    with pytest.raises(ValueError, match=f"^{file}: llada config: key 'weight_tying' must be a JSON boolean"):
        load_model(path)


def test_unknown_config_keys_and_a_foreign_layout_are_refused(ok):
    file = _edit_config(ok, n_layer=2)
    with pytest.raises(ValueError, match=rf"^{file}: native config: unknown key\(s\) \['n_layer'\]"):
        load_model(ok)
    _edit_config(ok, n_layer=None, layout="llada")
    with pytest.raises(ValueError, match="key 'layout' must be 'native'"):
        load_model(ok)


@pytest.mark.parametrize("text,message", [
    ('{"model_type": "dlm",}', "is not valid JSON: Expecting property name enclosed in double quotes (line 1, column 22)"),
    ("[1, 2]", ": expected a JSON object, got a JSON list")])
def test_config_that_is_not_a_json_object_names_the_file(ok, text, message):
    (ok / "config.json").write_text(text)
    with pytest.raises(ValueError) as e:
        read_config(ok)
    assert str(e.value).startswith(str(ok / "config.json")) and str(e.value).endswith(message)


# --------------------------------------------------------------------------------- tensors
def test_tied_embeddings_over_a_stored_head_is_refused(tmp_path):
    path = save_model(tiny_model(), None, tmp_path / "untied")
    file = _edit_config(path, tie_embeddings=True)
    with pytest.raises(ValueError) as e:
        load_model(path)
    assert str(e.value) == (f"{path / 'model.safetensors'}: 1 tensor(s) the model does not use: ['lm_head.weight'] "
                            f"(config.json 'tie_embeddings' is true: the head is the embedding, so 'lm_head.weight' "
                            "would be dropped); refusing to drop them")
    assert file.is_file()


def test_every_stored_tensor_must_be_used(ok):
    t = _tensors(ok)
    _write_tensors(ok, {**t, "layers.7.attn.q_proj.weight": torch.zeros(2, 2), "rotary.inv_freq": torch.ones(4)})
    with pytest.raises(ValueError) as e:
        load_model(ok)
    assert str(e.value) == (f"{ok / 'model.safetensors'}: 2 tensor(s) the model does not use: "
                            "['layers.7.attn.q_proj.weight', 'rotary.inv_freq']; refusing to drop them")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor_and_file(ok, bad):
    t = _tensors(ok)
    t["layers.1.mlp.up_proj.weight"].view(-1)[:3] = bad
    _write_tensors(ok, t)
    with pytest.raises(ValueError) as e:
        load_model(ok)
    assert str(e.value) == (f"{ok / 'model.safetensors'}: tensor 'layers.1.mlp.up_proj.weight' holds 3 non-finite "
                            "value(s) (NaN or inf); refusing to load it")


def test_weights_that_overflow_the_load_dtype_are_refused(ok):
    t = _tensors(ok)
    t["norm.weight"][0] = 1e6  # fine in float64, inf in float16
    _write_tensors(ok, t)
    load_model(ok, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"tensor 'norm.weight' holds 1 non-finite value\(s\) \(NaN or inf\) after "
                                         r"the cast from torch.float64 to torch.float16"):
        load_model(ok, dtype=torch.float16)


# --------------------------------------------------------------------------------- shards
def _sharded(tmp_path) -> Path:
    return save_model(tiny_model(), None, tmp_path / "sharded", max_shard_bytes=20_000)


def _set_shard(path: Path, name: str) -> Path:
    index = path / "model.safetensors.index.json"
    meta = json.loads(index.read_text())
    first = min(meta["weight_map"].values())
    meta["weight_map"] = {k: (name if v == first else v) for k, v in meta["weight_map"].items()}
    index.write_text(json.dumps(meta))
    return index


def test_sharded_checkpoints_still_load(tmp_path):
    path = _sharded(tmp_path)
    assert len(list(path.glob("model-*.safetensors"))) > 1
    load_model(path, dtype=torch.float64)


@pytest.mark.parametrize("name", ["../outside.safetensors", "sub/../../outside.safetensors", "/etc/x.safetensors"])
def test_shard_names_may_not_leave_the_folder(tmp_path, name):
    path = _sharded(tmp_path)
    shutil.copy(next(path.glob("model-00001-*")), tmp_path / "outside.safetensors")
    index = _set_shard(path, name)
    with pytest.raises(ValueError) as e:
        load_model(path)
    assert str(e.value) == f"{index}: shard name {name!r} must be a file name inside {path}"


def test_a_shard_linked_out_of_the_folder_is_refused(tmp_path):
    path = _sharded(tmp_path)
    outside = tmp_path / "outside.safetensors"
    shutil.copy(next(path.glob("model-00001-*")), outside)
    (path / "link.safetensors").symlink_to(outside)
    index = _set_shard(path, "link.safetensors")
    with pytest.raises(ValueError) as e:
        load_model(path)
    assert str(e.value) == f"{index}: shard 'link.safetensors' resolves to {outside}, outside {path}"


def test_a_hub_snapshot_links_into_its_blobs(tmp_path):
    """huggingface_hub's cache: snapshots/<rev>/<file> -> ../../blobs/<hash>, outside the snapshot but in the repo."""
    path = _sharded(tmp_path)
    repo = tmp_path / "hub" / "models--org--name"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(path.iterdir())):
        shutil.copy(f, blobs / f"h{i}")
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / f"h{i}")
    load_model(snap, dtype=torch.float64)


def test_index_and_shards_must_agree(tmp_path):
    path = _sharded(tmp_path)
    index = path / "model.safetensors.index.json"
    meta = json.loads(index.read_text())
    name = next(iter(meta["weight_map"]))
    meta["weight_map"].pop(name)
    index.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"^{index} and the shards disagree on 1 tensor\(s\), e.g. '{name}'"):
        load_model(path)


# --------------------------------------------------------------------------- tokenizer files
def test_a_tokenizer_config_alone_is_an_incomplete_tokenizer(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError) as e:
        load_tokenizer(tmp_path)
    assert str(e.value) == (f"{tmp_path}: incomplete tokenizer: has tokenizer_config.json but none of tokenizer.json / "
                            "tokenizer.model / vocab.json + merges.txt / vocab.txt")


# ------------------------------------------------------------------------ BD3-LM metadata, kind
def test_bd3_metadata_files_must_agree(tmp_path):
    from bd3lm import BD3LM

    path = _harness_ckpt(tmp_path, "bd3", bd3=4)
    (path / "bd3lm.json").write_text(json.dumps({**json.loads((path / "bd3lm.json").read_text()), "block_size": 8}))
    message = (f"{path / 'config.json'} extra.bd3lm and {path / 'bd3lm.json'} disagree: block_size 4 vs 8 "
               "(fix or remove one)")
    for load in (BD3LM.load, load_model, model_kind):
        with pytest.raises(ValueError) as e:
            load(path)
        assert str(e.value) == message


def test_bad_bd3_metadata_names_the_file_and_key(tmp_path):
    from bd3lm import BD3LM

    path = _harness_ckpt(tmp_path, "bd3", bd3=4)
    cfg = json.loads((path / "config.json").read_text())
    cfg["extra"].pop("bd3lm")
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "bd3lm.json").write_text(json.dumps({"block_size": 4, "resample": "no"}))
    with pytest.raises(ValueError, match=f"^{path / 'bd3lm.json'}: resample must be a bool"):
        BD3LM.load(path)
    (path / "bd3lm.json").write_text(json.dumps({"block_size": 4, "blocksize": 4}))
    with pytest.raises(ValueError, match=rf"^{path / 'bd3lm.json'}: unknown key\(s\) \['blocksize'\]"):
        BD3LM.load(path)
    (path / "bd3lm.json").write_text(json.dumps({"block_size": "4"}))
    with pytest.raises(ValueError, match=f"^{path / 'bd3lm.json'}: key 'block_size' must be a positive JSON integer"):
        model_kind(path)


def _expected_kind(name: str):
    if name.startswith("bd3lm-"):
        return "block_causal", int(name.rsplit("-", 1)[1])
    if name == "dream-ar" or name.endswith(("-ar", "-arlong", "-ar-first")):
        return "causal", None
    return "bidirectional", None


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in SHIPPED.iterdir()) if SHIPPED.is_dir() else [])
def test_every_shipped_checkpoint_loads_with_its_kind(name):
    path = SHIPPED / name
    model, tok = load_model(path)
    kind = model_kind(path)
    assert tok is not None and (kind.attention, kind.block_size) == _expected_kind(name)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


# ------------------------------------------------------------------------------ entry points
def test_gsm8k_refuses_a_bd3_checkpoint_as_model(tmp_path, capsys):
    from experiments.eval import gsm8k

    bd3 = _harness_ckpt(tmp_path, "bd3", bd3=4)
    out = tmp_path / "o"
    line = _one_line(gsm8k.main, ["--model", str(bd3), "--strategies", "baseline_semiar", "--limit", "2",
                                  "--gen-length", "8", "--block-length", "4", "--out", str(out)], capsys)
    assert line == (f"python -m experiments.eval.gsm8k: error: --model {bd3} is a block-causal model (block size 4, "
                    f"per {bd3 / 'config.json'} extra.bd3lm), but strategy baseline_semiar (policy 'none') decodes "
                    "with bidirectional attention: pass it as --bd3-model with --strategies bd3lm")
    assert not list(out.glob("*.jsonl")) and not (out / "config.json").exists()


def test_gsm8k_refuses_an_ar_checkpoint_under_a_diffusion_strategy(tmp_path, capsys):
    from experiments.eval import gsm8k

    ar = _harness_ckpt(tmp_path, "ar", extra={"recipe": "ar-sft", "args": {"objective": "ar"}})
    out = tmp_path / "o"
    line = _one_line(gsm8k.main, ["--model", str(ar), "--strategies", "baseline_semiar", "--limit", "2",
                                  "--gen-length", "8", "--block-length", "4", "--out", str(out)], capsys)
    assert line.endswith(f"--model {ar} is a causal (autoregressive) model (per {ar / 'config.json'} "
                         "extra.args.objective 'ar'), but strategy baseline_semiar (policy 'none') decodes with "
                         "bidirectional attention: run it with --strategies ar (or ar_eos, grid autoregressive)")
    assert not list(out.glob("*.jsonl"))


def test_gsm8k_refuses_a_block_length_the_bd3_model_does_not_have(tmp_path, capsys):
    from experiments.eval import gsm8k

    bd3 = _harness_ckpt(tmp_path, "bd3", bd3=4)
    out = tmp_path / "o"
    line = _one_line(gsm8k.main, ["--bd3-model", str(bd3), "--strategies", "bd3lm", "--limit", "2",
                                  "--gen-length", "8", "--block-length", "8", "--out", str(out)], capsys)
    assert line.endswith(f"--block-length 8: strategy bd3lm decodes in the block size of --bd3-model {bd3}, 4 "
                         f"({bd3 / 'config.json'} extra.bd3lm); omit --block-length or pass a --bd3-model of "
                         "block size 8")
    assert not list(out.glob("*.jsonl"))


def test_gsm8k_notes_the_bd3_block_size_beside_other_strategies(tmp_path, capsys):
    """--block-length is the other strategies' here: bd3lm runs in its model's block size, said on stderr."""
    from experiments.eval import gsm8k

    bd3, main = _harness_ckpt(tmp_path, "bd3", bd3=4), _harness_ckpt(tmp_path, "m")
    gsm8k.run(gsm8k.parse_config(["--model", str(main), "--bd3-model", str(bd3), "--strategies", "baseline_semiar",
                                  "bd3lm", "--limit", "2", "--gen-length", "8", "--block-length", "8", "--threads", "1",
                                  "--dtype", "float32", "--out", str(tmp_path / "o")]))
    assert (f"note: --block-length 8 is for the other strategies: strategy bd3lm decodes in the block size of "
            f"--bd3-model {bd3}, 4 ({bd3 / 'config.json'} extra.bd3lm)") in capsys.readouterr().err
    config = json.loads((tmp_path / "o" / "config.json").read_text())["strategies"]
    assert config["bd3lm"]["config"]["strategy"]["block_length"] == 4
    assert config["baseline_semiar"]["config"]["strategy"]["block_length"] == 8


@pytest.mark.parametrize("change,tail", [
    ({"mask_token_id": None}, "native config: missing key 'mask_token_id'"),
    ({"tie_embeddings": "no"}, "native config: key 'tie_embeddings' must be a JSON boolean (true / false), got 'no'")])
def test_gsm8k_names_the_config_file_and_key(tmp_path, capsys, change, tail):
    from experiments.eval import gsm8k

    path = _harness_ckpt(tmp_path, "m")
    file = _edit_config(path, **change)
    line = _one_line(gsm8k.main, ["--model", str(path), "--strategies", "baseline_semiar", "--limit", "2",
                                  "--gen-length", "8", "--block-length", "4", "--out", str(tmp_path / "o")], capsys)
    assert line == f"python -m experiments.eval.gsm8k: error: --model {path}: {file}: {tail}"


def test_gsm8k_with_config_json_absent_is_one_line(tmp_path, capsys):
    from experiments.eval import gsm8k

    path = _harness_ckpt(tmp_path, "m")
    (path / "config.json").unlink()
    line = _one_line(gsm8k.main, ["--model", str(path), "--strategies", "baseline_semiar", "--limit", "2",
                                  "--gen-length", "8", "--block-length", "4", "--out", str(tmp_path / "o")], capsys)
    assert line == f"python -m experiments.eval.gsm8k: error: --model {path}: missing {path / 'config.json'}"


def test_generate_refuses_a_folder_without_a_usable_tokenizer(tmp_path, capsys):
    from experiments.cli import generate

    path = save_model(tiny_model(dtype=torch.float32), None, tmp_path / "notok")
    argv = ["--model", str(path), "--gen-length", "8", "--block-length", "4", "--threads", "1"]
    line = _one_line(generate.main, argv, capsys)
    assert line == (f"python -m experiments.cli.generate: error: --model {path}: no tokenizer files (one of "
                    "tokenizer.json, tokenizer_config.json, vocab.json, tokenizer.model): the prompt cannot be encoded")
    (path / "tokenizer_config.json").write_text("{}")
    line = _one_line(generate.main, argv, capsys)
    assert line == (f"python -m experiments.cli.generate: error: --model {path}: {path}: incomplete tokenizer: has "
                    "tokenizer_config.json but none of tokenizer.json / tokenizer.model / vocab.json + merges.txt / "
                    "vocab.txt")


def test_generate_refuses_a_bd3_checkpoint_under_a_bidirectional_policy(tmp_path, capsys):
    from experiments.cli import generate

    bd3 = _harness_ckpt(tmp_path, "bd3", bd3=4)
    line = _one_line(generate.main, ["--model", str(bd3), "--gen-length", "8", "--block-length", "4",
                                     "--threads", "1"], capsys)
    assert line == (f"python -m experiments.cli.generate: error: --model {bd3} is a block-causal model (block size 4, "
                    f"per {bd3 / 'config.json'} extra.bd3lm), but strategy none_topk (policy 'none') decodes with "
                    "bidirectional attention: run it with --policy exact (the block size comes from the model)")
    capsys.readouterr()
    generate.main(["--model", str(bd3), "--policy", "exact", "--gen-length", "8", "--threads", "1"])
    assert "[exact-topk" in capsys.readouterr().out


def test_the_kind_follows_the_sampler_in_the_core():
    from dlm.kind import ModelKind
    from dlm.spec import Sampler

    s = Sampler.of("x", gen_length=8, block_length=4)
    assert ModelKind("bidirectional", "here").bind(s, "m", {}) is s
    bound = ModelKind("block_causal", "here", 2, "prompt").bind(s.with_(policy="exact"), "m", {})
    policy = bound.components("llada")[0]
    assert (bound.block_length, policy.block_size, policy.align) == (2, 2, "prompt")
    with pytest.raises(ValueError, match="^m is a causal .* decodes with bidirectional attention: do X$"):
        ModelKind("causal", "here").bind(s, "m", {"causal": "do X"})

