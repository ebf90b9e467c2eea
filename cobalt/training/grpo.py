"""GRPO post-training on the Cobalt bandit dataset (SPEC §1.5, §1.6) with TRL's `GRPOTrainer`.

`CobaltRewards` holds one shared sandbox judge and gives TRL's reward callables `correctness` and
`format` (logged by TRL as `rewards/correctness/mean` and `rewards/format/mean`). `prepare_rows`
filters the bandit rows by mode and prompt length; `train(...)` runs the trainer (resuming from the
last checkpoint in its output directory), saves the final model and returns the log history.
Settings: `cobalt/training/config.py`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from cobalt.training.config import Mode, TrainingConfig
from cobalt.training.guards import NonFiniteGuard
from cobalt.training.reward import correctness_reward, format_reward
from cobalt.training.sharding import SHARDED
from cobalt.trajectories.prompts import extract_code
from engines import split_thinking, with_open_thinking
from engines.thinking import template_opens_thinking
from sandbox import JudgeRequest, SandboxConfig, SyncJudge, TestSuite

log = logging.getLogger(__name__)

# --- rewards -------------------------------------------------------------------------------------


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a list of messages (conversational)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role") == "assistant")


def as_suite(test_cases: Any) -> TestSuite:
    """A `TestSuite` from a row's `test_cases` (a suite, a dict, or its JSON text)."""
    if isinstance(test_cases, TestSuite):
        return test_cases
    if isinstance(test_cases, str):
        test_cases = json.loads(test_cases)
    return TestSuite.model_validate(test_cases)


def _clip(x: float) -> float:
    return max(-1.0, min(1.0, x))


class Judged(NamedTuple):
    """A program's result on all tests of its row: pass rate and per-test pass flags."""

    pass_rate: float
    passed: tuple[bool, ...]


class CobaltRewards:
    """TRL reward callables sharing one sandbox judge; use as a context manager.

    `correctness` judges the program of every completion of the batch concurrently
    (`judge_many`; the program after `</think>`, `program`) and returns
    `correctness_reward(pass_rate or None, prev_best_pass_rate, training=True)`; `format` is
    `format_reward` with `correct` = correctness reward >= 0 (results are cached per program).

    TRL sums the reward functions (weights 1) without clipping, so `format` returns the clipped
    contribution clip(correctness + format_term, -1, 1) - correctness: the sum TRL trains on is
    SPEC §1.5's clipped total (`tasks.reward.total_reward`), and `rewards/format/mean` logs that
    contribution (0 when correctness is already -1).

    Rows from the multi-turn rollout (cobalt/training/multiturn.py) carry the rewarded `program`
    and its `response`: those are judged and formatted instead of the decoded completion."""

    def __init__(
        self,
        sandbox: SandboxConfig,
        count_tokens: Callable[[str], int] | None = None,
        opened_thinking: bool = False,
    ):
        self.judge = SyncJudge(sandbox)
        self.count_tokens = count_tokens
        self.opened_thinking = opened_thinking
        self._cache: dict[tuple[str, str], Judged] = {}

    def program(self, text: str) -> str | None:
        """The program a completion submits, as the trajectory stage takes it: the last code
        block of the answer after `</think>` (the whole answer, not the 6000-character cap);
        None when the reasoning never closed (cut by the token limit, or a template that opened
        `<think>` in the prompt and a response without `</think>`)."""
        return extract_code(split_thinking(with_open_thinking(text, self.opened_thinking), None))

    def __enter__(self) -> CobaltRewards:
        self.judge.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.judge.__exit__(*exc)

    def results(
        self, codes: Sequence[str | None], test_cases: Sequence[Any]
    ) -> list[Judged | None]:
        """Each program on all tests of its row (None: no program), judged concurrently once."""
        suites = [as_suite(tc) for tc in test_cases]
        keys = [
            (c, s.model_dump_json()) if c is not None else None
            for c, s in zip(codes, suites, strict=True)
        ]
        todo = {k: s for k, s in zip(keys, suites, strict=True) if k and k not in self._cache}
        if todo:
            requests = [
                JudgeRequest(id=str(i), code=k[0], tests=s) for i, (k, s) in enumerate(todo.items())
            ]
            for key, verdict in zip(todo, self.judge.judge_many(requests), strict=True):
                self._cache[key] = Judged(verdict.pass_rate, tuple(verdict.passed))
        if len(self._cache) > 50_000:
            self._cache.clear()
        return [self._cache.get(k) if k else None for k in keys]

    def programs(
        self, completions: Sequence[Any], program: Sequence[str | None] | None = None
    ) -> list[str | None]:
        """The program each row is rewarded on: the rollout's `program`, else the completion's
        (`program`)."""
        if program is not None:
            return list(program)
        return [self.program(completion_text(c)) for c in completions]

    def correctness_rewards(
        self, completions, test_cases, prev_best_pass_rate, program=None
    ) -> list[float]:
        results = self.results(self.programs(completions, program), test_cases)
        return [
            correctness_reward(r.pass_rate if r else None, float(b or 0.0), training=True)
            for r, b in zip(results, prev_best_pass_rate, strict=True)
        ]

    def format_rewards(
        self, completions, test_cases, prev_best_pass_rate, program=None, response=None
    ) -> list[float]:
        if self.count_tokens is None:
            raise ValueError("the format reward needs count_tokens")
        texts = (
            list(response) if response is not None else [completion_text(c) for c in completions]
        )
        correct = self.correctness_rewards(completions, test_cases, prev_best_pass_rate, program)
        return [
            _clip(r + format_reward(t, self.count_tokens, correct=r >= 0)) - r
            for t, r in zip(texts, correct, strict=True)
        ]

    def reward_funcs(self, use_format: bool = False) -> list[Callable[..., list[float]]]:
        """TRL reward callables (named `correctness` and `format` in the logs)."""

        def correctness(
            completions, test_cases, prev_best_pass_rate, program=None, **kwargs
        ) -> list[float]:
            return self.correctness_rewards(completions, test_cases, prev_best_pass_rate, program)

        def format(  # noqa: A001
            completions, test_cases, prev_best_pass_rate, program=None, response=None, **kwargs
        ) -> list[float]:
            return self.format_rewards(
                completions, test_cases, prev_best_pass_rate, program, response
            )

        return [correctness, format] if use_format else [correctness]


# --- dataset and training ------------------------------------------------------------------------


def is_turn0(row: dict[str, Any]) -> bool:
    """A turn-0 context: the prompt holds no earlier assistant answer."""
    return not any(m.get("role") == "assistant" for m in row["prompt"])


def prepare_rows(
    rows: Sequence[dict[str, Any]],
    mode: Mode,
    prompt_tokens: Callable[[list[dict[str, str]]], int] | None = None,
    max_prompt_length: int | None = None,
) -> list[dict[str, Any]]:
    """Rows for `Dataset.from_list`: filtered by mode and prompt length, test_cases as JSON text."""
    out = []
    for row in rows:
        if mode in ("single_turn", "multi_turn") and not is_turn0(row):
            continue
        too_long = max_prompt_length is not None and prompt_tokens is not None
        if too_long and prompt_tokens(row["prompt"]) > max_prompt_length:
            continue
        tc = row["test_cases"]
        if isinstance(tc, TestSuite):
            tc = tc.model_dump_json()
        elif not isinstance(tc, str):
            tc = json.dumps(tc)
        out.append(
            {
                "prompt": [dict(m) for m in row["prompt"]],
                "test_cases": tc,
                "prev_best_pass_rate": float(row.get("prev_best_pass_rate") or 0.0),
                "difficulty": str(row.get("difficulty") or ""),
                "example_id": str(row.get("example_id") or ""),
            }
        )
    return out


def last_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete `checkpoint-N` directory in `output_dir` (what a killed run resumes
    from). The trainer writes a checkpoint's `trainer_state.json` after its weights, optimizer
    and RNG states, and only then deletes older ones: a process killed while saving leaves a
    newer directory without it, which is skipped (transformers' own `get_last_checkpoint`
    would pick it and the resumed run would fail)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    complete = [
        p
        for p in folder.glob("checkpoint-*")
        if p.name.removeprefix("checkpoint-").isdigit() and (p / "trainer_state.json").is_file()
    ]
    if not complete:
        return None
    return str(max(complete, key=lambda p: int(p.name.removeprefix("checkpoint-"))))


@dataclass
class GRPORun:
    """What `train` did: the trainer's log history, the numerics it trained in, the memory plan
    (paper preset on a GPU), and whether the format reward was on."""

    history: list[dict[str, Any]]
    numerics: dict[str, str]
    plan: dict[str, Any] | None = None
    format_reward: bool = False


def uses_format_reward(config: TrainingConfig, tokenizer: Any) -> bool:
    """The setting, or (None) on for the paper preset when the tokenizer knows `</think>`."""
    if config.use_format_reward is not None:
        return config.use_format_reward
    return config.preset == "paper" and "</think>" in tokenizer.get_vocab()


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


def save_policy(
    trainer: Any, output_dir: str | Path, numerics: Any, tokenizer: Any, *, lora: bool
) -> None:
    """The trained policy as a plain model directory in the checkpoint's dtype, which the
    engines and vLLM load: LoRA adapters merged into the weights; a full model's state gathered
    from every process (whole under ddp, from the shards under fsdp / zero3: every process takes
    part), cast and written once by the main process (an 8B policy: 16 GB of bf16, not 32 GB of
    fp32 rewritten)."""
    import torch

    from cobalt.training.precision import cast_saved, write_saved_dtype

    if lora:
        if trainer.is_world_process_zero():
            trainer.model.merge_and_unload().save_pretrained(str(output_dir))
            cast_saved(output_dir, numerics)
    else:
        state = trainer.accelerator.get_state_dict(trainer.model)
        if trainer.is_world_process_zero():
            dtype = getattr(torch, numerics.saved)
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
            model = trainer.accelerator.unwrap_model(trainer.model)
            model.save_pretrained(str(output_dir), state_dict=state)
            write_saved_dtype(output_dir, numerics)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(output_dir))
    trainer.accelerator.wait_for_everyone()


def plan_vllm(
    config: TrainingConfig,
    kwargs: dict[str, Any],
    model: Any,
    numerics: Any,
    shards: int,
    logger: Any = log,
) -> dict[str, Any]:
    """A sleeping colocated vLLM's share of the GPU (`cobalt.training.memory.vllm_share`), unless
    set: its weights and the KV cache of this process's share of a generation batch at full
    length, beside the training state that stays on the GPU while it generates."""
    if "vllm_gpu_memory_utilization" in config.overrides:
        return kwargs
    import torch

    from cobalt.training.memory import state_bytes, vllm_share

    parameters = sum(p.numel() for p in model.parameters())
    resident = state_bytes(
        parameters,
        trainable=0 if config.lora else parameters,
        trainable_dtype=numerics.trainable,
        frozen_dtype=numerics.frozen,
        reference_model=not config.lora and bool(kwargs.get("beta")),
        shards=shards,
    )
    batch = kwargs.get("generation_batch_size") or int(kwargs["per_device_train_batch_size"]) * (
        config.num_processes * int(kwargs["gradient_accumulation_steps"])
    )
    share = vllm_share(
        model.config,
        sequences=max(1, int(batch) // config.num_processes),
        context_tokens=int(kwargs.get("vllm_max_model_length") or kwargs["max_completion_length"]),
        total_bytes=torch.cuda.mem_get_info()[1],
        resident_bytes=resident,
        tensor_parallel=int(kwargs.get("vllm_tensor_parallel_size", 1)),
    )
    logger.info(
        "vLLM colocated in sleep mode: %.3f of the GPU (weights, KV cache of %d sequences)",
        share,
        max(1, int(batch) // config.num_processes),
    )
    return kwargs | {"vllm_gpu_memory_utilization": share}


def train(
    config: TrainingConfig,
    dataset_rows: Sequence[dict[str, Any]],
    model_path: str | Path,
    output_dir: str | Path,
    callbacks: Sequence[Any] = (),
    logger: Any = log,
    problems: Sequence[Any] | None = None,
) -> GRPORun:
    """Run TRL's GRPOTrainer on the bandit rows, resuming from the last checkpoint in
    `output_dir` if there is one; save the final model (in the checkpoint's dtype) and tokenizer
    to `output_dir`. Numerics from `cobalt.training.precision`, the paper preset's micro-batch
    from `cobalt.training.memory`, the KL estimator from `cobalt.training.kl`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from cobalt.training.kl import CobaltGRPOTrainer
    from cobalt.training.precision import (
        cast_trainable,
        checkpoint_dtype,
        decide,
        load_dtype,
        trainable_dtypes,
    )

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

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
    gpu = torch.cuda.is_available()
    numerics = decide(
        config.precision, checkpoint_dtype(model_path), gpu=gpu, paper=config.preset == "paper"
    )
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
    model = AutoModelForCausalLM.from_pretrained(
        str(model_path), dtype=load_dtype(numerics, config.lora is not None), **attention
    )
    plan = None
    shards = config.num_processes if config.resolved_sharding() in SHARDED else 1
    if shards > 1 and "model_init_kwargs" in kwargs:
        # TRL loads the reference model with device_map "auto" unless told otherwise outside
        # ddp / DeepSpeed: under fsdp it was spread over every GPU (accelerate's dispatch
        # hooks: "found at least two devices, cuda:1 and cuda:2"); fsdp shards it instead
        kwargs["model_init_kwargs"] = {**kwargs["model_init_kwargs"], "device_map": None}
    if gpu and kwargs.get("vllm_enable_sleep_mode"):
        kwargs = plan_vllm(config, kwargs, model, numerics, shards, logger)
    if config.preset == "paper" and gpu and "per_device_train_batch_size" not in config.overrides:
        from cobalt.training.memory import fit_micro_batch

        longest = max(prompt_tokens(r["prompt"]) for r in rows)
        plan = fit_micro_batch(config, kwargs, model, numerics, longest, shards)
        kwargs |= {
            "per_device_train_batch_size": plan.micro_batch,
            "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        }
        logger.info(plan.describe())
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(Path(output_dir, "tensorboard"))
    args = GRPOConfig(**kwargs)
    check_generation_batch(len(rows), args.generation_batch_size, args.num_generations)
    dataset = Dataset.from_list(rows)

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    use_format = uses_format_reward(config, tokenizer)
    guard = NonFiniteGuard()
    opened = template_opens_thinking(tokenizer)
    if config.mode == "multi_turn" and problems is None:
        raise ValueError(
            "multi_turn training needs the problems (their public tests give feedback)"
        )
    with CobaltRewards(config.sandbox, count_tokens, opened_thinking=opened) as rewards:
        funcs = rewards.reward_funcs(use_format)
        if config.reward == "dense":
            from cobalt.training.dense_reward import dense_reward_func

            funcs.append(dense_reward_func(rewards, args.num_generations))
        rollout = None
        if config.mode == "multi_turn":
            from cobalt.training.multiturn import repair_rollout

            rollout = repair_rollout(
                problems or (),
                rewards.judge,
                turns=config.turns,
                max_context_tokens=kwargs.get("vllm_max_model_length"),
            )
        trainer = CobaltGRPOTrainer(
            model=model,
            reward_funcs=funcs,
            rollout_func=rollout,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[*callbacks, guard],
            peft_config=config.lora.peft_config() if config.lora else None,
            kl_estimator=config.kl(),
            trim_padding=config.trims_padding(),
        )
        cast_trainable(trainer.model, numerics)
        logger.info(
            "%s; trainable parameters in %s; KL %s; format reward %s",
            numerics.describe(),
            sorted(trainable_dtypes(trainer.model)),
            config.kl(),
            "on" if use_format else "off",
        )
        trainer.train(resume_from_checkpoint=last_checkpoint(output_dir))
    guard.check(numerics.describe() + ".")
    save_policy(trainer, output_dir, numerics, tokenizer, lora=config.lora is not None)
    return GRPORun(
        history=list(trainer.state.log_history),
        numerics=numerics.as_dict(),
        plan=plan.as_dict() if plan else None,
        format_reward=use_format,
    )
