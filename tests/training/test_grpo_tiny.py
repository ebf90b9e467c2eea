"""GRPO on the tiny model with TRL's real GRPOTrainer and the namespace sandbox (CPU, offline)."""

from __future__ import annotations

import math

import pytest
from tensorboard_events import scalars

from cobalt.bandit.rows import prepare_rows
from cobalt.training.grpo import train
from cobalt.training.method.cobalt_reward import total_reward
from cobalt.training.method.sandbox_reward import CobaltRewards
from cobalt.training.settings import TrainingConfig
from sandbox import SandboxConfig
from sandbox import TestSuite as Suite

SANDBOX = SandboxConfig(backend="namespace", concurrency=2)
SUM_TESTS = Suite(inputs=["1 2\n", "5 7\n"], outputs=["3\n", "12\n"])
SUM_CODE = "a, b = map(int, input().split())\nprint(a + b)"


def rows() -> list[dict]:
    system = {"role": "system", "content": "Solve the problem in Python."}
    problems = [
        ("Print the sum of two integers.", SUM_TESTS),
        ("Print the product of two integers.", Suite(inputs=["2 3\n"], outputs=["6\n"])),
        ("Print the input line reversed.", Suite(inputs=["abc\n"], outputs=["cba\n"])),
    ]
    out = [
        {
            "prompt": [system, {"role": "user", "content": q}],
            "test_cases": t.model_dump(),
            "prev_best_pass_rate": 0.0,
            "difficulty": "easy",
            "example_id": f"p{i}",
        }
        for i, (q, t) in enumerate(problems)
    ]
    # a later-turn context (dropped in single_turn mode)
    later = dict(out[0], prev_best_pass_rate=0.5, example_id="p0-t1")
    later["prompt"] = [
        *out[0]["prompt"],
        {"role": "assistant", "content": "```python\nprint(3)\n```"},
        {"role": "user", "content": "Feedback: test 2 failed. Fix it."},
    ]
    return [*out, later]


def test_modes_filter_rows() -> None:
    assert len(prepare_rows(rows(), "cobalt")) == 4
    single = prepare_rows(rows(), "single_turn")
    assert [r["example_id"] for r in single] == ["p0", "p1", "p2"]
    assert all(isinstance(r["test_cases"], str) for r in single)
    # GRPOConfig has no max_prompt_length: longer prompts are dropped before training
    short = prepare_rows(rows(), "cobalt", lambda m: len(m), max_prompt_length=2)
    assert [r["example_id"] for r in short] == ["p0", "p1", "p2"]


def test_paper_preset_maps_to_grpo_config(tmp_path) -> None:
    from trl import GRPOConfig

    kw = TrainingConfig(preset="paper").grpo_kwargs(tmp_path)
    kw["bf16"] = False  # CPU machine
    kw["gradient_checkpointing"] = False
    args = GRPOConfig(**kw)
    assert (args.num_generations, args.learning_rate, args.beta) == (16, 1e-6, 1e-4)
    assert (args.epsilon, args.epsilon_high, args.max_completion_length) == (0.2, 0.4, 6144)
    assert args.generation_batch_size == 128 * 16
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 64 * 16


def test_reward_wrappers_real_sandbox() -> None:
    with CobaltRewards(SANDBOX, count_tokens=len) as rewards:
        correctness, fmt = rewards.reward_funcs(use_format=True)
        completions = [
            [{"role": "assistant", "content": "I think the answer is 3."}],
            [{"role": "assistant", "content": f"```python\n{SUM_CODE}\n```"}],
            [{"role": "assistant", "content": "```python\nprint(3)\n```"}],
        ]
        tests = [SUM_TESTS.model_dump_json()] * 3
        got = correctness(completions=completions, test_cases=tests, prev_best_pass_rate=[0.0] * 3)
        assert got == [-1.0, 1.0, 0.2]  # no code; correct; pass rate 0.5
        # format: the clipped contribution on top of correctness (no </think>: the -0.9 term)
        got_fmt = fmt(completions=completions, test_cases=tests, prev_best_pass_rate=[0.0] * 3)
        assert got_fmt == pytest.approx([0.0, -0.9, -0.9])  # -1 stays -1; 1 - 0.9; 0.2 -> -0.7
        totals = [c + f for c, f in zip(got, got_fmt, strict=True)]
        expected = [
            total_reward(p, 0.0, c[0]["content"], len)
            for p, c in zip([None, 1.0, 0.5], completions, strict=True)
        ]
        assert totals == pytest.approx(expected)


@pytest.mark.timeout(300)
def test_grpo_tiny_two_steps(tmp_path, tiny_model) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model
    out = tmp_path / "out"
    config = TrainingConfig(
        preset="tiny", mode="single_turn", use_format_reward=True, sandbox=SANDBOX
    )
    run = train(config, rows(), model_dir, out)

    steps = [h for h in run.history if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2]
    for name in ("correctness", "format"):
        values = [h[f"rewards/{name}/mean"] for h in steps]
        assert all(-1.0 <= v <= 1.0 and not math.isnan(v) for v in values), (name, values)
    assert all(-1.0 <= h["reward"] <= 1.0 for h in steps)  # the clipped sum
    AutoModelForCausalLM.from_pretrained(str(out))
    # the curves where researchers look (report_to tensorboard): one point per logged step
    curves = scalars(out / "tensorboard")
    assert [step for step, _ in curves["train/reward"]] == [1, 2], sorted(curves)
    assert [v for _, v in curves["train/reward"]] == pytest.approx([h["reward"] for h in steps])
    assert "train/rewards/correctness/mean" in curves


@pytest.mark.timeout(300)
def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path, tiny_model) -> None:
    """A run stopped after its step-1 checkpoint (a kill between saves) goes on from there: the
    second call trains only step 2, and the step timer sees where each step's time went."""
    from cobalt.training.machinery.checkpoints import last_checkpoint
    from cobalt.training.reporting.step_timing import StepTimer

    model_dir = tiny_model
    out = tmp_path / "out"
    first = TrainingConfig(preset="tiny", mode="cobalt", sandbox=SANDBOX, max_steps=1, save_steps=1)
    train(first, rows(), model_dir, out)
    assert last_checkpoint(out) == str(out / "checkpoint-1")

    again = first.model_copy(update={"max_steps": 2})
    with StepTimer() as timer:
        history = train(again, rows(), model_dir, out, callbacks=[timer]).history
    assert len(timer.steps) == 1  # step 1 came from the checkpoint
    assert [h["step"] for h in history if "loss" in h] == [1, 2]
    assert last_checkpoint(out) == str(out / "checkpoint-2")
    summary = timer.summary()
    # (this random model writes no program, so judging its completions takes next to nothing)
    assert summary["steps"] == 1 and summary["generation_s"] > 0 and summary["reward_s"] >= 0
    shares = [summary[f"{b}_share"] for b in ("generation", "reward", "optimisation")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.timeout(300)
def test_lora_training_saves_a_plain_merged_model(tmp_path, tiny_model) -> None:
    """LoRA (peft) adapters train and are merged on save: the output is a plain model (no
    adapter files, the base model's keys, loadable without peft) that the engines can load.
    (This random model's rewards are all equal, so the step has no gradient; that merged
    adapters carry a trained update was checked by hand with the fitted model: only the q/v
    projections changed, grad norm 0.02.)"""
    from transformers import AutoModelForCausalLM

    from cobalt.training.settings import LoraSettings

    model_dir = tiny_model
    out = tmp_path / "out"
    config = TrainingConfig(
        preset="tiny",
        sandbox=SANDBOX,
        max_steps=1,
        lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    train(config, rows(), model_dir, out)
    assert (out / "model.safetensors").exists() and not (out / "adapter_config.json").exists()
    before = AutoModelForCausalLM.from_pretrained(str(model_dir)).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert before.keys() == after.keys()
    assert all(before[k].shape == after[k].shape for k in before)


def test_generation_backends_map_to_grpo_fields(monkeypatch) -> None:
    import cobalt.training.settings as training

    assert TrainingConfig().generation_kwargs(gpu=False) == {"use_transformers_paged": False}
    assert TrainingConfig(generation="paged").generation_kwargs(gpu=True) == {
        "use_transformers_paged": True
    }
    monkeypatch.setattr(training, "vllm_available", lambda: False)
    assert TrainingConfig().generation_kwargs(gpu=True) == {"use_transformers_paged": False}
    with pytest.raises(ValueError, match="needs vLLM"):
        TrainingConfig(generation="vllm_colocate").generation_kwargs(gpu=True)
    monkeypatch.setattr(training, "vllm_available", lambda: True)
    assert TrainingConfig().generation_kwargs(gpu=True) == {
        "use_vllm": True,
        "vllm_mode": "colocate",
    }
    with pytest.raises(ValueError, match="vllm_server_base_url"):
        TrainingConfig(generation="vllm_server").generation_kwargs(gpu=True)


def test_fewer_rows_than_a_generation_batch_is_an_error_naming_the_setting(
    tmp_path, tiny_model
) -> None:
    """TRL's sampler drops an incomplete generation batch: the paper preset's 128 prompts per
    batch on a 32-problem subset ran 0 steps and reported success (8B deployment, 2026-11-26)."""

    model_dir = tiny_model
    # 3 single-turn rows; 4 prompts x 2 generations per generation batch
    config = TrainingConfig(
        preset="tiny",
        mode="single_turn",
        sandbox=SANDBOX,
        overrides={"generation_batch_size": 8, "per_device_train_batch_size": 2},
    )
    with pytest.raises(ValueError, match=r"3 rows .* samples 4 prompts .* at most 6"):
        train(config, rows(), model_dir, tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()
