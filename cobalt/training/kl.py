"""The recipe's KL penalty in TRL's GRPO trainer: a small subclass.

TRL 1.16's `GRPOTrainer` has one KL estimator, k3 = exp(r) - r - 1 with r = log pi_ref - log pi
(Schulman's unbiased, low-variance estimator). The paper's verl run uses `kl_loss_type="mse"`:
k2 = 0.5 (log pi - log pi_ref)^2, whose gradient is (log pi - log pi_ref), linear in the drift (k3's
is 1 - pi_ref / pi). At the start of training both are 0; they differ as the policy drifts.

`CobaltGRPOTrainer(kl_estimator="k2")` computes TRL's loss with the KL term switched off (beta
set to 0 for that call), then adds beta * k2 aggregated exactly as TRL aggregates the policy term
of the configured loss type (dapo: a token sum over the accumulation window's token count), and
logs it as `kl`. The policy's per-token log-probabilities come from the loss's own forward pass
(captured, not recomputed), so k2 costs no extra forward. With `kl_estimator="k3"` it is TRL's
trainer unchanged.

Its micro-batches (`cobalt.training.padding.optimizer_windows`): each optimizer step of a
generation batch trains on the same completions whatever the number of processes (global row g in
step g mod W, in place of TRL's per-process shuffle); with `trim_padding`, rows of similar length
share a micro-batch within an optimizer step, and each forward is cut to its chunk's own longest
sequence; with `packing`, a micro-batch's sequences are laid end to end in one row with no
padding at all (`cobalt.training.packing`; rows it cannot pack keep the other paths).
Checkpoints fall between generation batches (`cobalt.training.sharding.check_save_steps`),
where a resumed run trains as the uninterrupted one did.

It also keeps the current batch's `example_id`s (`batch_example_ids`, in the order TRL hands the
prompts to a `rollout_func`): the multi-turn rollout finds each conversation's problem by them,
since problems can share a statement and differ in their tests.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer

from cobalt.training.overlap import Lookahead
from cobalt.training.packing import packable, packed_logps, use_packed_attention
from cobalt.training.padding import REORDERABLE_LOSSES, optimizer_windows, trimmed_logps

K2_LOSS_TYPES = ("dapo", "cispo", "vespo", "grpo", "sapo", "bnpo", "dr_grpo")


class CobaltGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with a choice of KL estimator (`k3`: TRL's; `k2`: the recipe's),
    the batch's example ids for a `rollout_func` and, with `lookahead`, the next generation
    batch's rows (`cobalt.training.overlap`)."""

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

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        if self.lookahead:  # the epoch's batches, readable ahead (next_generation_inputs)
            if self._lookahead is None or self._lookahead.source is not epoch_iterator:
                self._lookahead = Lookahead(epoch_iterator)
            self._lookahead.chunk_start = self._lookahead.taken
            epoch_iterator = self._lookahead
        return super().get_batch_samples(epoch_iterator, num_batches, device)

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
        """TRL's chunks of `batch_size` rows, each packed into one row (`cobalt.training.packing`)."""
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
        if not self.model.training or steps % accumulation:
            # evaluation, or optimizer steps that straddle generation batches: TRL's own split
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
        per_token_kl = 0.5 * (logps - inputs["ref_per_token_logps"]) ** 2
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
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if self.loss_type in ("dapo", "cispo", "vespo"):
            normalizer = (
                inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            )
            if mode == "train":
                normalizer = normalizer * accumulation / self.args.steps_per_generation
            return (per_token * mask).sum() / normalizer
        if self.loss_type in ("grpo", "sapo"):
            per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
            return per_sequence.mean() / accumulation
        if self.loss_type == "bnpo":
            return (per_token * mask).sum() / mask.sum().clamp(min=1.0) / accumulation
        # dr_grpo
        total = per_token.size(0) * self.max_completion_length
        return (per_token * mask).sum() / total / accumulation


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
