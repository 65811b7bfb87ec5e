"""Tests for dlm.tokenizer (generic word-level tokenizer) and tasks.tokenizer (the embedded one):
closed vocabulary, exact round trip, save/load."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tasks import DEFAULT_TEMPLATE, ArithConfig, fewshot_examples, format_prompt, generate_problems
from tasks.tokenizer import build_tokenizer, default_vocabulary
from dlm.tokenizer import SPACE, SPECIAL_TOKENS, build_word_tokenizer, load_tokenizer, save_tokenizer


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def test_special_tokens_fixed_order(tok):
    assert [tok.pad_token, tok.bos_token, tok.eos_token, tok.mask_token, tok.unk_token] == list(SPECIAL_TOKENS.values())
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.mask_token_id, tok.unk_token_id] == [0, 1, 2, 3, 4]
    assert len(set(tok.all_special_ids)) == 5
    # Special tokens are recognised inside text and no specials are added implicitly.
    assert tok.encode("<|mask|><|mask|>") == [tok.mask_token_id] * 2
    assert tok.encode("Answer") == [tok.convert_tokens_to_ids("Answer")]


@pytest.mark.parametrize("config", [ArithConfig(), ArithConfig(ops=("+", "-", "*"), min_steps=2, max_steps=4)])
def test_task_text_has_no_unk_and_round_trips(tok, config):
    for split in ("train", "test"):
        for p in generate_problems(config, 1000, split, seed=11):
            text = format_prompt(p.question) + DEFAULT_TEMPLATE.completion(p.answer)
            ids = tok.encode(text)
            assert tok.unk_token_id not in ids, text
            assert tok.decode(ids) == text


def test_digits_are_single_tokens_and_space_free(tok):
    tokens = tok.convert_ids_to_tokens(tok.encode("12 + 7 = 19\n#### 19"))
    assert tokens == ["1", "2", f"{SPACE}+", SPACE, "7", f"{SPACE}=", SPACE, "1", "9", "\n", "####", SPACE, "1", "9"]


def test_whitespace_is_preserved_exactly(tok):
    text = "  Ann  has\n\n 3 apples .\n"
    assert tok.decode(tok.encode(text)) == text


def test_unknown_words_map_to_unk(tok):
    ids = tok.encode("Ann has 3 zebras")
    assert ids[-1] == tok.unk_token_id and ids.count(tok.unk_token_id) == 1
    assert tok.unk_token_id in tok.encode("caf\u00e9")


def test_fewshot_prompt_lengths(tok):
    query = generate_problems(ArithConfig(), 1, "test")[0].question
    lengths = {k: len(tok.encode(format_prompt(query, fewshot_examples(ArithConfig(), k)))) for k in (0, 4, 10)}
    assert lengths[0] < lengths[4] < lengths[10]
    assert lengths[10] > 300
    prompt = format_prompt(query, fewshot_examples(ArithConfig(), 10))
    assert tok.decode(tok.encode(prompt)) == prompt


def test_save_and_autotokenizer_load(tok, tmp_path):
    directory = save_tokenizer(tok, tmp_path / "tok")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (directory / name).is_file()
    config = json.loads((directory / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "chat_template" in config
    assert json.loads((directory / "special_tokens_map.json").read_text())["mask_token"] == "<|mask|>"

    loaded = AutoTokenizer.from_pretrained(str(directory))
    assert isinstance(loaded, PreTrainedTokenizerFast)
    assert load_tokenizer(directory).get_vocab() == tok.get_vocab()
    assert (loaded.mask_token_id, loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (3, 0, 1, 2)
    text = format_prompt("Ann has 4 pens. How many pens does Ann have?", fewshot_examples(k=2)) + " 4\n#### 4"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(loaded.encode(text)) == text


def test_chat_template_matches_format_prompt(tok, tmp_path):
    shots = fewshot_examples(k=2, seed=1)
    messages = []
    for s in shots:
        messages += [{"role": "user", "content": s.question}, {"role": "assistant", "content": s.answer}]
    messages.append({"role": "user", "content": "Ben has 2 pens. How many pens does Ben have?"})
    loaded = AutoTokenizer.from_pretrained(str(save_tokenizer(tok, tmp_path)))
    rendered = loaded.apply_chat_template(messages, tokenize=False)
    assert rendered == format_prompt(messages[-1]["content"], shots)


def test_custom_vocabulary(tok):
    custom = build_tokenizer(["zebras", "Ann has"])
    assert custom.unk_token_id not in custom.encode("Ann has 3 zebras")
    assert custom.unk_token_id in custom.encode("Ann has 3 apples")  # default words are not implied
    assert custom.unk_token_id not in custom.encode("Question: Answer:")  # template words always are
    assert set(default_vocabulary()) <= {t.lstrip(SPACE) for t in tok.get_vocab()}


def test_build_tokenizer_bad_inputs():
    with pytest.raises(TypeError, match="vocab_words"):
        build_tokenizer("apples")
    with pytest.raises(TypeError, match="vocab_words"):
        build_tokenizer(["apples", 3])
    with pytest.raises(ValueError, match="model_max_length"):
        build_tokenizer(model_max_length=0)
    with pytest.raises(TypeError, match="tokenizer"):
        save_tokenizer("tok", "/tmp/x")


def test_generic_word_tokenizer_knows_no_task():
    tok = build_word_tokenizer(["zebras"])
    assert tok.unk_token_id not in tok.encode("zebras , 12 zebras .")
    assert tok.unk_token_id in tok.encode("Question:")  # no template words unless asked for
    assert tok.chat_template is None
    with_template = build_word_tokenizer(["zebras"], fixed_text="Question: \nAnswer:", chat_template="{{ x }}")
    assert with_template.unk_token_id not in with_template.encode("Question: zebras\nAnswer:")
    assert with_template.chat_template == "{{ x }}"
    with pytest.raises(TypeError, match="fixed_text"):
        build_word_tokenizer(["zebras"], fixed_text=["Question"])
    with pytest.raises(TypeError, match="vocab_words"):
        build_word_tokenizer("zebras")
