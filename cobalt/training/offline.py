"""The offline trainer: its rows and batches, the `transformers.Trainer` around the objectives
and its report, in the order a run uses them.

Offline policy updates (METHOD §2, arXiv 2605.28409): the policy learns from the logged turns of
the trajectories and their rewards (`cobalt/training/method/offline_rows.py`), with no generation
and no sandbox while training. A `transformers.Trainer` subclass (`OfflineTrainer`) runs the loop
(batching, optimizer, gradient accumulation, checkpoints and resume, bf16, logging); LoRA through
peft as in the GRPO path (merged on save). Settings: `OfflineSettings` in
`cobalt/training/settings.py`.

Rows: the prompt (messages) is rendered with the policy's chat template and the generation prompt,
as the engines render it; the completion is the logged text tokenized without special tokens,
followed by the end-of-turn token when the turn stopped by itself (not when it was cut by the
token limit). Only completion tokens enter the loss (the prompt is masked). Rows whose prompt +
completion exceed `max_length` tokens are dropped, never cut.

The objectives (AWR, REINFORCE-LOO, the clipped ratio) and how their loss is normalised:
`cobalt.training.method.offline_objectives`.

Logged per step (beside the Trainer's `loss`, `grad_norm`, `learning_rate`): `advantage` (mean
A), `weight` (mean row weight), `weighted_advantage` (mean w * A: 1 for reinforce_loo, the AWR
weight, the row's mean ratio for clipped_ratio), `logprob` (mean completion token log-prob),
`logprob_positive` / `logprob_negative` (the same over the rows whose advantage is > 0 / < 0,
when the batch has some: the two should part as the policy learns), `reward` (mean logged
reward) and, for clipped_ratio, `ratio` and `clip_fraction`. Also, for every objective, what
the learning check needs to tell why an objective does not learn (docs/LEARNING.md, offline
objectives): `advantage_std`, `negative_share` (rows with A < 0), `negative_weight_share` (the
share of sum |w A| carried by those rows: how much of the update pushes probability down),
`weight_std`, `weight_max` and, for awr, `weight_capped` (rows at `awr_max_weight`); with
`diagnostics` on, the drift from the starting policy on the logged tokens, `kl_ref` (k3: mean
exp(l_ref - l) - (l_ref - l) - 1), `logprob_drift` (mean l - l_ref) and `ratio` (every
objective), and `entropy` (mean token entropy of the policy on the completions).
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import Trainer

from cobalt.plots import figure, png
from cobalt.training.machinery.checkpoints import last_checkpoint
from cobalt.training.machinery.plan import TrainingPlan
from cobalt.training.method.offline_objectives import offline_loss
from cobalt.training.reporting.console import install as install_console
from cobalt.training.reporting.guards import NonFiniteGuard
from cobalt.training.settings import OfflineSettings, TrainingConfig
from engines import visible_gpus

log = logging.getLogger(__name__)

# --- rows and batches ----------------------------------------------------------------------------


def end_of_turn_id(tokenizer: Any, model_path: str | Path) -> int:
    """The token a turn stops on: the generation config's (first) eos, else the tokenizer's."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(str(model_path)).eos_token_id
    except OSError:
        eos = None
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return int(eos if eos is not None else tokenizer.eos_token_id)


def tokenize_row(row: dict[str, Any], tokenizer: Any, eos_id: int) -> dict[str, Any]:
    """input_ids = the templated prompt (as the engines render it) + the completion's tokens (+
    the end-of-turn token when the turn stopped by itself); prompt_length marks where the loss
    starts."""
    text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    completion = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
    if row.get("stopped", True):
        completion = [*completion, eos_id]
    return {
        "input_ids": [*prompt, *completion],
        "prompt_length": len(prompt),
        "advantage": float(row["advantage"]),
        "reward": float(row["reward"]),
    }


@dataclass
class Prepared:
    rows: list[dict[str, Any]]
    dropped_zero_advantage: int = 0
    dropped_too_long: int = 0
    dropped_empty: int = 0


def prepare_offline_rows(
    rows: Sequence[dict[str, Any]],
    settings: OfflineSettings,
    tokenize: Callable[[dict[str, Any]], dict[str, Any]],
    max_length: int,
) -> Prepared:
    """Tokenized rows for the trainer: zero-advantage rows left out (reinforce_loo,
    clipped_ratio, when `drop_zero_advantage`), rows longer than `max_length` and rows with no
    completion token dropped. Raises ValueError, counting each reason, when none is left."""
    out = Prepared(rows=[])
    drop_zero = settings.drop_zero_advantage and settings.objective != "awr"
    for row in rows:
        if drop_zero and float(row["advantage"]) == 0.0:
            out.dropped_zero_advantage += 1
            continue
        item = tokenize(row)
        if len(item["input_ids"]) > max_length:
            out.dropped_too_long += 1
        elif len(item["input_ids"]) <= item["prompt_length"]:
            out.dropped_empty += 1
        else:
            out.rows.append(item)
    if not out.rows:
        raise ValueError(
            f"no offline rows to train on: of {len(rows)} rows, "
            f"{out.dropped_zero_advantage} have advantage 0 ({settings.objective}, "
            f"drop_zero_advantage), {out.dropped_too_long} are longer than {max_length} tokens "
            f"(training.offline.max_length) and {out.dropped_empty} have an empty completion "
            f"(no token to train on)"
        )
    return out


class OfflineCollator:
    """Right-padded `input_ids`, `attention_mask`, `completion_mask` (1 on completion tokens),
    `advantages`, `rewards` and, when the rows carry them, `ref_logprobs` aligned with the
    shifted targets (position p - 1 holds the log-probability of token p)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        width = max(len(f["input_ids"]) for f in features)
        n = len(features)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        completion = torch.zeros((n, width), dtype=torch.long)
        with_ref = all(f.get("ref_logprobs") is not None for f in features)
        ref = torch.zeros((n, width - 1), dtype=torch.float32)
        for i, f in enumerate(features):
            length, start = len(f["input_ids"]), f["prompt_length"]
            ids[i, :length] = torch.tensor(f["input_ids"], dtype=torch.long)
            attention[i, :length] = 1
            completion[i, start:length] = 1
            if with_ref:
                ref[i, start - 1 : length - 1] = torch.tensor(f["ref_logprobs"])
        batch = {
            "input_ids": ids,
            "attention_mask": attention,
            "completion_mask": completion,
            "advantages": torch.tensor([float(f["advantage"]) for f in features]),
            "rewards": torch.tensor([float(f["reward"]) for f in features]),
        }
        if with_ref:
            batch["ref_logprobs"] = ref
        return batch


def token_logprobs(model: Any, batch: dict[str, Any], logits: Any | None = None) -> Any:
    """[B, L - 1]: log pi(input_ids[:, p + 1] | input_ids[:, :p + 1]) at temperature 1 (from
    `logits` when the caller already has them)."""
    from trl.trainer.utils import selective_log_softmax

    if logits is None:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return selective_log_softmax(logits[:, :-1], batch["input_ids"][:, 1:])


def token_entropy(logits: Any, mask: Any) -> float:
    """Mean entropy (nats) of the next-token distributions at the masked positions; `logits`
    [B, L, V] of the whole sequence, `mask` [B, L - 1] aligned with the shifted targets."""
    import torch

    with torch.no_grad():
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        entropy = -(logp.exp() * logp).sum(dim=-1)
        mask = mask.to(entropy.dtype)
        return float((entropy * mask).sum() / mask.sum().clamp(min=1.0))


# --- the trainer ---------------------------------------------------------------------------------


class OfflineTrainer(Trainer):
    """`transformers.Trainer` with the offline objective as its loss (see the module docstring);
    its metrics are averaged over the logging interval and logged beside the loss."""

    def __init__(self, *args: Any, settings: OfflineSettings, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.settings = settings
        # the loss is already divided by the step's tokens (num_items_in_batch): the Trainer
        # must not divide it again by the accumulation steps
        self.model_accepts_loss_kwargs = True
        self._metrics: dict[str, list[float]] = defaultdict(list)

    def _get_num_items_in_batch(self, batch_samples: list, device: Any) -> Any:
        """The completion tokens of the optimizer step: every micro-batch of its accumulation
        window, summed over the processes (a private hook of transformers' Trainer: its signature
        is checked with the rest, PRIVATE_SURFACE in cobalt.training.machinery.trl_trainer)."""
        import torch

        count = sum(b["completion_mask"][:, 1:].sum() for b in batch_samples)
        count = torch.as_tensor(count, device=device).reshape(1)
        if self.accelerator.num_processes > 1:
            count = self.accelerator.gather(count).sum()
        return count.sum()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
        ).logits
        logprobs = token_logprobs(model, inputs, logits)
        normalizer = None
        if num_items_in_batch is not None:  # the processes' gradients are averaged
            normalizer = num_items_in_batch.clamp(min=1) / self.accelerator.num_processes
        loss, metrics = offline_loss(
            logprobs,
            inputs["completion_mask"][:, 1:],
            inputs["advantages"],
            self.settings,
            inputs.get("ref_logprobs"),
            normalizer,
        )
        metrics["reward"] = float(inputs["rewards"].mean())
        if self.settings.diagnostics:
            metrics["entropy"] = token_entropy(logits, inputs["completion_mask"][:, 1:])
        for key, value in metrics.items():
            self._metrics[key].append(value)
        return (loss, None) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._metrics:
            logs = {**logs, **{k: sum(v) / len(v) for k, v in self._metrics.items()}}
            self._metrics.clear()
        super().log(logs, start_time)


def reference_logprobs(
    model_path: str | Path,
    numerics: Any,
    rows: Sequence[dict[str, Any]],
    batch_size: int,
    pad_id: int,
    *,
    lora: bool = False,
) -> list[list[float]]:
    """The starting policy's log-probabilities of each row's completion tokens (no gradient, eval
    mode, the training precision), on a plain copy of the policy loaded on this process's device
    and freed after, in batches of rows of similar length (less padding): every process computes
    the same numbers, and nothing depends on how the trainer later places or shards its model."""
    import gc

    import torch

    from cobalt.training.machinery.weights import load_policy

    device = (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    )
    model = load_policy(model_path, numerics, lora=lora)
    model.to(device or "cpu").eval()
    autocast = (
        torch.autocast(device.type if device else "cpu", dtype=torch.bfloat16)
        if numerics.autocast
        else nullcontext()
    )
    collate = OfflineCollator(pad_id)
    lengths = [len(row["input_ids"]) for row in rows]
    order = sorted(range(len(rows)), key=lambda i: lengths[i])
    values: list[list[float]] = [[] for _ in rows]
    with torch.no_grad(), autocast:
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            features = [rows[i] for i in indices]
            batch = {k: v.to(device or "cpu") for k, v in collate(features).items()}
            logprobs = token_logprobs(model, batch).float().cpu()
            for row, (i, f) in enumerate(zip(indices, features, strict=True)):
                values[i] = logprobs[row, f["prompt_length"] - 1 : lengths[i] - 1].tolist()
    del model
    gc.collect()
    if device is not None:
        torch.cuda.empty_cache()
    return values


@dataclass
class OfflineRun:
    """What `train_offline` did: the trainer's log history and the rows it trained on."""

    history: list[dict[str, Any]]
    rows: int
    dropped_zero_advantage: int
    dropped_too_long: int
    dropped_empty: int
    reference_logprobs_s: float | None = None
    numerics: dict[str, str] | None = None


def train_offline(
    config: TrainingConfig,
    dataset_rows: Sequence[dict[str, Any]],
    model_path: str | Path,
    output_dir: str | Path,
    callbacks: Sequence[Any] = (),
    plan: TrainingPlan | None = None,
) -> OfflineRun:
    """Train the policy at `model_path` on offline rows with `config.offline`'s objective,
    resuming from the last checkpoint in `output_dir` if there is one; save the final model and
    tokenizer to `output_dir` (`cobalt.training.machinery.weights`: the main process, from the state
    of every process). `plan`: the run's plan (None: planned here, for this machine); its numerics
    and sharding are the run's."""
    from datasets import Dataset

    from cobalt.training.machinery.plan import (
        plan_training,
        planned_numerics,
        same_on_every_process,
    )
    from cobalt.training.machinery.precision import (
        cast_trainable,
        reduce_probe,
        set_distributed_numerics,
        trainable_dtypes,
    )
    from cobalt.training.machinery.weights import (
        load_policy,
        load_tokenizer,
        save_policy,
    )

    settings = config.offline
    tokenizer = load_tokenizer(model_path)
    eos_id = end_of_turn_id(tokenizer, model_path)
    prepared = prepare_offline_rows(
        dataset_rows,
        settings,
        lambda row: tokenize_row(row, tokenizer, eos_id),
        config.max_length(),
    )
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(Path(output_dir, "tensorboard"))
    plan = plan or plan_training(config, model_path)
    numerics = planned_numerics(plan, model_path)  # decided once, by the run's plan
    ref_seconds = None
    if settings.objective == "clipped_ratio" or settings.diagnostics:
        started = time.perf_counter()
        references = reference_logprobs(
            model_path,
            numerics,
            prepared.rows,
            settings.batch_size,
            tokenizer.pad_token_id,
            lora=config.lora is not None,
        )
        for row, ref in zip(prepared.rows, references, strict=True):
            row["ref_logprobs"] = ref
        ref_seconds = round(time.perf_counter() - started, 3)
    # the trainer's arguments before the policy's load: under ZeRO-3 they make from_pretrained
    # partition the weights as it loads them (every process holds only its share)
    args = config.training_arguments(output_dir)
    same_on_every_process("the GPUs of a node", visible_gpus())
    model = load_policy(model_path, numerics, lora=config.lora is not None)
    if config.lora:
        from peft import get_peft_model

        if args.gradient_checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(model, config.lora.peft_config())
    cast_trainable(model, numerics)
    log.info("%s; trainable parameters in %s", numerics.describe(), sorted(trainable_dtypes(model)))
    several = config.world() > 1
    probe = reduce_probe(plan.sharding if several else None)
    trainer = OfflineTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(prepared.rows),
        data_collator=OfflineCollator(tokenizer.pad_token_id),
        processing_class=tokenizer,
        callbacks=[*callbacks, guard := NonFiniteGuard(), probe],
        settings=settings,
    )
    set_distributed_numerics(trainer.accelerator, numerics, config.fsdp_gather, trainer.model)
    probe.trainer = trainer
    install_console(trainer)  # a progress bar and a line every few steps, not each dict
    trainer.train(resume_from_checkpoint=last_checkpoint(output_dir))
    guard.check(numerics.describe() + ".")  # a void step: no policy saved
    save_policy(trainer, output_dir, numerics, tokenizer, lora=config.lora is not None)
    return OfflineRun(
        history=list(trainer.state.log_history),
        rows=len(prepared.rows),
        dropped_zero_advantage=prepared.dropped_zero_advantage,
        dropped_too_long=prepared.dropped_too_long,
        dropped_empty=prepared.dropped_empty,
        reference_logprobs_s=ref_seconds,
        numerics=numerics.as_dict()
        | {
            "reduce_in_use": probe.seen,
            "gather_in_use": probe.gathered,
            "wrapped_as": probe.wrapped,
        },
    )


# --- report --------------------------------------------------------------------------------------


def offline_curve_stats(history: list[dict[str, Any]]) -> dict[str, Any]:
    """First and last logged loss and weighted advantage (and quarter means)."""
    steps = [h for h in history if "loss" in h and "weighted_advantage" in h]
    out: dict[str, Any] = {}
    for key in ("loss", "weighted_advantage", "logprob_positive", "logprob_negative"):
        values = [h[key] for h in steps if key in h]
        if not values:
            out |= {f"{key}_first": None, f"{key}_last": None}
            continue
        k = max(1, len(values) // 4)
        out |= {
            f"{key}_first": round(values[0], 4),
            f"{key}_last": round(values[-1], 4),
            f"{key}_first_quarter": round(sum(values[:k]) / k, 4),
            f"{key}_last_quarter": round(sum(values[-k:]) / k, 4),
        }
    return out


def plot_offline(history: list[dict[str, Any]], title: str) -> bytes:
    """A PNG of the loss, the weighted advantage, and the mean completion token log-probability
    of the positive- and negative-advantage rows, per step."""
    logged = [h for h in history if "loss" in h and "weighted_advantage" in h]
    steps = [h.get("step", i + 1) for i, h in enumerate(logged)]

    def series(key: str) -> tuple[list[Any], list[float]]:
        pairs = [(x, h[key]) for x, h in zip(steps, logged, strict=True) if key in h]
        return [x for x, _ in pairs], [y for _, y in pairs]

    with figure(1, 3, figsize=(14.0, 3.8), dpi=100) as (fig, (left, middle, right)):
        fig.subplots_adjust(wspace=0.32)
        left.plot(*series("loss"), marker="o", linewidth=2, label="loss")
        left.set_ylabel("loss")
        middle.plot(*series("weighted_advantage"), marker="o", linewidth=2, label="mean w * A")
        middle.plot(*series("advantage"), linewidth=1, label="mean A")
        middle.set_ylabel("weighted advantage")
        right.plot(*series("logprob_positive"), marker="o", linewidth=1.5, label="A > 0 rows")
        right.plot(*series("logprob_negative"), marker="o", linewidth=1.5, label="A < 0 rows")
        right.set_ylabel("mean token log-prob")
        for ax in (left, middle, right):
            ax.set_xlabel("optimizer step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(title)
        return png(fig)
