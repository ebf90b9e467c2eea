"""The paper's recipe in TRL (docs/TRAINING.md's table): what the reward judges for
thinking models, the format term's default, vLLM's context and importance sampling, and the
memory plan of the paper preset (hand-worked)."""

from __future__ import annotations

import pytest

from cobalt.training.grpo import uses_format_reward
from cobalt.training.machinery.activations import sequence_bytes
from cobalt.training.machinery.memory import (
    GIB,
    TrainingMemoryError,
    fixed_bytes,
    plan_micro_batch,
)
from cobalt.training.method.sandbox_reward import CobaltRewards
from cobalt.training.settings import LoraSettings, TrainingConfig
from sandbox import SandboxConfig, TestSuite

SUM = TestSuite(inputs=["1 2\n", "5 7\n"], outputs=["3\n", "12\n"]).model_dump_json()
RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\nprint(3)\n```"


def rewards_of(texts: list[str], opened: bool = False) -> list[float]:
    with CobaltRewards(
        SandboxConfig(backend="namespace", concurrency=2), opened_thinking=opened
    ) as r:
        (correctness,) = r.reward_funcs()
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        return correctness(completions, [SUM] * len(texts), [0.0] * len(texts))


def test_rewards_judge_the_answer_after_think() -> None:
    """The program is taken as the trajectory stage takes it: from the answer after `</think>`
    (a draft in the reasoning is not judged), from the whole answer (a long explanation does not
    hide the final block), and never from reasoning that did not close."""
    assert rewards_of(
        [
            f"<think>first try {RIGHT}</think>Final:\n{WRONG}",  # the answer's program counts
            f"<think>a draft {RIGHT} but wait",  # cut inside its reasoning: no answer
            "x" * 7000 + "\n" + RIGHT,  # past the 6000 characters kept in the conversation
        ]
    ) == [0.2, -1.0, 1.0]
    # R1-Distill's template opens <think> in the prompt: the model writes only </think>
    assert rewards_of([f"reasoning {WRONG}</think>{RIGHT}", f"still reasoning {RIGHT}"], True) == [
        1.0,
        -1.0,
    ]


def test_format_reward_is_on_for_thinking_models(tiny_model) -> None:
    """Both paper models think: the paper preset turns the format term on when the tokenizer
    knows `</think>` (the tiny model's does, Qwen3-style); a setting wins either way; the tiny
    preset leaves it off."""
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    thinking = AutoTokenizer.from_pretrained(tiny_model)
    plain = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    )
    paper = TrainingConfig(preset="paper")
    assert uses_format_reward(paper, thinking) and not uses_format_reward(paper, plain)
    assert not uses_format_reward(TrainingConfig(), thinking)
    assert not uses_format_reward(TrainingConfig(preset="paper", use_format_reward=False), thinking)
    assert uses_format_reward(TrainingConfig(use_format_reward=True), plain)


def test_vllm_context_is_prompt_plus_completion(monkeypatch) -> None:
    """With vLLM the paper preset gives it the context training can feed it (10,240 + 6,144, not
    the model's own 131,072) and leaves TRL's importance-sampling correction off (the recipe has
    none; TRL's default zeroes sequences whose ratio leaves [0, 3])."""
    import cobalt.training.settings as training

    monkeypatch.setattr(training, "vllm_available", lambda: True)
    config = TrainingConfig(
        preset="paper", generation="vllm_server", vllm_server_base_url="http://h:8000"
    )
    kwargs = config.grpo_kwargs("out")
    assert kwargs["vllm_max_model_length"] == 10_240 + 6144
    assert kwargs["vllm_importance_sampling_correction"] is False
    turned_on = config.model_copy(update={"vllm_is_correction": True}).grpo_kwargs("out")
    assert turned_on["vllm_importance_sampling_correction"] is True
    assert "vllm_max_model_length" not in TrainingConfig(preset="paper").grpo_kwargs("out")


def qwen3_8b():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=151_936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
    )


def test_memory_plan_of_the_paper_preset_at_8b() -> None:
    """Hand-worked: one sequence of 10,240 + 6,144 tokens of Qwen3-8B with bf16 compute and a bf16
    residual (LoRA over the bf16 base) needs 36 x 16384 x 4096 x 2 (checkpoints) + 16384 x
    172,032 x 2 (one recomputed layer: (4 x 12288 + 2 x 6144 + 6 x 4096) x 2 bytes per token) +
    6144 x 4096 x 4 (the fused head's float32 gradient of the hidden states: TRL never holds the
    logits) bytes; the plan takes the largest divisor of the step that fits."""
    config = qwen3_8b()
    each = sequence_bytes(config, 16_384, 6144, compute_dtype="bfloat16", residual_dtype="bfloat16")
    per_token_layer = (4 * 12288 + 2 * (32 + 16) * 128 + 6 * 4096) * 2
    assert each == 36 * 16384 * 4096 * 2 + 16384 * per_token_layer * 2 + 6144 * 4096 * 4
    fixed = 40 * GIB
    plan = plan_micro_batch(
        config,
        sequences_per_step=1024,
        prompt_tokens=10_240,
        completion_tokens=6144,
        free_bytes=fixed + 5 * each,
        fixed=fixed,
        compute_dtype="bfloat16",
        residual_dtype="bfloat16",
    )
    assert (plan.micro_batch, plan.gradient_accumulation_steps) == (4, 256)  # 5 fits, 4 divides
    assert plan.sequence_tokens == 16_384 and "micro-batch 4 x 256" in plan.describe()


def test_memory_plan_error_names_the_settings() -> None:
    with pytest.raises(TrainingMemoryError, match=r"max_completion_length.*training.lora"):
        plan_micro_batch(
            qwen3_8b(),
            sequences_per_step=1024,
            prompt_tokens=10_240,
            completion_tokens=6144,
            free_bytes=80 * GIB,
            fixed=79 * GIB,
            compute_dtype="bfloat16",
            residual_dtype="bfloat16",
        )


def test_fixed_memory_of_full_fine_tuning_and_lora() -> None:
    """Full fine-tuning keeps fp32 weights, gradients and Adam's two moments (16 bytes a
    parameter) plus a bf16 reference model; LoRA only the bf16 base."""
    common = {
        "trainable_dtype": "float32",
        "frozen_dtype": "bfloat16",
        "vllm_bytes": 0,
        "total_bytes": 0,
    }
    reserve = 2 * GIB
    full = fixed_bytes(10**9, trainable=10**9, reference_model=True, **common)
    lora = fixed_bytes(10**9, trainable=0, reference_model=False, **common)
    assert full - reserve == 16 * 10**9 + 2 * 10**9
    assert lora - reserve == 2 * 10**9
    assert TrainingConfig(preset="paper", lora=LoraSettings()).lora is not None
    sharded = fixed_bytes(10**9, trainable=10**9, reference_model=True, shards=4,
                          gathered_bytes=3 * GIB, **common)  # fmt: skip
    assert sharded - reserve == (16 * 10**9 + 2 * 10**9) // 4 + 3 * GIB  # gathered whole
    assert fixed_bytes(10**9, trainable=10**9, reference_model=True, gathered_bytes=3 * GIB,
                       **common) == full  # one process gathers nothing  # fmt: skip


def test_a_sharded_process_counts_the_layers_it_gathers_in_float32() -> None:
    """FSDP gathers the float32 master weights under mixed precision: at the 8B shape the root
    (embeddings and head, 1.2B parameters), the head's gradient and two layers with their
    gradients are ~9.8 GiB in float32, half of it in bf16."""
    from transformers import Qwen3Config

    from cobalt.training.machinery.memory import gathered_bytes

    shape = Qwen3Config(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                        num_key_value_heads=8, intermediate_size=12288, vocab_size=151936)  # fmt: skip
    assert 9.5 * GIB < gathered_bytes(shape, "float32") < 10 * GIB
    assert gathered_bytes(shape, "float32") == 2 * gathered_bytes(shape, "bfloat16")
    # bf16-linear: the decoder layers in bf16, the embeddings and head still float32
    split = gathered_bytes(shape, "float32", "bfloat16")
    assert gathered_bytes(shape, "bfloat16") < split < gathered_bytes(shape, "float32")


def test_each_preset_has_one_row_and_the_training_code_reads_only_the_row() -> None:
    """A preset's defaults live in `PRESETS` alone: every preset has its row, and no module of
    cobalt/training decides by comparing the preset's name (as five of them once did)."""
    import re
    import typing
    from pathlib import Path

    from cobalt.training.method.preset_defaults import PRESETS, Preset

    assert set(PRESETS) == set(typing.get_args(Preset))
    root = Path(__file__).resolve().parents[2] / "cobalt" / "training"
    compares = re.compile(r"\.preset\s*[!=]=|preset\s*[!=]=\s*[\"']")
    found = [
        f"{path.name}:{n}"
        for path in sorted(root.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if compares.search(line)
    ]
    assert found == [], f"preset names compared outside PRESETS: {found}"
    paper, tiny = TrainingConfig(preset="paper"), TrainingConfig(preset="tiny")
    assert (paper.kl(), paper.prompt_limit(), paper.trims_padding()) == ("k2", 10_240, True)
    assert (tiny.kl(), tiny.prompt_limit(), tiny.trims_padding()) == ("k3", 512, False)
    assert paper.grpo_kwargs("/out")["gradient_accumulation_steps"] == 64
    assert (
        TrainingConfig(preset="paper", num_processes=4).grpo_kwargs("/o")[
            "gradient_accumulation_steps"
        ]
        == 16
    )
