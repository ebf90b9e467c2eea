"""What each training preset decides for the settings a `TrainingConfig` leaves unset: one row
per preset (`PRESETS`), the only place the training code reads a preset from
(`TrainingConfig.defaults()`; `tests/training/test_recipe.py` holds the other modules of
cobalt/training to it). `paper` is METHOD §1.6.1's recipe; `tiny` runs in seconds on a CPU."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Preset = Literal["paper", "tiny"]
KLEstimator = Literal["k3", "k2"]


class PresetDefaults(BaseModel):
    """What a preset decides for the settings a config leaves unset: one row per preset
    (`PRESETS`), the only place the training code reads a preset from."""

    model_config = ConfigDict(frozen=True)

    prompt_limit: int = Field(description="max_prompt_length (tokens).")
    kl: KLEstimator
    trim_padding: bool
    mixed_precision: bool = Field(description="precision auto: mixed on a GPU (else fp32).")
    format_reward: bool = Field(description="The format term, where the tokenizer knows </think>.")
    plan_micro_batch: bool = Field(
        description="On a GPU, per_device_train_batch_size from the model and free memory "
        "(cobalt.training.machinery.memory); a smaller generation_batch_size is then one step."
    )
    prompts_per_step: int | None = Field(
        description="Prompts per optimizer step, one prompt's group a micro-batch, split over "
        "the processes (gradient accumulation = prompts_per_step / processes)."
    )
    grpo: dict[str, Any] = Field(description="GRPOConfig fields beyond the recipe's common ones.")
    offline_max_length: int
    offline_learning_rate: float
    offline_rows_per_step: int | None = Field(
        description="Offline rows per optimizer step (accumulation = this / batch_size); None: 1 "
        "micro-batch."
    )
    offline_checkpoints: bool = Field(description="Offline: gradient checkpointing and saves.")


PRESETS: dict[str, PresetDefaults] = {
    "paper": PresetDefaults(  # METHOD §1.6.1
        prompt_limit=10_240,
        kl="k2",
        trim_padding=True,
        mixed_precision=True,
        format_reward=True,
        plan_micro_batch=True,
        prompts_per_step=64,
        grpo={
            "num_generations": 16,
            "max_completion_length": 6144,
            "num_train_epochs": 2,
            "gradient_checkpointing": True,
            "per_device_train_batch_size": 16,
            "generation_batch_size": 128 * 16,
            "save_strategy": "steps",
            "save_steps": 50,
            "save_total_limit": 2,
        },
        offline_max_length=16_384,
        offline_learning_rate=1e-6,
        offline_rows_per_step=1024,  # 64 prompts x 16 samples
        offline_checkpoints=True,
    ),
    "tiny": PresetDefaults(  # seconds on a CPU
        prompt_limit=512,
        kl="k3",
        trim_padding=False,
        mixed_precision=False,
        format_reward=False,
        plan_micro_batch=False,
        prompts_per_step=None,
        grpo={
            "learning_rate": 1e-5,
            "num_generations": 2,
            "max_completion_length": 24,
            "max_steps": 2,
            "gradient_checkpointing": False,
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 1,
            "save_strategy": "no",
            "dataloader_num_workers": 0,
        },
        offline_max_length=1024,
        offline_learning_rate=1e-5,
        offline_rows_per_step=None,
        offline_checkpoints=False,
    ),
}
