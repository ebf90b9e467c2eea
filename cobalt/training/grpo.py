"""GRPO post-training on the Cobalt bandit dataset (METHOD §1.5, §1.6) with TRL's `GRPOTrainer`.

`train(...)` filters the bandit rows by mode and prompt length (`cobalt.bandit.rows`), rewards
completions in the sandbox (`cobalt/training/method/sandbox_reward.py`), runs the trainer (resuming
from the last checkpoint in its output directory), saves the final model and returns the log
history. Settings: `cobalt/training/settings.py`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cobalt.bandit.rows import prepare_rows
from cobalt.training.machinery.checkpoints import last_checkpoint
from cobalt.training.machinery.overlap import OneStepOff
from cobalt.training.machinery.plan import (
    TrainingPlan,
    plan_training,
    planned_micro_batch,
    planned_numerics,
    same_on_every_process,
)
from cobalt.training.machinery.weights import load_policy, load_tokenizer, save_policy
from cobalt.training.method.sandbox_reward import CobaltRewards
from cobalt.training.reporting.console import install as install_console
from cobalt.training.reporting.guards import NonFiniteGuard
from cobalt.training.settings import TrainingConfig
from engines import visible_gpus
from engines.thinking import template_opens_thinking

log = logging.getLogger(__name__)


@dataclass
class GRPORun:
    """What `train` did: the trainer's log history, the numerics it trained in, the memory plan
    (paper preset on a GPU), whether the format reward was on, and with async generation how
    its batches were sampled (`cobalt.training.machinery.overlap.OneStepOff.summary`)."""

    history: list[dict[str, Any]]
    numerics: dict[str, str]
    plan: dict[str, Any] | None = None
    format_reward: bool = False
    overlap: dict[str, Any] | None = None


def uses_format_reward(config: TrainingConfig, tokenizer: Any) -> bool:
    """The setting, or (None) on for the paper preset when the tokenizer knows `</think>`."""
    if config.use_format_reward is not None:
        return config.use_format_reward
    return config.defaults().format_reward and "</think>" in tokenizer.get_vocab()


def check_generation_batch(rows: int, generation_batch_size: int, num_generations: int) -> None:
    """TRL's sampler draws whole generation batches of generation_batch_size / num_generations
    prompts and drops what is left over: with fewer rows than that, no step would run."""
    prompts = generation_batch_size // num_generations
    if rows < prompts:
        raise ValueError(
            f"training: {rows} rows but each generation batch samples {prompts} prompts "
            f"(generation_batch_size {generation_batch_size} / num_generations {num_generations}): "
            f"no step would run; use more problems, or set training.overrides "
            f"generation_batch_size to at most {rows * num_generations} (a multiple of "
            f"num_generations and of the micro-batch)"
        )


def import_rollout(name: str) -> Any:
    """The rollout_func `module:function` names (`TrainingConfig.rollout`)."""
    import importlib

    module, _, attribute = name.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"training.rollout {name!r}: {exc}") from None


def micro_batch(
    config: TrainingConfig,
    kwargs: dict[str, Any],
    model_path: str | Path,
    numerics: Any,
    rows: Sequence[dict[str, Any]],
    prompt_tokens: Any,
    plan: TrainingPlan,
) -> Any:
    """The paper preset's micro-batch (`cobalt.training.machinery.plan.planned_micro_batch`) from
    the model's config, the longest prompt of the rows (every process reads all of them) and the
    plan's GPU memory: the same inputs, so the same plan, in every process. A multi-turn
    conversation's completion holds every turn and its feedback."""
    from transformers import AutoConfig

    from cobalt.training.machinery.memory import parameter_count

    model_config = AutoConfig.from_pretrained(str(model_path))
    longest = max(prompt_tokens(r["prompt"]) for r in rows)
    parameters = plan.parameters or parameter_count(model_config)
    return planned_micro_batch(config, kwargs, model_config, parameters, numerics, plan, longest)


def train(
    config: TrainingConfig,
    dataset_rows: Sequence[dict[str, Any]],
    model_path: str | Path,
    output_dir: str | Path,
    callbacks: Sequence[Any] = (),
    logger: Any = log,
    problems: Sequence[Any] | None = None,
    plan: TrainingPlan | None = None,
) -> GRPORun:
    """Run TRL's GRPOTrainer on the bandit rows, resuming from the last checkpoint in
    `output_dir` if there is one; save the final model (in the checkpoint's dtype) and tokenizer
    to `output_dir`. `plan`: the run's GPU plan (`cobalt.training.machinery.plan`; None: planned
    here, for this process alone), whose GPU memory every process plans its micro-batch against and
    whose vLLM share it gives a colocated vLLM. Loading, numerics and saving from
    `cobalt.training.machinery.weights`, the paper preset's micro-batch from
    `cobalt.training.machinery.memory`, the
    KL estimator from `cobalt.training.machinery.trl_trainer`."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig

    from cobalt.training.machinery.precision import (
        cast_trainable,
        reduce_probe,
        set_distributed_numerics,
        trainable_dtypes,
    )
    from cobalt.training.machinery.trl_trainer import CobaltGRPOTrainer

    tokenizer = load_tokenizer(model_path)

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    rows = prepare_rows(dataset_rows, config.mode, prompt_tokens, config.prompt_limit())
    if not rows:
        raise ValueError(
            f"no training rows left after the mode ({config.mode}) and prompt-length "
            f"(max_prompt_length {config.prompt_limit()}) filters"
        )
    plan = plan or plan_training(config, model_path)
    gpu, numerics = plan.gpus > 0, planned_numerics(plan, model_path)  # decided once
    kwargs = config.grpo_kwargs(output_dir, model_path)
    if not config.lora and kwargs.get("beta"):
        # TRL builds its frozen reference model from these (not in fp32: it is never trained);
        # TRL's warning that they are "ignored" concerns the policy, which is passed loaded
        kwargs.setdefault("model_init_kwargs", {"dtype": numerics.frozen})
    if not config.cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)
    attention = (
        {"attn_implementation": config.attn_implementation} if config.attn_implementation else {}
    )
    if plan.shards > 1 and "model_init_kwargs" in kwargs:
        # TRL loads the reference model with device_map "auto" unless told otherwise outside
        # ddp / DeepSpeed: under fsdp it was spread over every GPU (accelerate's dispatch
        # hooks: "found at least two devices, cuda:1 and cuda:2"); fsdp shards it instead
        kwargs["model_init_kwargs"] = {**kwargs["model_init_kwargs"], "device_map": None}
    if gpu and plan.vllm_share is not None:
        kwargs["vllm_gpu_memory_utilization"] = plan.vllm_share
        logger.info(
            "vLLM colocated in sleep mode: %.3f of each GPU (the run's plan)", plan.vllm_share
        )
    micro = None
    planned = config.defaults().plan_micro_batch
    if planned and gpu and "per_device_train_batch_size" not in config.overrides:
        micro = micro_batch(config, kwargs, model_path, numerics, rows, prompt_tokens, plan)
        kwargs |= {
            "per_device_train_batch_size": micro.micro_batch,
            "gradient_accumulation_steps": micro.gradient_accumulation_steps,
        }
        logger.info(micro.describe())
    if config.gradient_sync == "micro_batch" or (micro and micro.reduce_every_micro_batch):
        # accelerate's own switch: the Trainer then leaves `no_sync` off for every micro-batch
        accelerator_config = dict(kwargs.get("accelerator_config") or {})
        accelerator_config["gradient_accumulation_kwargs"] = {"sync_each_batch": True}
        kwargs["accelerator_config"] = accelerator_config
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(Path(output_dir, "tensorboard"))
    # the trainer's arguments before the policy's load: they start the process group, and under
    # ZeRO-3 they make from_pretrained partition the weights as it loads them
    args = GRPOConfig(**kwargs)
    same_on_every_process("the GPUs of a node", visible_gpus())
    same_on_every_process(
        "the micro-batch", (args.per_device_train_batch_size, args.gradient_accumulation_steps)
    )
    check_generation_batch(len(rows), args.generation_batch_size, args.num_generations)
    if config.share_prompts and args.per_device_train_batch_size < 2:
        logger.warning(
            "training.share_prompts: micro-batches of 1 row share no prompt, so the passes are "
            "packed only; a micro-batch holds more rows with shorter max_completion_length, "
            "LoRA (--lora) or more GPUs (--gpus N --sharding fsdp)"
        )
    model = load_policy(model_path, numerics, lora=config.lora is not None, **attention)
    dataset = Dataset.from_list(rows)

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    use_format = uses_format_reward(config, tokenizer)
    guard = NonFiniteGuard()
    probe = reduce_probe(plan.sharding if config.world() > 1 else None)
    opened = template_opens_thinking(tokenizer)
    if config.mode == "multi_turn" and problems is None:
        raise ValueError(
            "multi_turn training needs the problems (their public tests give feedback)"
        )
    with CobaltRewards(config.sandbox, count_tokens, opened_thinking=opened) as rewards:
        funcs = rewards.reward_funcs(use_format)
        if config.reward == "dense":
            from cobalt.training.method.dense_reward import dense_reward_func

            funcs.append(dense_reward_func(rewards, args.num_generations))
        rollout = import_rollout(config.rollout) if config.rollout else None
        if config.mode == "multi_turn":
            from cobalt.training.method.multiturn_rollout import repair_rollout

            rollout = repair_rollout(
                problems or (),
                rewards.judge,
                turns=config.turns,
                max_context_tokens=kwargs.get("vllm_max_model_length"),
            )
        peft_config = config.lora.peft_config() if config.lora else None
        one_step_off = None
        if config.async_generation:
            # sampling with transformers: from a copy of the policy before the trainer wraps it
            # the batch sampled ahead is judged in the background too (the rewards' cache)
            one_step_off = OneStepOff(
                policy=None if args.use_vllm else model,
                peft_config=peft_config,
                prejudge=rewards.prejudge,
            )
            rollout = one_step_off
            logger.info(
                "generation overlapped with training, one step off: each batch sampled while "
                "the one before it trains (--async)"
            )
        if args.use_vllm and args.vllm_mode == "server" and args.vllm_server_base_url:
            # the stage's own server starts while the processes load (cobalt.training.
            # vllm_server): each waits for it here, before any step the processes take together
            from cobalt.training.machinery.vllm_server import wait_for_server

            waited = wait_for_server(args.vllm_server_base_url, args.vllm_server_timeout)
            logger.info("vLLM server up (waited %.0f s after loading)", waited)
        trainer = CobaltGRPOTrainer(
            model=model,
            reward_funcs=funcs,
            rollout_func=rollout,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[*callbacks, guard, probe, *([one_step_off] if one_step_off else [])],
            peft_config=peft_config,
            kl_estimator=config.kl(),
            trim_padding=config.trims_padding(),
            packing=config.packing,
            share_prompts=config.share_prompts,
            lookahead=one_step_off is not None,
        )
        install_console(trainer)  # a progress bar and a line every few steps, not each dict
        if one_step_off is not None:
            one_step_off.attach(trainer)
        cast_trainable(trainer.model, numerics)
        set_distributed_numerics(trainer.accelerator, numerics, config.fsdp_gather, trainer.model)
        probe.trainer = trainer
        logger.info(
            "%s; trainable parameters in %s; KL %s; format reward %s",
            numerics.describe(),
            sorted(trainable_dtypes(trainer.model)),
            config.kl(),
            "on" if use_format else "off",
        )
        try:
            trainer.train(resume_from_checkpoint=last_checkpoint(output_dir))
        finally:
            if one_step_off is not None:
                one_step_off.close()
    guard.check(numerics.describe() + ".")
    save_policy(trainer, output_dir, numerics, tokenizer, lora=config.lora is not None)
    return GRPORun(
        history=list(trainer.state.log_history),
        numerics=numerics.as_dict()
        | {
            "reduce_in_use": probe.seen,
            "gather_in_use": probe.gathered,
            "wrapped_as": probe.wrapped,
            # what the Trainer read: accelerate's no_sync until a step's last micro-batch, or not
            "gradient_sync": "micro_batch"
            if trainer.accelerator.gradient_state.plugin_kwargs.get("sync_each_batch")
            else "step",
        },
        plan=micro.as_dict() if micro else None,
        format_reward=use_format,
        overlap=one_step_off.summary() if one_step_off else None,
    )
