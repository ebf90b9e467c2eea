"""The training configuration (SPEC §1.6 mapped to TRL 1.16's `GRPOConfig`): presets, modes,
generation backend, LoRA. `TrainingConfig.grpo_kwargs` is the one place where the paper's settings
become TRL's; `cobalt/training/grpo.py` runs the trainer with them.

Mapping notes (TRL 1.16):

- KL coefficient = `beta`; TRL only has the k3 estimator (exp(r) - r - 1), not verl's "mse"
  (k2 = 0.5 * r^2) estimator, so the paper's "mse" KL loss is approximated by k3.
- Clip ratio low/high = `epsilon` / `epsilon_high`; loss_type "dapo" (token-level mean, as verl).
- `GRPOConfig` has no `max_prompt_length`: rows whose templated prompt is longer are dropped.
- 128 prompts x 16 samples = `generation_batch_size` 2048 completions; mini-batch 64 prompts =
  1024 completions per optimizer step (`per_device_train_batch_size` x processes x grad accum),
  so 2 optimizer steps per generation batch (`steps_per_generation` = 2 x grad accum).
- Generation: `generation` picks vLLM (colocated or a `trl vllm-serve` server) when vLLM is
  importable, transformers otherwise (`paged`: continuous batching); LoRA via `lora` (peft).
  Validation sampling (temperature 0.6 / top-p 0.95) is not set here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandbox import SandboxConfig

Preset = Literal["paper", "tiny"]
Mode = Literal["single_turn", "cobalt"]
Generation = Literal["auto", "transformers", "paged", "vllm_colocate", "vllm_server"]


class LoraSettings(BaseModel):
    """LoRA adapters (peft) instead of full fine-tuning; merged into the saved model."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1, description="Adapter rank.")
    alpha: int = Field(32, ge=1, description="Scaling numerator (lora_alpha).")
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | str = Field("all-linear", description="peft target_modules.")

    def peft_config(self) -> Any:
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            task_type="CAUSAL_LM",
        )


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class TrainingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preset: Preset = "tiny"
    mode: Mode = "cobalt"
    use_format_reward: bool = Field(False, description="Add the thinking-model format term.")
    max_prompt_length: int | None = Field(
        None, description="Drop rows whose templated prompt has more tokens (preset default)."
    )
    num_processes: int = Field(
        1,
        ge=1,
        description="Training processes, one per GPU: above 1 the training runs under "
        "`accelerate launch` (DDP), each process with its own sandbox pool. The paper preset "
        "keeps its global batch (64 prompts per step) by dividing the gradient accumulation.",
    )
    accelerate_config: str | None = Field(
        None,
        description="An accelerate config file for num_processes > 1 (DeepSpeed ZeRO, FSDP, "
        "several machines); default: DDP on this machine's GPUs.",
    )
    max_steps: int | None = Field(None, ge=1, description="Override the optimizer steps (tiny: 2).")
    generation: Generation = Field(
        "auto",
        description="How GRPO samples: 'vllm_colocate' (vLLM in the training process), "
        "'vllm_server' (a `trl vllm-serve` server: vllm_server_base_url), 'paged' "
        "(transformers continuous batching), 'transformers' (generate). auto: vLLM colocated "
        "when vLLM is importable and a GPU is present, else transformers.",
    )
    vllm_server_base_url: str | None = Field(None, description="For generation='vllm_server'.")
    lora: LoraSettings | None = Field(None, description="Train LoRA adapters (peft).")
    attn_implementation: str | None = Field(
        None,
        description="The policy's attention kernel (transformers' attn_implementation: sdpa, "
        "eager, flash_attention_2); default: the model's own.",
    )
    cudnn_attention: bool = Field(
        True,
        description="Let PyTorch's SDPA pick its cuDNN kernel (GPU, half precision). Off: the "
        "flash / memory-efficient kernels only (docs/LEARNING.md, bf16).",
    )
    save_steps: int | None = Field(
        None,
        ge=1,
        description="Checkpoint every N optimizer steps; a killed run resumes from the last "
        "checkpoint in its output directory (default: paper 50, tiny none).",
    )
    seed: int = 0
    sandbox: SandboxConfig = Field(default_factory=lambda: SandboxConfig(backend="namespace"))
    overrides: dict[str, Any] = Field(default_factory=dict, description="Extra GRPOConfig kwargs.")

    def prompt_limit(self) -> int:
        if self.max_prompt_length is not None:
            return self.max_prompt_length
        return 10_240 if self.preset == "paper" else 512

    def check(self) -> None:
        """Build the GRPOConfig once (no training) so that an inconsistent setting fails before
        any work, e.g. a batch that does not divide into groups of num_generations."""
        from trl import GRPOConfig

        try:
            GRPOConfig(**self.grpo_kwargs("unused-output-dir"))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"training config ({self.preset} preset): {exc}") from None

    def grpo_kwargs(self, output_dir: str | Path) -> dict[str, Any]:
        """Keyword arguments of TRL's `GRPOConfig` for this preset."""
        import torch

        gpu = torch.cuda.is_available()
        common: dict[str, Any] = {
            "output_dir": str(output_dir),
            "learning_rate": 1e-6,
            "max_grad_norm": 1.0,
            "epsilon": 0.2,
            "epsilon_high": 0.4,
            "beta": 1e-4,
            "temperature": 1.0,
            "loss_type": "dapo",
            "seed": self.seed,
            "bf16": gpu,
            "report_to": "none",
            "logging_steps": 1,
        }
        if self.preset == "paper":
            if 64 % self.num_processes:
                raise ValueError("num_processes must divide 64")
            kwargs = common | {
                "num_generations": 16,
                "max_completion_length": 6144,
                "num_train_epochs": 2,
                "gradient_checkpointing": True,
                "per_device_train_batch_size": 16,
                "gradient_accumulation_steps": 64 // self.num_processes,
                "generation_batch_size": 128 * 16,
                "save_strategy": "steps",
                "save_steps": 50,
                "save_total_limit": 2,
            }
        else:
            kwargs = common | {
                "learning_rate": 1e-5,
                "num_generations": 2,
                "max_completion_length": 24,
                "max_steps": 2,
                "gradient_checkpointing": False,
                "per_device_train_batch_size": 2,
                "gradient_accumulation_steps": 1,
                "save_strategy": "no",
                "use_cpu": not gpu,
                "dataloader_num_workers": 0,
            }
        if self.max_steps is not None:
            kwargs["max_steps"] = self.max_steps
        if self.save_steps is not None:
            kwargs |= {"save_strategy": "steps", "save_steps": self.save_steps}
            kwargs.setdefault("save_total_limit", 2)
        return kwargs | self.generation_kwargs(gpu) | self.overrides

    def generation_kwargs(self, gpu: bool) -> dict[str, Any]:
        """GRPOConfig fields of the chosen generation backend."""
        mode = self.generation
        if mode == "auto":
            mode = "vllm_colocate" if gpu and vllm_available() else "transformers"
        if mode.startswith("vllm") and not vllm_available():
            raise ValueError(f"generation={mode!r} needs vLLM: pip install '.[gpu]'")
        if mode == "vllm_colocate":
            return {"use_vllm": True, "vllm_mode": "colocate"}
        if mode == "vllm_server":
            if not self.vllm_server_base_url:
                raise ValueError("generation='vllm_server' needs vllm_server_base_url")
            return {
                "use_vllm": True,
                "vllm_mode": "server",
                "vllm_server_base_url": self.vllm_server_base_url,
            }
        return {"use_transformers_paged": mode == "paged"}
