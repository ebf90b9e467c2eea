"""TRL's private surface, all of it in this module: the `GRPOTrainer` subclass the project trains
with, the few private members it calls for the rollouts, one profiling hook, and the table of
every private member the project relies on (`PRIVATE_SURFACE`, TRL's and transformers'), written
for TRL 1.16 and transformers 5.17 (pinned; 5.25 checked too). Importing it logs a
warning when another minor version is installed; tests/training/test_trl_surface.py fails, naming
the member, when a signature changes. Upgrading TRL or transformers starts here.

`CobaltGRPOTrainer` is TRL's trainer with:
- the recipe's KL estimator (`kl_estimator="k2"`, `cobalt.training.method.k2_kl`): TRL's loss is
  computed with its k3 term off (beta 0 for that call), then beta * k2 is added, reduced as TRL
  reduces the policy term of the loss type, and logged as `kl`; the policy's per-token
  log-probabilities are the loss's own forward's (captured, not recomputed). With `k3` the loss is
  TRL's unchanged;
- its micro-batches (`cobalt.training.machinery.padding.optimizer_windows`): each optimizer step of
  a generation batch trains on the same completions whatever the number of processes (global row
  g in step g mod W, in place of TRL's per-process shuffle); with `trim_padding`, rows of similar
  length share a micro-batch and each forward is cut to its chunk's longest sequence; with
  `packing`, a micro-batch's sequences are laid end to end in one row (`machinery.packing`; rows
  it cannot pack keep the other paths). Checkpoints fall between generation batches
  (`cobalt.training.decisions.check_save_steps`), where a resumed run trains as the
  uninterrupted one did;
- the current batch's `example_id`s (`batch_example_ids`, in the order TRL hands the prompts to a
  `rollout_func`): the multi-turn rollout finds each conversation's problem by them, since
  problems can share a statement and differ in their tests;
- public methods over TRL's private ones for the rollouts and the one-step-off generator
  (`tokenized_prompts`, `sample_turn`, `log_metric`, `text_tokenizer`), so that no other module
  calls a private TRL member.

TRL 1.16 also ships an experimental asynchronous GRPO trainer with prompt-shared packing; the
project's one-step-off generation and packed passes stay because they keep TRL's loss, the k2
estimator and the multi-turn rollout bit for bit and are tested for parity with one process.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
import transformers
import trl
from trl import GRPOTrainer

from cobalt.training.decisions import rows_regrouped
from cobalt.training.machinery.overlap import Lookahead
from cobalt.training.machinery.packing import packable, packed_logps, use_packed_attention
from cobalt.training.machinery.padding import REORDERABLE_LOSSES, optimizer_windows, trimmed_logps
from cobalt.training.method.k2_kl import K2_LOSS_TYPES, aggregate, k2_per_token

log = logging.getLogger(__name__)

# the minor versions this module was checked on: the pinned sets (constraints*.txt) and transformers
# 5.25, on which the whole suite passed (it is held at 5.17 by the GPU set's vLLM 0.31)
WRITTEN_FOR = {"trl": ("1.16",), "transformers": ("5.17", "5.25")}
# Every private member of TRL and transformers the project uses, with the parameters it was written
# for ("attr:" entries: attributes the class's source must still set). Where each is used:
# CobaltGRPOTrainer below (the overrides, the wrappers); machinery/padding (TRL's batch split, via
# _trl_split); reporting/step_timing (listen_to_profiling); offline.OfflineTrainer
# (_get_num_items_in_batch); machinery/packing (config._attn_implementation_internal).
PRIVATE_SURFACE: dict[str, tuple[str, ...]] = {
    "trl.GRPOTrainer._get_train_sampler": ("self", "dataset"),
    "trl.GRPOTrainer._generate_and_score_completions": ("self", "inputs"),
    "trl.GRPOTrainer._get_per_token_logps_and_entropies": (
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
        "pixel_values",
        "image_grid_thw",
        "num_images",
        "pixel_attention_mask",
        "spatial_shapes",
        "num_tiles",
        "image_sizes",
        "token_type_ids",
        "mm_token_type_ids",
        "image_position_ids",
    ),
    "trl.GRPOTrainer._prepare_inputs": ("self", "generation_batch"),
    "trl.GRPOTrainer._compute_loss": ("self", "model", "inputs"),
    "trl.GRPOTrainer._tokenize_prompts": ("self", "prompts"),
    "trl.GRPOTrainer._generate_single_turn": (
        "self",
        "prompt_ids",
        "images",
        "multimodal_fields",
        "num_generations",
        "has_tool_images",
    ),
    "trl.GRPOTrainer.attr:_metrics": (),
    "trl.GRPOTrainer.attr:_step": (),
    "trl.GRPOTrainer.attr:_buffered_inputs": (),
    "trl.GRPOTrainer.attr:_tokenizer": (),
    "trl.trainer.grpo_trainer.RepeatSampler.__init__": (
        "self",
        "data_source",
        "mini_repeat_count",
        "batch_size",
        "repeat_count",
        "shuffle",
        "seed",
    ),
    "trl.extras.profiling.ProfilingContext._log_metrics": ("self", "duration"),
    "transformers.Trainer._get_num_items_in_batch": ("self", "batch_samples", "device"),
    "transformers.PretrainedConfig.attr:_attn_implementation_internal": (),
}


def _member(path: str) -> Any:
    """The object a PRIVATE_SURFACE key names (for "attr:" keys, its class)."""
    import importlib

    owner = path.split(".attr:")[0]
    parts = owner.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(path)


def surface_changes(surface: dict[str, tuple[str, ...]] = PRIVATE_SURFACE) -> list[str]:
    """One line for each member of `surface` that is gone or whose parameters differ from those
    it was written for, naming it and the installed versions; [] when all still hold."""
    installed = f"TRL {trl.__version__}, transformers {transformers.__version__}"
    changes = []
    for path, written in surface.items():
        try:
            member = _member(path)
        except (ImportError, AttributeError):
            changes.append(f"{path}: gone in {installed} (written for {WRITTEN_FOR})")
            continue
        if ".attr:" in path:
            attribute = path.split(".attr:")[1]
            sources = "".join(inspect.getsource(c) for c in member.__mro__ if c is not object)
            if f"self.{attribute}" not in sources and f".{attribute} =" not in sources:
                changes.append(f"{path}: no longer set in {installed}")
            continue
        found = tuple(inspect.signature(member).parameters)
        if found != written:
            changes.append(
                f"{path}: written for ({', '.join(written)}), {installed} has ({', '.join(found)})"
            )
    return changes


def version_mismatches() -> list[str]:
    """The libraries whose installed minor version is not the one this module was written for."""
    installed = {"trl": trl.__version__, "transformers": transformers.__version__}
    return [
        f"{name} {installed[name]} (written for {', '.join(m + '.x' for m in minors)})"
        for name, minors in WRITTEN_FOR.items()
        if ".".join(installed[name].split(".")[:2]) not in minors
    ]


if version_mismatches():
    log.warning(
        "cobalt.training.machinery.trl_trainer was written for other versions: %s; run "
        "tests/training/test_trl_surface.py to see which private members changed",
        ", ".join(version_mismatches()),
    )


def listen_to_profiling(listener: Any) -> Any:
    """Every TRL profiling context's duration also goes to `listener(name, seconds)`; returns the
    function that undoes it. A class-wide patch, because TRL's `ProfilingContext` is where TRL
    times generation and offers no hook; `StepTimer` undoes it when its run ends."""
    from trl.extras import profiling

    original = profiling.ProfilingContext._log_metrics

    def log_metrics(context: Any, duration: float) -> None:
        listener(context.name, duration)
        original(context, duration)

    profiling.ProfilingContext._log_metrics = log_metrics

    def undo() -> None:
        profiling.ProfilingContext._log_metrics = original

    return undo


class CobaltGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with a choice of KL estimator (`k3`: TRL's; `k2`: the recipe's),
    the batch's example ids for a `rollout_func` and, with `lookahead`, the next generation
    batch's rows (`cobalt.training.machinery.overlap`)."""

    def __init__(
        self,
        *args: Any,
        kl_estimator: str = "k3",
        trim_padding: bool = False,
        packing: bool = False,
        share_prompts: bool = False,
        lookahead: bool = False,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        if kl_estimator not in ("k3", "k2"):
            raise ValueError(f"training.kl_estimator {kl_estimator!r}: use k3 or k2")
        if kl_estimator == "k2" and self.loss_type not in K2_LOSS_TYPES:
            raise ValueError(
                f"training.kl_estimator k2 is implemented for loss types {K2_LOSS_TYPES}, not "
                f"{self.loss_type!r}: use k3, or one of those loss types"
            )
        self.kl_estimator = kl_estimator
        self.trim_padding = trim_padding
        self.packing = packing or share_prompts
        self.share_prompts = share_prompts
        self._policy_logps: Any = None
        self.batch_example_ids: list[str] | None = None
        self.lookahead = lookahead
        self._lookahead: Lookahead | None = None
        self._said_trl_split = False

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        if self.lookahead:  # the epoch's batches, readable ahead (next_generation_inputs)
            if self._lookahead is None or self._lookahead.source is not epoch_iterator:
                self._lookahead = Lookahead(epoch_iterator)
            self._lookahead.chunk_start = self._lookahead.taken
            epoch_iterator = self._lookahead
        return super().get_batch_samples(epoch_iterator, num_batches, device)

    # --- TRL's private members behind public names, for the rollouts and the overlap ----------
    def tokenized_prompts(self, prompts: list[Any]) -> tuple[Any, ...]:
        """TRL's own tokenization of prompts (ids, images, multimodal fields)."""
        return self._tokenize_prompts(prompts)

    def sample_turn(self, prompt_ids: list[list[int]]) -> tuple[Any, Any]:
        """One completion of each context through TRL's generation path (transformers, or vLLM
        colocated or as a server): (completion ids, their sampling log-probabilities)."""
        completion_ids, logprobs = self._generate_single_turn(prompt_ids, None, {}, 1)[:2]
        return completion_ids, logprobs

    def log_metric(self, name: str, value: float) -> None:
        """A value for TRL's next training log line (averaged with the step's others)."""
        self._metrics["train"][name].append(value)

    @property
    def text_tokenizer(self) -> Any:
        """The tokenizer TRL uses for text (the processor's, for a multimodal model)."""
        return self._tokenizer

    # --- overrides of TRL's private methods (PRIVATE_SURFACE) -----------------------------------
    def _get_train_sampler(self, dataset: Any = None) -> Any:
        self._train_sampler = super()._get_train_sampler(dataset)
        return self._train_sampler

    def decoded_completions(
        self, prompts: list[Any], prompt_ids: list[list[int]], completion_ids: list[list[int]]
    ) -> list[Any]:
        """The completions as TRL's `_generate_and_score_completions` decodes them for its reward
        functions (TRL 1.16): for conversational prompts one assistant message each, through the
        tokenizer's response parser where it has one, else `batch_decode` skipping special
        tokens; plain text otherwise (`OneStepOff` judges a batch ahead with them)."""
        from trl.chat_template_utils import parse_response
        from trl.data_utils import is_conversational

        if not is_conversational({"prompt": prompts[0]}):
            return self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        tokenizer = self._tokenizer
        if (
            getattr(tokenizer, "response_template", None) is not None
            or getattr(tokenizer, "response_schema", None) is not None
        ):
            return [
                [parse_response(tokenizer, ids, prefix=prompt_ids[i], tools=self.tools)]
                for i, ids in enumerate(completion_ids)
            ]
        contents = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        return [[{"role": "assistant", "content": content}] for content in contents]

    def next_generation_inputs(self) -> list[dict[str, Any]] | None:
        """With `lookahead`, during the first optimizer step of a generation batch: this
        process's rows of the next generation batch, from this epoch's loader, or past its end
        the next epoch's first batch (`next_epoch_first_inputs`)."""
        ahead = self._lookahead
        if ahead is None:
            return None
        every = self.args.steps_per_generation * self.num_iterations
        upcoming = ahead.peek(ahead.chunk_start + every - ahead.taken)
        return self.next_epoch_first_inputs() if upcoming is None else upcoming

    def next_epoch_first_inputs(self) -> list[dict[str, Any]] | None:
        """This process's rows of the next epoch's first generation batch, before the epoch
        starts: TRL's `RepeatSampler` draws each epoch's order from its own generator when the
        epoch begins, so the next order is the next draw from a copy of that generator (nothing
        is drawn from the original); its first `batch_size` prompts, each `mini_repeat_count`
        times, split over the processes in order as accelerate shards the loader's batches.
        None with another sampler. A wrong guess costs one batch sampled twice, never the
        update: the prompts TRL then asks for are compared with these (`OneStepOff`)."""
        from trl.trainer.grpo_trainer import RepeatSampler

        sampler = getattr(self, "_train_sampler", None)
        if not isinstance(sampler, RepeatSampler):
            return None
        if sampler.shuffle:
            generator = torch.Generator()
            generator.set_state(sampler.generator.get_state())
            order = torch.randperm(sampler.num_samples, generator=generator).tolist()
        else:
            order = list(range(sampler.num_samples))
        if len(order) < sampler.batch_size:
            return None
        batch = [i for i in order[: sampler.batch_size] for _ in range(sampler.mini_repeat_count)]
        share = len(batch) // self.accelerator.num_processes
        start = self.accelerator.process_index * share
        return [sampler.data_source[i] for i in batch[start : start + share]]

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> Any:
        # TRL takes the prompts from `inputs` in this order and hands them to rollout_func
        self.batch_example_ids = [str(x.get("example_id") or "") for x in inputs]
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self.batch_example_ids = None

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any):
        out = None
        if (self.packing or self.trim_padding) and self._text_only(args, kwargs):
            model, input_ids, attention_mask, logits_to_keep = args[:4]
            batch_size = kwargs.get("batch_size")
            entropy = bool(kwargs.get("compute_entropy"))
            if self.packing and packable(attention_mask, logits_to_keep):
                out = (
                    *self._packed(
                        model, input_ids, attention_mask, logits_to_keep, batch_size, entropy
                    ),
                    None,
                )
            elif self.trim_padding:
                base = super()._get_per_token_logps_and_entropies

                def compute(ids: Any, mask: Any, keep: int, **more: Any) -> Any:
                    return base(model, ids, mask, keep, **more)

                logps, entropies = trimmed_logps(
                    compute,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size=batch_size,
                    compute_entropy=entropy,
                )
                out = (logps, entropies, None)
        if out is None:
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self.kl_estimator == "k2" and kwargs.get("compute_entropy"):
            self._policy_logps = out[0]  # only the loss's own forward asks for the entropy
        return out

    def _packed(
        self,
        model: Any,
        input_ids: Any,
        attention_mask: Any,
        logits_to_keep: int,
        batch_size: int | None,
        compute_entropy: bool,
    ) -> tuple[Any, Any]:
        """TRL's chunks of `batch_size` rows, each packed into one row
        (`cobalt.training.machinery.packing`)."""
        rows = input_ids.size(0)
        size = batch_size or rows
        logps, entropies = [], []
        use_packed_attention(model)
        for start in range(0, rows, size):
            with self.accelerator.autocast():
                part, part_entropy = packed_logps(
                    model,
                    input_ids[start : start + size],
                    attention_mask[start : start + size],
                    logits_to_keep,
                    compute_entropy=compute_entropy,
                    share_prompts=self.share_prompts,
                )
            logps.append(part)
            entropies.append(part_entropy)
        if compute_entropy and all(e is not None for e in entropies):
            return torch.cat(logps), torch.cat(entropies)
        return torch.cat(logps), None

    def _text_only(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A text-only call (no images, no MoE auxiliary loss), made as TRL 1.16 makes it (model,
        ids, mask, logits_to_keep positionally): the trimmed and packed passes handle these."""
        if len(args) != 4 or kwargs.get("compute_aux_loss"):
            return False
        extra = set(kwargs) - {"batch_size", "compute_entropy", "compute_aux_loss"}
        return all(kwargs[k] is None for k in extra)

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        steps, accumulation = self.args.steps_per_generation, self.args.gradient_accumulation_steps
        if not self.model.training or not rows_regrouped(steps, accumulation):
            # evaluation, or optimizer steps that straddle generation batches: TRL's own split
            if self.model.training and not self._said_trl_split:
                self._said_trl_split = True
                log.warning(
                    "training: steps_per_generation %d is not a multiple of "
                    "gradient_accumulation_steps %d, so optimizer steps straddle generation "
                    "batches and TRL's own shuffle and split are used: the update depends on the "
                    "number of processes",
                    steps,
                    accumulation,
                )
            return super()._prepare_inputs(generation_batch)
        every = steps * self.num_iterations
        if self._step % every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            if batch.get("pixel_values") is not None:  # images: TRL's split, by image grid
                self._buffered_inputs = _trl_split(batch, steps)
                return self._buffered_inputs[self._step % steps]
            rows = len(batch["completion_mask"])
            self._buffered_inputs = optimizer_windows(
                batch,
                micro_batches=steps,
                windows=steps // accumulation,
                offset=self.accelerator.process_index * rows,
                by_length=self.trim_padding and self.loss_type in REORDERABLE_LOSSES,
                by_prompt=self.share_prompts and self.loss_type in REORDERABLE_LOSSES,
            )
        return self._buffered_inputs[self._step % steps]

    def _compute_loss(self, model: Any, inputs: dict[str, Any]):
        if self.kl_estimator == "k3" or self.beta == 0.0:
            return super()._compute_loss(model, inputs)
        beta, self.beta = self.beta, 0.0
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self.beta = beta
        logps, self._policy_logps = self._policy_logps, None
        per_token_kl = k2_per_token(logps, inputs["ref_per_token_logps"])
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mode = "train" if self.model.training else "eval"
        kl_loss = self._aggregate(per_token_kl, mask, inputs, mode)
        totals = self.accelerator.reduce(
            torch.stack([(per_token_kl.detach() * mask).sum(), mask.sum().float()]), reduction="sum"
        )
        self._metrics[mode]["kl"].append((totals[0] / totals[1].clamp(min=1.0)).item())
        return loss + beta * kl_loss

    def _aggregate(self, per_token: Any, mask: Any, inputs: dict[str, Any], mode: str) -> Any:
        """`per_token` reduced as TRL reduces the policy term of `self.loss_type` (1.16)."""
        training = mode == "train"
        return aggregate(
            per_token,
            mask,
            self.loss_type,
            accumulation=self.current_gradient_accumulation_steps if training else 1.0,
            num_items_in_batch=inputs.get("num_items_in_batch"),
            processes=self.accelerator.num_processes,
            steps_per_generation=self.args.steps_per_generation,
            max_completion_length=self.max_completion_length,
            training=training,
        )


def _trl_split(batch: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    """TRL 1.16's own shuffle and split of a generation batch (kept for image inputs)."""
    from trl.trainer.utils import (
        shuffle_sequence_dict,
        split_pixel_values_by_grid,
        split_tensor_dict,
        unsplit_pixel_values_by_grid,
    )

    batch = shuffle_sequence_dict(split_pixel_values_by_grid(batch))
    return [unsplit_pixel_values_by_grid(b) for b in split_tensor_dict(batch, steps)]
