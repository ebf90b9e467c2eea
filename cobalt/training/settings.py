"""Long module: every training setting with its description (the flows' --help) and the one
mapping of them to TRL's `GRPOConfig` and transformers' `TrainingArguments`; split, a setting
and its mapping would live apart.

The training configuration (METHOD §1.6 mapped to TRL 1.16's `GRPOConfig`): presets, modes,
generation backend, LoRA. `TrainingConfig.grpo_kwargs` is the one place where the paper's settings
become TRL's; `cobalt/training/grpo.py` runs the trainer with them. The `offline` mode (METHOD §2)
trains on the logged turns of the trajectories with a `transformers.Trainer` instead: its settings
are `OfflineSettings` (`TrainingConfig.offline`), mapped to `TrainingArguments` by
`TrainingConfig.offline_kwargs`; `cobalt/training/offline.py` runs it.

Mapping notes (TRL 1.16):

- KL coefficient = `beta`; TRL only has the k3 estimator (exp(r) - r - 1); the paper's "mse" (k2
  = 0.5 * r^2, verl's `low_var_kl` sibling) is `kl_estimator="k2"` (the paper preset's), added by
  `cobalt.training.machinery.trl_trainer.K2GRPOTrainer`, a small subclass of TRL's trainer.
- Numerics: fp32 master weights with bf16 compute on a GPU (`precision`, decided once in
  `cobalt.training.decisions` for every trainer), whatever the checkpoint's dtype.
- TRL's vLLM importance-sampling correction (on by default in TRL) is off: the recipe has none,
  and TRL's default mode zeroes sequences whose ratio leaves [0, 3] (`vllm_is_correction`); on
  with fp8 generation, whose sampler is not the model the trainer computes.
- Clip ratio low/high = `epsilon` / `epsilon_high`; loss_type "dapo" (token-level mean, as verl).
- `GRPOConfig` has no `max_prompt_length`: rows whose templated prompt is longer are dropped.
- 128 prompts x 16 samples = `generation_batch_size` 2048 completions; mini-batch 64 prompts =
  1024 completions per optimizer step (`per_device_train_batch_size` x processes x grad accum),
  so 2 optimizer steps per generation batch (`steps_per_generation` = 2 x grad accum).
- Generation: `generation` picks vLLM (colocated or a `trl vllm-serve` server) or transformers
  (`paged`: continuous batching); `auto` decides as the generating stages do (`engines.auto`: vLLM
  on a GPU for a model of 50M+ parameters); LoRA via `lora` (peft).
  Validation (temperature 0.6 / top-p 0.95) is the evaluation stage's, not a step of training
  (docs/METHOD.md §1.3).
- A step's completions never depend on the number of processes: the paper preset's
  1024, a short run's `generation_batch_size`, or per_device x accumulation as given for one
  process (the tiny preset, `--set`) are shared by N processes (`_shared_step`).
- Micro-batch: the paper preset plans `per_device_train_batch_size` from the model's config and
  the GPU memory of the run's plan (`cobalt.training.machinery.memory`,
  `cobalt.training.machinery.plan`), keeping 1024 completions per optimizer step; vLLM's context is
  the prompt limit plus the completion limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cobalt.training.decisions import (
    SHARDED,
    Precision,
    Sharding,
    ShardingError,
    check_batch,
    resolve_precision,
    resolve_sharding,
)
from cobalt.training.method.preset_defaults import PRESETS, KLEstimator, Preset, PresetDefaults
from engines import visible_gpus
from engines.auto import choose
from sandbox import SandboxConfig

# GRPOConfig / TrainingArguments fields that other settings own: refused in `overrides`
OWNED = {
    "ddp_timeout": "training.collective_timeout_s",
    "bf16": "training.precision (mixed, fp32 or bf16)",
    "fp16": "training.precision (mixed, fp32 or bf16)",
    "report_to": "training.report_to",
}
Mode = Literal["single_turn", "cobalt", "multi_turn", "offline"]
MODES: tuple[str, ...] = get_args(Mode)
Reward = Literal["correctness", "dense"]


Objective = Literal["reinforce_loo", "awr", "clipped_ratio"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)
# The offline mode's objective unless one is given: the one place that decides it for the flows
# (`--mode offline`), the pipeline and the learning check. Chosen on the evidence of the learning
# check (docs/RESULTS.md, offline objectives): awr is the only objective that has learned there.
DEFAULT_OBJECTIVE: Objective = "awr"
Generation = Literal["auto", "transformers", "paged", "vllm_colocate", "vllm_server"]


class LoraSettings(BaseModel):
    """LoRA adapters (peft) instead of full fine-tuning; merged into the saved model."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(16, ge=1, description="Adapter rank.")
    alpha: int = Field(32, ge=1, description="Scaling numerator (lora_alpha).")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the adapters' input.")
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


class OfflineSettings(BaseModel):
    """The offline mode (METHOD §2): a policy update from the logged turns and their rewards, no
    generation and no sandbox while training (`cobalt/training/offline.py`, docs/TRAINING.md)."""

    model_config = ConfigDict(extra="forbid")

    objective: Objective = Field(
        DEFAULT_OBJECTIVE,
        description="The offline mode's objective: reinforce_loo: -A * log-prob, A = reward - "
        "leave-one-out baseline; awr: advantage-weighted regression, weight min(exp(A / "
        "awr_beta), awr_max_weight); clipped_ratio: PPO's clipped surrogate min(r A, clip(r, 1 - "
        "eps, 1 + eps_high) A) per token, r = policy / reference probability (reference: the "
        f"starting policy). Default {DEFAULT_OBJECTIVE} (the one that learned in the learning "
        "check, docs/LEARNING.md).",
    )
    awr_beta: float = Field(0.5, gt=0, description="AWR temperature: weight exp(A / beta).")
    awr_max_weight: float = Field(20.0, gt=0, description="AWR: weights clipped to this.")
    ratio_clip: float = Field(0.2, gt=0, lt=1, description="clipped_ratio: eps (low side).")
    ratio_clip_high: float | None = Field(
        None, gt=0, description="clipped_ratio: eps on the high side (default: ratio_clip)."
    )
    learning_rate: float | None = Field(
        None, gt=0, description="Default: the preset's (paper 1e-6, tiny 1e-5)."
    )
    epochs: float = Field(1.0, gt=0, description="Passes over the rows (unless max_steps).")
    batch_size: int = Field(
        8,
        ge=1,
        description="Rows per micro-batch (on several processes, at most rows per step / "
        "processes).",
    )
    gradient_accumulation_steps: int | None = Field(
        None,
        ge=1,
        description="Micro-batches per optimizer step on one process: rows per step = "
        "batch_size x this, the same on any number of processes, which share them (default: "
        "tiny 1; paper 1024 rows per step, METHOD §1.6.1's mini-batch of 64 prompts x 16 "
        "samples).",
    )
    max_length: int | None = Field(
        None,
        ge=2,
        description="Drop rows whose prompt + completion is longer (tokens; default: paper "
        "16384, tiny 1024). Rows are dropped, never cut.",
    )
    drop_zero_advantage: bool = Field(
        True,
        description="reinforce_loo and clipped_ratio: leave out rows whose advantage is 0 "
        "(no gradient; they would only dilute the token mean). AWR keeps every row.",
    )

    diagnostics: bool = Field(
        False,
        description="Log, every step, how far the policy has moved from the starting policy "
        "(kl_ref, logprob_drift, ratio: needs the reference log-probabilities, one no-gradient "
        "pass over the rows before the first step, as clipped_ratio) and the policy's mean "
        "token entropy on the completions (a softmax over the vocabulary per micro-batch).",
    )

    def clip_high(self) -> float:
        return self.ratio_clip if self.ratio_clip_high is None else self.ratio_clip_high


def _as_every_process_sees_it(kwargs: dict[str, Any], processes: int) -> dict[str, Any]:
    """GRPOConfig's fields for a check in this one process: TRL derives a missing generation
    batch from the world size it runs in (per_device x processes x steps_per_generation), 1
    here, so that batch is given explicitly for the `processes` the run launches."""
    if processes == 1 or kwargs.get("generation_batch_size") is not None:
        return kwargs
    steps = kwargs.get("steps_per_generation") or kwargs.get("gradient_accumulation_steps", 1)
    batch = int(kwargs["per_device_train_batch_size"]) * processes * int(steps)
    return {**kwargs, "generation_batch_size": batch, "steps_per_generation": None}


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class TrainingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preset: Preset = Field(
        "tiny",
        description="The recipe's defaults for what the settings leave unset (PRESETS, "
        "cobalt/training/method/preset_defaults.py): tiny (seconds on a CPU: a few short steps of "
        "a "
        "tiny model) or paper (METHOD §1.6.1 mapped to TRL's GRPOConfig: 16 samples per prompt, "
        "lr 1e-6, clip 0.2/0.4, KL 1e-4, 6144 new tokens, 2 epochs; offline: 1024 rows a step).",
    )
    mode: Mode = Field(
        "cobalt",
        description="cobalt (default): GRPO on every bandit context; single_turn: GRPO on the "
        "turn-0 prompts; multi_turn: online GRPO over whole repair conversations from the "
        "turn-0 prompts (the paper's multi-turn baseline, `turns` feedback turns); offline: no "
        "generation, the logged turns and rewards (`offline`).",
    )
    reward: Reward = Field(
        "correctness",
        description="correctness (default): METHOD §1.5's reward; dense: plus a VeRPO-style "
        "dense term (tests weighted by how rarely the group passes them; "
        "cobalt.training.method.dense_reward), for cobalt, single_turn and multi_turn.",
    )
    turns: int = Field(
        2,
        ge=0,
        le=16,
        description="multi_turn: feedback turns per training conversation (default 2, as the "
        "trajectories').",
    )
    offline: OfflineSettings = Field(
        default_factory=OfflineSettings, description="The offline mode's objective and loop."
    )
    use_format_reward: bool | None = Field(
        None,
        description="Add the thinking-model format term (METHOD §1.5). None: on with the paper "
        "preset when the policy's tokenizer knows `</think>` (both paper models think), off "
        "otherwise.",
    )
    precision: Precision = Field(
        "auto",
        description="Numerics (cobalt.training.machinery.precision): mixed = fp32 master weights "
        "and bf16 "
        "autocast (the recipe), fp32, or bf16 = pure bf16 weights (small updates vanish: only "
        "when asked for). auto (default): mixed on a GPU with the paper preset, else fp32.",
    )
    kl_estimator: KLEstimator | None = Field(
        None,
        description="KL penalty's estimator: k3 (TRL's exp(r) - r - 1) or k2 (0.5 r^2, the "
        "recipe's 'mse'). None: the preset's (paper k2, tiny k3).",
    )
    vllm_is_correction: bool | None = Field(
        None,
        description="TRL's importance-sampling correction between vLLM's and the trainer's "
        "probabilities (sequence_mask: sequences with a ratio above 3 get no gradient). None: "
        "on with fp8_generation or fp8_kv_cache (the sampler's probabilities are the quantized "
        "model's), else off (the recipe has none).",
    )
    report_to: list[str] = Field(
        default_factory=lambda: ["tensorboard"],
        description="Where training curves go (transformers' report_to): tensorboard (event "
        "files in the run's directory, <output>/tensorboard), wandb, mlflow, trackio when "
        "installed; [] for none.",
    )
    max_prompt_length: int | None = Field(
        None, description="Drop rows whose templated prompt has more tokens (preset default)."
    )
    num_processes: int = Field(
        1,
        ge=1,
        description="Training processes on each node, one per GPU (--gpus): above 1 the "
        "training runs under `accelerate launch`, each process with its own sandbox pool and, "
        "with vLLM colocated, its own vLLM engine. A step's completions are the same on any "
        "number of processes: they share them. Default 1.",
    )
    nodes: int = Field(
        1,
        ge=1,
        description="Machines the training spans (--nodes), num_processes on each: every node "
        "runs the same command with its own node_rank, they meet at rdzv_endpoint, and the "
        "storage must be shared (S3, or a directory every node mounts). Default 1.",
    )
    node_rank: int = Field(
        0, ge=0, description="This machine's rank among the nodes (--node-rank)."
    )
    rdzv_endpoint: str | None = Field(
        None,
        description="host:port where the nodes meet (--rdzv-endpoint): node 0's address and a "
        "free port every node can reach.",
    )
    rendezvous_timeout_s: int = Field(
        600,
        ge=5,
        description="Seconds node 0 waits for the other nodes to join (and a node for node 0) "
        "before the job fails naming the endpoint.",
    )
    sharding: Sharding = Field(
        "auto",
        description="How the processes share the model (cobalt/training/machinery/sharding.py): "
        "ddp (each "
        "GPU holds all of it), fsdp (FSDP2 full shard), zero3 (DeepSpeed ZeRO-3), hybrid (FSDP2 "
        "sharded within each node, the nodes replicas: several nodes); auto: fsdp for full "
        "fine-tuning on several GPUs, else ddp.",
    )
    accelerate_config: str | None = Field(
        None,
        description="An accelerate config file of your own instead of the sharding's "
        "(infra/accelerate/*.yaml): several machines, offload.",
    )
    collective_timeout_s: int = Field(
        600,
        ge=10,
        description="Seconds a training process waits in a collective (a gradient reduction, "
        "a gather of completions) for the others before the job fails with an error naming "
        "it: a hung process ends the run in minutes, not transformers' 30. Raise it when one "
        "process can legitimately stay busy longer than the others (very long generation "
        "steps).",
    )
    max_steps: int | None = Field(
        None,
        ge=1,
        description="Optimizer steps, over what the preset decides (paper: 2 epochs over the "
        "rows; tiny: 2 steps, 32 in the pipeline's embedded run; offline mode: offline.epochs).",
    )
    generation: Generation = Field(
        "auto",
        description="How GRPO samples: 'vllm_colocate' (vLLM in the training process), "
        "'vllm_server' (a `trl vllm-serve` server: vllm_server_base_url), 'paged' "
        "(transformers continuous batching), 'transformers' (generate). auto: vLLM colocated "
        "on a GPU with vLLM importable for a model of 50M+ parameters, else transformers (the "
        "generating stages' choice, engines.auto).",
    )
    vllm_server_base_url: str | None = Field(
        None, description="For generation='vllm_server': a server you started (`trl vllm-serve`)."
    )
    vllm_server_gpus: int = Field(
        0,
        ge=0,
        description="GPUs of this machine given to a vLLM server the stage starts and stops "
        "(--vllm-server-gpus; `vllm serve` as `trl vllm-serve` runs it, data parallel over "
        "them): generation runs there, the num_processes training processes on the other GPUs, "
        "the weights sent by NCCL at each generating step. 0: no server of the stage's.",
    )
    rollout: str | None = Field(
        None,
        description="'module:function' naming a TRL rollout_func (rollout(prompts, trainer) -> "
        "dict of prompt_ids, completion_ids, logprobs) that samples instead of the trainer: "
        "an environment of your own (benchmarks.parity replays fixed completions with one). "
        "GRPO modes single_turn and cobalt only.",
    )
    lora: LoraSettings | None = Field(
        None,
        description="Train LoRA adapters (peft) instead of every weight: rank 16, alpha 32, "
        "dropout 0.05 on all linear layers unless a --config file sets training.lora; merged "
        "into the saved model. None: full fine-tuning.",
    )
    attn_implementation: str | None = Field(
        None,
        description="The policy's attention kernel (transformers' attn_implementation: sdpa, "
        "eager, flash_attention_2); default: the model's own.",
    )
    trim_padding: bool | None = Field(
        None,
        description="Forward passes with less padding: micro-batches of similar completion "
        "length, each cut to its own longest sequence (cobalt.training.machinery.padding; exact "
        "for the "
        "dapo loss). None: on with the paper preset.",
    )
    packing: bool = Field(
        False,
        description="Packed forward passes: each micro-batch's sequences end to end in one row, "
        "no padding computed, attention kept inside each sequence "
        "(cobalt.training.machinery.packing; "
        "variable-length FlashAttention on a GPU in bf16, SDPA a sequence at a time elsewhere). "
        "The same log-probabilities as the padded path to rounding. Text models with full "
        "causal attention only.",
    )
    share_prompts: bool = Field(
        False,
        description="With packing: the rows of one prompt in a micro-batch computed with the "
        "prompt once (each completion attends to the shared prompt and to itself; rows grouped "
        "by prompt within each optimizer step). The same log-probabilities to rounding; not yet "
        "measured on a GPU.",
    )
    async_generation: bool = Field(
        False,
        description="Generation overlapped with training, one step off (--async): each "
        "generation batch is sampled in a background thread while the one before it trains, "
        "so it comes from weights one generation batch older than those it trains "
        "(cobalt.training.machinery.overlap). vLLM colocated stays awake (no sleep mode), a vLLM "
        "server "
        "of the stage's samples on GPUs of its own (vllm_server_gpus), or transformers "
        "samples from a copy of the policy. A different update from the synchronous default "
        "(the paper's recipe): modes cobalt and single_turn only.",
    )
    fp8_generation: bool = Field(
        False,
        description="GRPO's samples from vLLM in fp8 (--fp8-generation: its online "
        "quantization, weights and activations of the linear layers in float8 with scales "
        "recomputed at each weight update; the trainer's passes stay as they are), off by "
        "default. On a vLLM server only: the stage's own (vllm_server_gpus) is started with "
        "`--quantization fp8`; a server of yours (vllm_server_base_url) must be. Needs GPUs of "
        "compute capability 8.9+ (Ada, Hopper). Turns on vllm_is_correction unless it is set, "
        "per token and capped (TRL's token_truncate; --set vllm_importance_sampling_mode=...).",
    )
    fp8_kv_cache: bool = Field(
        False,
        description="vLLM's KV cache in fp8 (--fp8-kv-cache: keys and values stored in float8, "
        "half their bytes and twice the tokens the cache holds), off by default. On a vLLM "
        "server only: the stage's own (vllm_server_gpus) is started with `--kv-cache-dtype "
        "fp8`; a server of yours (vllm_server_base_url) must be. Needs GPUs of compute "
        "capability 8.9+. Turns on vllm_is_correction as fp8_generation does.",
    )
    fsdp_gather: Literal["float32", "bf16-linear", "bfloat16"] = Field(
        "float32",
        description="What FSDP gathers each layer as under mixed precision: float32 "
        "(default; its master weights, computed under bf16 autocast: what one GPU computes), "
        "bf16-linear (the linear layers cast to bf16 before the gather, as autocast casts them "
        "after it in one process, the rest float32: the same numbers to float32 rounding on "
        "CPU, about half the gathered bytes; not yet measured on GPUs) or bfloat16 (verl's and "
        "accelerate's own policy: half the gathered bytes and memory, ~10% faster a "
        "micro-batch at 2-8B, but the whole forward in bf16 weights: not what one GPU "
        "computes; docs/SCALING.md, its cost docs/RESULTS.md).",
    )
    gradient_sync: Literal["auto", "step", "micro_batch"] = Field(
        "auto",
        description="When FSDP reduce-scatters the gradients of an optimizer step's "
        "micro-batches: step (once, at its last micro-batch: every process holds the whole "
        "float32 gradients until then, 24.6 GB more a GPU at 8B on 4), micro_batch (every "
        "micro-batch: only the shards held, one reduce-scatter per micro-batch) or auto "
        "(default: the memory plan holds them whole unless they do not fit or reducing every "
        "micro-batch moves fewer bytes a step; its line says which). The same update to "
        "float32 rounding either way.",
    )
    cudnn_attention: bool = Field(
        True,
        description="Let PyTorch's SDPA pick its cuDNN kernel (GPU, half precision). Off: the "
        "flash / memory-efficient kernels only (docs/TRAINING.md, non-finite steps and bf16).",
    )
    save_steps: int | None = Field(
        None,
        ge=1,
        description="Checkpoint every N optimizer steps; a killed run resumes from the last "
        "checkpoint in its output directory (default: paper 50, tiny none).",
    )
    seed: int = Field(0, description="The trainer's seed (its initialisation and data order).")
    sandbox: SandboxConfig = Field(
        default_factory=lambda: SandboxConfig(backend="namespace"),
        description="Where the rewards' programs run; the training stage sets it from the "
        "flow's sandbox settings (backend, concurrency shared by the processes).",
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="GRPOConfig fields over the preset's and the settings' (offline mode: "
        "TrainingArguments fields), as KEY=JSON, e.g. learning_rate=2e-6; a field another "
        "setting owns (bf16, fp16, report_to, ddp_timeout) is refused with that setting's name.",
    )

    @model_validator(mode="after")
    def _nodes(self) -> TrainingConfig:
        if self.node_rank >= self.nodes:
            raise ValueError(
                f"training.node_rank {self.node_rank}: the nodes are ranked 0 to {self.nodes - 1} "
                f"(--nodes {self.nodes})"
            )
        if self.nodes > 1:
            host, _, port = (self.rdzv_endpoint or "").rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(
                    f"training.rdzv_endpoint {self.rdzv_endpoint!r}: training on {self.nodes} "
                    "nodes needs where they meet, host:port of node 0 (--rdzv-endpoint "
                    "10.0.0.1:29500)"
                )
        return self

    def world(self) -> int:
        """Training processes in all: num_processes on each of the nodes."""
        return self.nodes * self.num_processes

    @model_validator(mode="after")
    def _offline_combinations(self) -> TrainingConfig:
        if self.rollout is not None and self.mode in ("offline", "multi_turn"):
            raise ValueError(
                f"training.rollout: mode {self.mode} has no sampling of its own to replace "
                "(multi_turn's rollout is the repair conversation): use mode cobalt or "
                "single_turn, or leave rollout unset"
            )
        if self.rollout is not None and ":" not in self.rollout:
            raise ValueError(
                f"training.rollout {self.rollout!r}: name it as module:function, e.g. "
                "benchmarks.parity_rollout:replay"
            )
        if self.mode == "offline" and (self.use_format_reward or self.reward == "dense"):
            raise ValueError(
                "use_format_reward / reward: the offline mode's reward is the logged correctness "
                "reward only; train with mode cobalt, single_turn or multi_turn for the others"
            )
        if self.share_prompts and not self.packing:
            raise ValueError(
                "training.share_prompts shares prompts inside packed passes: set "
                "training.packing true too (--share-prompts does both)"
            )
        if self.async_generation and (self.mode in ("offline", "multi_turn") or self.rollout):
            raise ValueError(
                f"training.async_generation: sampling one step ahead is built for TRL's own "
                f"single-turn generation (modes cobalt, single_turn, no training.rollout), not "
                f"mode {self.mode}{' with a rollout' if self.rollout else ''}: drop --async"
            )
        if self.async_generation and self.generation == "paged":
            raise ValueError(
                "training.async_generation with generation paged: not supported; use generation "
                "auto, vllm_colocate, vllm_server or transformers"
            )
        if self.vllm_server_gpus:
            self._check_own_server()
        if self.fp8_generation and not (self.vllm_server_gpus or self.vllm_server_base_url):
            raise ValueError(
                "training.fp8_generation quantizes a vLLM server's model (TRL's colocated engine "
                "has no quantization setting): add --vllm-server-gpus K (the stage's own server, "
                "started in fp8), or name yours started with --quantization fp8 "
                "(vllm_server_base_url)"
            )
        if self.fp8_kv_cache and not (self.vllm_server_gpus or self.vllm_server_base_url):
            raise ValueError(
                "training.fp8_kv_cache stores a vLLM server's KV cache in fp8 (TRL's colocated "
                "engine has no KV cache setting): add --vllm-server-gpus K (the stage's own "
                "server, started with --kv-cache-dtype fp8), or name yours started so "
                "(vllm_server_base_url)"
            )
        if self.async_generation and self.overrides.get("vllm_enable_sleep_mode"):
            raise ValueError(
                "training.async_generation: vLLM generates while the optimizer steps, so it "
                "cannot sleep: drop the override vllm_enable_sleep_mode"
            )
        if self.mode == "offline" and self.packing:
            raise ValueError(
                "training.packing: packed passes are GRPO's (modes cobalt, single_turn, "
                "multi_turn); the offline trainer pads its rows: drop --packing"
            )
        owned = sorted(k for k in self.overrides if k in OWNED)
        if owned:
            raise ValueError(
                f"training.overrides {owned[0]}: set {OWNED[owned[0]]} instead (one place "
                "decides it)"
            )
        return self

    def resolved_precision(self) -> str:
        """`precision` with auto made concrete on this machine (mixed, fp32 or bf16)."""
        return resolve_precision(
            self.precision, gpu=visible_gpus() > 0, mixed=self.defaults().mixed_precision
        )

    def resolved_sharding(self, gpus: int | None = None) -> str:
        """`sharding` with auto made concrete on this machine (ddp, fsdp, zero3 or hybrid); a custom
        accelerate_config decides by itself (reported as ddp here: nothing of ours shards)."""
        return resolve_sharding(self, visible_gpus() if gpus is None else gpus)

    def defaults(self) -> PresetDefaults:
        """What this config's preset decides for the settings left unset."""
        return PRESETS[self.preset]

    def trims_padding(self) -> bool:
        """`trim_padding`, or (None) the preset's (on for paper)."""
        return self.defaults().trim_padding if self.trim_padding is None else self.trim_padding

    def kl(self) -> KLEstimator:
        """The KL estimator in use: the setting, else the preset's (paper k2, tiny k3)."""
        return self.kl_estimator or self.defaults().kl

    def numerics_kwargs(self, gpu: bool | None = None) -> dict[str, Any]:
        """Trainer fields that follow from the precision and the curves' destination (`gpu`:
        the machine planned for; None: this one)."""
        if gpu is None:
            mixed = self.resolved_precision() == "mixed"
        else:
            mixed = resolve_precision(
                self.precision, gpu=gpu, mixed=self.defaults().mixed_precision
            )
            mixed = mixed == "mixed"
        return {"bf16": mixed, "fp16": False, "report_to": self.report_to or "none"}

    def prompt_limit(self) -> int:
        if self.max_prompt_length is not None:
            return self.max_prompt_length
        return self.defaults().prompt_limit

    def check(self) -> None:
        """Build the GRPOConfig (offline: the TrainingArguments) once, no training, so that an
        inconsistent setting fails before any work, e.g. a batch that does not divide into
        groups of num_generations."""
        if self.mode == "offline":
            self.training_arguments("unused-output-dir")
            return
        from trl import GRPOConfig

        try:
            kwargs = self.grpo_kwargs("unused-output-dir")
            GRPOConfig(**_as_every_process_sees_it(kwargs, self.world()))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"training config ({self.preset} preset): {exc}") from None
        check_batch(kwargs, self.world())

    def offline_kwargs(self, output_dir: str | Path) -> dict[str, Any]:
        """Keyword arguments of `transformers.TrainingArguments` for the offline mode."""
        gpu = visible_gpus() > 0
        o, preset = self.offline, self.defaults()
        micro, accumulation = self.offline_micro_batches()
        kwargs: dict[str, Any] = {
            "output_dir": str(output_dir),
            "learning_rate": o.learning_rate or preset.offline_learning_rate,
            "max_grad_norm": 1.0,
            "num_train_epochs": o.epochs,
            "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": accumulation,
            "seed": self.seed,
            "data_seed": self.seed,
            "logging_steps": 1,
            "remove_unused_columns": False,  # the collator needs the row's own columns
            "gradient_checkpointing": preset.offline_checkpoints,
            "save_strategy": "steps" if preset.offline_checkpoints else "no",
            "save_steps": 50,
            "save_total_limit": 2,
            "use_cpu": not gpu,
            "dataloader_num_workers": 0,
            "ddp_timeout": self.collective_timeout_s,
        }
        if self.max_steps is not None:
            kwargs["max_steps"] = self.max_steps
        if self.save_steps is not None:
            kwargs |= {"save_strategy": "steps", "save_steps": self.save_steps}
        return kwargs | self.numerics_kwargs() | self.overrides

    def offline_rows_per_step(self) -> int:
        """Rows of one offline optimizer step, whatever the number of processes: batch_size x
        gradient_accumulation_steps when set, else the preset's (paper 1024), else one
        micro-batch of batch_size."""
        o = self.offline
        if o.gradient_accumulation_steps is not None:
            return o.batch_size * o.gradient_accumulation_steps
        return self.defaults().offline_rows_per_step or o.batch_size

    def offline_micro_batches(self) -> tuple[int, int]:
        """(rows per micro-batch, micro-batches per step) of each process: the step's rows
        shared by the processes, in micro-batches of at most batch_size. ShardingError when
        they do not split evenly."""
        rows, processes = self.offline_rows_per_step(), self.world()
        share, rest = divmod(rows, processes)
        micro = min(self.offline.batch_size, share)
        if rest or not micro or share % micro:
            raise ShardingError(
                f"training.offline: {rows} rows per optimizer step (batch_size "
                f"{self.offline.batch_size} x gradient accumulation) do not split over "
                f"{processes} processes in micro-batches of at most {self.offline.batch_size}: "
                f"use --gpus {_divisors(rows)}, or set training.offline.batch_size and "
                "gradient_accumulation_steps so that rows per step divide by the processes"
            )
        return micro, share // micro

    def training_arguments(self, output_dir: str | Path) -> Any:
        """The offline mode's `TrainingArguments`; an override that is a GRPO setting (or no
        setting at all) is refused with its name."""
        from transformers import TrainingArguments

        fields = TrainingArguments.__dataclass_fields__
        unknown = sorted(k for k in self.overrides if k not in fields)
        if unknown:
            raise ValueError(
                f"training.overrides {unknown}: not TrainingArguments fields, so not used by the "
                "offline mode (GRPO settings such as num_generations are not): remove them, or "
                "set training.offline (objective, batch_size, learning_rate, ...)"
            )
        try:
            return TrainingArguments(**self.offline_kwargs(output_dir))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"training config (offline, {self.preset} preset): {exc}") from None

    def max_length(self) -> int:
        """Longest prompt + completion the offline mode trains on (tokens)."""
        if self.offline.max_length is not None:
            return self.offline.max_length
        return self.defaults().offline_max_length

    def grpo_kwargs(
        self, output_dir: str | Path, model: str | Path | None = None, gpus: int | None = None
    ) -> dict[str, Any]:
        """Keyword arguments of TRL's `GRPOConfig` for this preset; `model` (the policy's
        directory) decides `generation="auto"`; `gpus`: the machine planned for (None: this
        one)."""
        gpus = visible_gpus() if gpus is None else gpus
        gpu = gpus > 0
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
            "logging_steps": 1,
            "ddp_timeout": self.collective_timeout_s,
        }
        preset = self.defaults()
        kwargs = common | preset.grpo | {"use_cpu": not gpu}
        batch = self.overrides.get("generation_batch_size")
        own_step = {"per_device_train_batch_size", "gradient_accumulation_steps"} & set(
            self.overrides
        )
        # a generation_batch_size of the user's replaces the preset's step (below)
        replaced = preset.plan_micro_batch and batch is not None and not own_step
        if preset.prompts_per_step and not replaced:
            step = preset.prompts_per_step
            if step % self.world():
                import math

                generations = int(kwargs["num_generations"])
                whole = math.lcm(self.world(), generations)  # rows a process, groups whole
                nearest = max(whole, step * generations // whole * whole)
                raise ShardingError(
                    f"training.num_processes {self.world()}: the {self.preset} preset's step "
                    f"of {step} prompts x {generations} samples must split evenly over the "
                    f"processes: use --gpus {_divisors(step)} (in all), or a step of your own "
                    f"that does (--set generation_batch_size={nearest}, a multiple of {whole})"
                )
            kwargs["gradient_accumulation_steps"] = step // self.world()
        if self.max_steps is not None:
            kwargs["max_steps"] = self.max_steps
        if self.save_steps is not None:
            kwargs |= {"save_strategy": "steps", "save_steps": self.save_steps}
            kwargs.setdefault("save_total_limit", 2)
        kwargs |= self.numerics_kwargs(gpu) | self.generation_kwargs(gpu, model) | self.overrides
        if replaced:
            # a smaller generation batch (a short run, a benchmark): one optimizer step per
            # batch, each process's share split into micro-batches by the memory plan
            share, rest = divmod(int(batch), self.world())
            if rest:
                raise ShardingError(
                    f"training.overrides generation_batch_size {batch} does not split over "
                    f"{self.world()} processes: use a multiple of {self.world()}"
                )
            kwargs |= {"per_device_train_batch_size": share, "gradient_accumulation_steps": 1}
        if (own_step or not preset.prompts_per_step) and self.world() > 1:
            kwargs |= self._shared_step(kwargs)
        if kwargs.get("vllm_mode") == "colocate" and "vllm_enable_sleep_mode" not in self.overrides:
            # sharded full fine-tuning: vLLM's weights and KV cache leave the GPU while the
            # optimizer steps (TRL's sleep mode), the memory the training phase needs; one step
            # off, it generates while the optimizer steps: awake
            kwargs["vllm_enable_sleep_mode"] = (
                not self.async_generation and self.resolved_sharding(gpus) in SHARDED
            )
        bias = (kwargs.get("generation_kwargs") or {}).get("logit_bias")
        if bias:  # vLLM's SamplingParams wants token ids; JSON (--set, a job file) has strings
            kwargs["generation_kwargs"] = {
                **kwargs["generation_kwargs"],
                "logit_bias": {int(token): float(value) for token, value in bias.items()},
            }
        if kwargs.get("use_vllm"):
            kwargs.setdefault("vllm_importance_sampling_correction", self.is_correction())
            if self.fp8_sampler():
                # per token, capped: fp8's samples drift from the trainer's probabilities at
                # every token, so TRL's default product over a sequence (sequence_mask) weighs
                # a whole completion by exp(-14) at ~200 tokens (docs/SCALING.md, fp8 generation)
                kwargs.setdefault("vllm_importance_sampling_mode", "token_truncate")
            # vLLM's context: what training can feed it, not the model's own (131k for
            # R1-Distill-Llama would not fit vLLM's share of the GPU)
            kwargs.setdefault(
                "vllm_max_model_length", self.prompt_limit() + int(kwargs["max_completion_length"])
            )
        return kwargs

    def _shared_step(self, kwargs: dict[str, Any]) -> dict[str, int]:
        """Without a preset step (tiny), or where the settings give their own (`--set
        per_device_train_batch_size`, `gradient_accumulation_steps`), per_device x accumulation
        is one process's optimizer step; N processes share those completions (each a 1/N share,
        in micro-batches of at most the per-device size), so a step trains on as many
        completions on any number of processes (a global step that grew with them trained
        another recipe)."""
        import math

        n = self.world()
        per_device = int(kwargs["per_device_train_batch_size"])
        step = per_device * int(kwargs.get("gradient_accumulation_steps", 1))
        if step % n:
            raise ShardingError(
                f"training: a step of {step} completions (per_device_train_batch_size "
                f"{per_device} x gradient_accumulation_steps, one process's) does not split "
                f"over {n} processes: use --gpus {_divisors(step)}, or a step that divides"
            )
        micro = math.gcd(per_device, step // n)
        return {
            "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": step // n // micro,
        }

    def fp8_sampler(self) -> bool:
        """The sampler computes in fp8 somewhere (its weights, its KV cache): it is not the
        model the trainer computes."""
        return self.fp8_generation or self.fp8_kv_cache

    def is_correction(self) -> bool:
        """vllm_is_correction as set, else on exactly when the sampler is quantized (fp8)."""
        return self.fp8_sampler() if self.vllm_is_correction is None else self.vllm_is_correction

    def _check_own_server(self) -> None:
        """vllm_server_gpus: a server of the stage's own, on this machine, for GRPO."""
        if self.generation not in ("auto", "vllm_server"):
            raise ValueError(
                f"training.vllm_server_gpus {self.vllm_server_gpus} starts a vLLM server to "
                f"generate, but training.generation is {self.generation}: drop one of them"
            )
        if self.vllm_server_base_url:
            raise ValueError(
                f"training.vllm_server_gpus starts a server of the stage's own, and "
                f"vllm_server_base_url ({self.vllm_server_base_url}) names yours: drop one"
            )
        if self.nodes > 1 or self.mode in ("offline", "multi_turn") or self.rollout:
            raise ValueError(
                "training.vllm_server_gpus: a vLLM server of the stage's is built for one node "
                "and TRL's own single-turn generation (modes cobalt and single_turn, no rollout): "
                "drop --vllm-server-gpus, or start a server yourself (vllm_server_base_url)"
            )

    def generation_choice(
        self, gpu: bool, model: str | Path | None = None, parameters: int | None = None
    ) -> tuple[str, str | None]:
        """The generation backend and, for auto, why: a vLLM server where the stage starts one
        (vllm_server_gpus); else vLLM colocated where the generating stages would pick vLLM for
        this model (`engines.auto.choose`: its size, vLLM installed, a GPU), else transformers.
        `parameters` stands for a model not built yet."""
        if self.vllm_server_gpus:
            precision = (" in fp8" if self.fp8_generation else "") + (
                " (KV cache in fp8)" if self.fp8_kv_cache else ""
            )
            return (
                "vllm_server",
                f"a vLLM server{precision} on {self.vllm_server_gpus} GPU(s) of its own",
            )
        if self.generation != "auto":
            return self.generation, None
        choice = choose(model, parameters=parameters, vllm_installed=vllm_available(), gpu=gpu)
        return ("vllm_colocate" if choice.kind == "vllm" else "transformers"), choice.reason

    def generation_kwargs(self, gpu: bool, model: str | Path | None = None) -> dict[str, Any]:
        """GRPOConfig fields of the chosen generation backend."""
        mode, _ = self.generation_choice(gpu, model)
        if mode.startswith("vllm") and not vllm_available():
            raise ValueError(f"generation={mode!r} needs vLLM: pip install '.[gpu]'")
        if mode == "vllm_colocate":
            return {"use_vllm": True, "vllm_mode": "colocate"}
        if mode == "vllm_server":
            if not self.vllm_server_base_url and not self.vllm_server_gpus:
                raise ValueError(
                    "generation='vllm_server' needs vllm_server_base_url (a server you started) "
                    "or vllm_server_gpus (one the stage starts: --vllm-server-gpus N)"
                )
            found: dict[str, Any] = {"use_vllm": True, "vllm_mode": "server"}
            if self.vllm_server_base_url:  # the stage's own server: set at its launch
                found["vllm_server_base_url"] = self.vllm_server_base_url
            return found
        return {"use_transformers_paged": mode == "paged"}


def _divisors(n: int, most: int = 64) -> str:
    """'1, 2, 4 or 8': the process counts (up to `most`) that divide n."""
    *first, last = [str(d) for d in range(1, min(n, most) + 1) if n % d == 0]
    return f"{', '.join(first)} or {last}" if first else last
