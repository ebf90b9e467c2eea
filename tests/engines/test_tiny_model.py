import hashlib

from engines.tiny import build_tiny_model


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_round_trips_through_from_pretrained(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tokenizer)
    assert 1000 <= len(tokenizer) <= 2000
    assert tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert tokenizer.pad_token == "<|endoftext|>"
    text = "import sys\nfor i in range(10):\n    print(i * 2, 'café')  # ok\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(ids) < 0.6 * len(text)  # the merges learnt something (digits stay single)
    assert tokenizer.convert_ids_to_tokens(tokenizer("<|im_start|>")["input_ids"]) == [
        "<|im_start|>"
    ]


def test_reloaded_tokenizer_equals_the_trained_one(tiny_model_dir):
    from transformers import AutoTokenizer

    from engines.tiny import build_tokenizer

    trained, reloaded = build_tokenizer(), AutoTokenizer.from_pretrained(tiny_model_dir)
    for text in ["x = 12345\n\tif a<=b: return 'naïve'", "<think>hm</think>\n\nanswer<|im_end|>"]:
        assert trained(text)["input_ids"] == reloaded(text)["input_ids"]


def test_chat_template(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [
        {"role": "system", "content": "Be safe."},
        {"role": "user", "content": "Write code."},
        {"role": "assistant", "content": "```python\nprint(1)\n```"},
        {"role": "user", "content": "Fix it."},
    ]
    body = (
        "<|im_start|>system\nBe safe.<|im_end|>\n"
        "<|im_start|>user\nWrite code.<|im_end|>\n"
        "<|im_start|>assistant\n```python\nprint(1)\n```<|im_end|>\n"
        "<|im_start|>user\nFix it.<|im_end|>\n"
    )
    render = lambda **kw: tokenizer.apply_chat_template(messages, tokenize=False, **kw)  # noqa: E731
    assert render(add_generation_prompt=False) == body
    assert render(add_generation_prompt=True) == body + "<|im_start|>assistant\n"
    assert render(add_generation_prompt=True, enable_thinking=True) == (
        body + "<|im_start|>assistant\n"
    )
    assert render(add_generation_prompt=True, enable_thinking=False) == (
        body + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_deterministic_given_the_seed(tiny_model_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("tokenizer.json", "model.safetensors", "config.json"):
        assert _digest(again / name) == _digest(tiny_model_dir / name), name
    assert _digest(other / "model.safetensors") != _digest(again / "model.safetensors")
    assert _digest(other / "tokenizer.json") == _digest(again / "tokenizer.json")
