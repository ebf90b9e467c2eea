"""Generation overlapped with training, one step off (`training.async_generation`, `--async`).

`OneStepOff` is at once TRL's `rollout_func` and a `TrainerCallback`. When the trainer asks for
generation batch k's completions it hands back the ones sampled while step k-1 trained, and
before returning it sends batch k+1's prompts to a background thread, which samples them while
step k trains. Each batch is therefore sampled from the weights one generation batch older than
the weights it trains (staleness 1, the bound of verl's one-step-off and NeMo-RL's async GRPO);
the run's first batch, a resumed run's first, and any batch whose prompts were not the ones
sent ahead, are sampled the usual way, from the current weights (so a resumed run's first batch
is one step fresher than the uninterrupted run's was: the same rows, not the same samples).

With `prejudge` (the training stage passes the sandbox rewards' own), a batch sampled ahead is
also judged in the background thread once sampled: its programs run in the sandbox while the
step before trains, their results cached by program and tests, so TRL's reward step finds them
(the same judge and the same results: only when they are computed changes).

The loss is TRL's, unchanged: the PPO ratio's denominator is the trainer's own recomputation with
the weights it trains (as verl's one-step-off recomputes old log-probabilities), so the samples'
age is not corrected unless TRL's importance-sampling correction is on
(`training.vllm_is_correction`, which with vLLM weighs each token by the trainer's over the
sampler's probability, capped). Rewards are computed in the trainer's thread, as before (with
`prejudge`, from results the background thread already has).

The next batch's prompts come from the trainer's own data loader, read one generation batch ahead
(`CobaltGRPOTrainer(lookahead=True)`, `Lookahead`; past an epoch's end, the next epoch's first
batch from the next draw of its sampler's order), so the rows and their order are those of the
synchronous run. Where the samples come from (`Generator`):

- `VLLMColocated`: the trainer's colocated vLLM engine, kept awake (no sleep mode: it generates
  while the optimizer steps), on its own CUDA stream in the background thread. TRL loads the
  current weights into it at the start of each generating step (its `rollout_func` path), after
  `on_step_begin` has waited for the engine to finish the batch in flight; each job's stream
  waits for the trainer's stream as it was when the job was sent (those weight copies done).
- `VLLMServer`: a vLLM server on GPUs of its own (TRL's server mode; the stage starts one with
  `training.vllm_server_gpus`), asked over HTTP from the background thread by every process for
  its own rows; TRL pushes the current weights into it by NCCL at each generating step, after
  every process's batch in flight has finished, and no process asks for the next batch before
  the push has ended (two barriers: TRL pushes from the main process alone). The split of GPUs
  verl's one-step-off and NeMo-RL's async GRPO use: generation and training on cards of their own.
- `TransformersCopy`: a second copy of the policy that `generate`s in the background thread (CPU,
  small models; the copy's trainable weights refreshed from the policy, gathered whole under
  FSDP, before each batch is sent).

Every batch is sampled in the background thread, those sampled in place too (the trainer waits
for them): after its start-up the engine runs on one thread and one stream only, so what it
allocates while sampling returns to its own stream's pool, never to the trainer's while its
kernels may still use it.

Plain Python, no Prefect.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

from cobalt.training.decisions import starts_optimizer_step

log = logging.getLogger(__name__)


class Lookahead:
    """An iterator that can read ahead of what it has yielded: `peek(0)` is the next item,
    `peek(k)` the one k places after it (None past the end); `taken` counts the items yielded,
    and `chunk_start` is `taken` when the trainer began its current optimizer step."""

    def __init__(self, source: Iterator[Any]) -> None:
        self.source = source
        self.buffer: list[Any] = []
        self.taken = 0
        self.chunk_start = 0
        self.exhausted = False

    def __iter__(self) -> Lookahead:
        return self

    def __next__(self) -> Any:
        item = self.buffer.pop(0) if self.buffer else next(self.source)
        self.taken += 1
        return item

    def peek(self, offset: int) -> Any:
        if offset < 0:
            return None
        while len(self.buffer) <= offset and not self.exhausted:
            try:
                self.buffer.append(next(self.source))
            except StopIteration:
                self.exhausted = True
        return self.buffer[offset] if offset < len(self.buffer) else None


@dataclass
class _InFlight:
    prompts: list[Any]
    future: Future


class Generator:
    """Where the samples come from: `prepare` (the trainer's thread: tokenise, refresh weights)
    returns a job that `run` samples (any thread) into a rollout_func's output dict."""

    def prepare(self, trainer: Any, prompts: list[Any]) -> Any:
        raise NotImplementedError

    def run(self, job: Any) -> dict[str, Any]:
        raise NotImplementedError

    def thread_setup(self) -> None:
        """Run once in the background thread before its first job."""


def _prompt_ids(trainer: Any, prompts: list[Any]) -> list[list[int]]:
    """The prompts tokenised as TRL tokenises them for its own generation."""
    ids, images, _ = trainer.tokenized_prompts(prompts)
    if images is not None:
        raise ValueError("training.async_generation: prompts with images are not supported")
    return [list(x) for x in ids]


class VLLMColocated(Generator):
    """The trainer's colocated vLLM engine (tensor parallel 1, awake), on a CUDA stream of its
    own in the background thread (on the default stream its kernels would queue behind the
    trainer's)."""

    def __init__(self, trainer: Any) -> None:
        import torch

        self.vllm = trainer.vllm_generation
        self.device: int | None = None
        if torch.cuda.is_available():
            # one process: accelerate's device is "cuda" with no index; the thread needs one
            index = trainer.accelerator.device.index
            self.device = torch.cuda.current_device() if index is None else index
        self.stream: Any = None

    def thread_setup(self) -> None:
        import torch

        if self.device is not None:
            torch.cuda.set_device(self.device)
            self.stream = torch.cuda.Stream(device=self.device)

    def prepare(self, trainer: Any, prompts: list[Any]) -> Any:
        """The prompts' ids, and (on a GPU) an event on the trainer's stream now: the weights
        TRL has just loaded into the engine are copied once the stream reaches it."""
        import torch

        sent = None
        if self.device is not None:
            sent = torch.cuda.Event()
            sent.record()
        return _prompt_ids(trainer, prompts), sent

    def run(self, job: Any) -> dict[str, Any]:
        import contextlib

        import torch

        prompts, sent = job
        use_stream = self.stream is not None
        with torch.cuda.stream(self.stream) if use_stream else contextlib.nullcontext():
            if use_stream and sent is not None:
                self.stream.wait_event(sent)
            prompt_ids, completion_ids, logprobs, _ = self.vllm.generate(
                prompts=prompts, images=None, num_generations=1
            )
            if use_stream:
                self.stream.synchronize()
        return {
            "prompt_ids": [list(p) for p in prompt_ids],
            "completion_ids": [list(c) for c in completion_ids],
            # vLLM gives each token's top-k; the sampled token's is first (as TRL keeps it)
            "logprobs": [[lp[0] for lp in seq] for seq in logprobs] if logprobs else None,
        }


class VLLMServer(Generator):
    """A vLLM server on GPUs of its own (TRL's server mode): each process sends its own rows,
    one completion each (the server's prefix cache shares a prompt's), from the background thread
    over HTTP with TRL's sampling settings: no collective and no CUDA work in this process. TRL
    pushes the current weights (NCCL, from the main process) at each generating step, after
    `on_step_begin` has let every process's batch in flight finish; the rollout waits for that
    push to end on every process before asking for samples."""

    def __init__(self, trainer: Any) -> None:
        self.vllm = trainer.vllm_generation
        # TRL gives the main process a client (it joins the weight group); the others only ask
        # for samples, so an HTTP client of their own will do
        self.client = getattr(self.vllm, "vllm_client", None)
        if self.client is None:
            from trl.generation.vllm_client import VLLMClient

            base = (
                self.vllm.server_base_url
                or f"http://{self.vllm.server_host}:{self.vllm.server_port}"
            )
            self.client = VLLMClient(base_url=base, connection_timeout=self.vllm.server_timeout)

    def prepare(self, trainer: Any, prompts: list[Any]) -> Any:
        return _prompt_ids(trainer, prompts)

    def run(self, job: Any) -> dict[str, Any]:
        v = self.vllm
        out = self.client.generate(
            prompts=job,
            n=1,
            repetition_penalty=v.repetition_penalty,
            temperature=v.temperature,
            top_p=v.top_p,
            top_k=v.top_k,
            min_p=0.0 if v.min_p is None else v.min_p,
            max_tokens=v.max_completion_length,
            logprobs=v.logprobs,
            structured_outputs_regex=v.structured_outputs_regex,
            generation_kwargs=v.generation_kwargs,
        )
        logprobs = out.get("logprobs")
        return {
            "prompt_ids": [list(p) for p in out["prompt_ids"]],
            "completion_ids": [list(c) for c in out["completion_ids"]],
            "logprobs": [[lp[0] for lp in seq] for seq in logprobs] if logprobs else None,
        }


class TransformersCopy(Generator):
    """A frozen copy of the policy (taken before the trainer wraps it; LoRA: with the same
    adapters), sampling with the trainer's generation config; its trainable weights are
    refreshed from the policy before each batch is sent (gathered whole under FSDP: every
    process takes part)."""

    def __init__(self, trainer: Any, copy_of_policy: Any) -> None:
        # on the trainer's device: the policy is copied before the Trainer moves it there (left
        # on the CPU, the tiny default's training stage on a GPU took 3.9x the synchronous time)
        self.model = copy_of_policy.to(trainer.accelerator.device).eval()
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        self.generation_config = trainer.generation_config
        self.pad_token_id = trainer.text_tokenizer.pad_token_id
        self.eos_token_ids = list(trainer.eos_token_ids)
        self.pad_to_multiple_of = trainer.pad_to_multiple_of
        self.trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}

    def refresh(self, trainer: Any) -> None:
        import torch
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        policy = trainer.accelerator.unwrap_model(trainer.model_wrapped)
        weights = get_model_state_dict(
            policy, options=StateDictOptions(full_state_dict=True, ignore_frozen_params=True)
        )
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                if name in own:
                    own[name].copy_(value.to(own[name].device))

    def prepare(self, trainer: Any, prompts: list[Any]) -> Any:
        self.refresh(trainer)
        return _prompt_ids(trainer, prompts)

    def run(self, job: Any) -> dict[str, Any]:
        import torch
        from trl.trainer.utils import pad

        device = next(self.model.parameters()).device
        tensors = [torch.tensor(ids) for ids in job]
        ids = pad(
            tensors,
            padding_value=self.pad_token_id,
            padding_side="left",
            pad_to_multiple_of=self.pad_to_multiple_of,
        )
        mask = pad(
            [torch.ones_like(t) for t in tensors],
            padding_value=0,
            padding_side="left",
            pad_to_multiple_of=self.pad_to_multiple_of,
        )
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                generation_config=self.generation_config,
            )
        completions = []
        for row in out[:, ids.size(1) :].cpu().tolist():
            cut = next((i for i, t in enumerate(row) if t in self.eos_token_ids), None)
            completions.append(row if cut is None else row[: cut + 1])
        return {"prompt_ids": job, "completion_ids": completions, "logprobs": None}


def _on_every_process(flag: bool, trainer: Any) -> bool:
    """Whether `flag` holds on every process: a batch sent ahead for other prompts on one
    process sends them all down the in-place path, whose weight refresh under FSDP is a
    collective that every process must join."""
    accelerator = trainer.accelerator
    if accelerator.num_processes == 1:
        return flag
    import torch

    votes = accelerator.reduce(torch.tensor([int(flag)], device=accelerator.device), "sum")
    return int(votes.item()) == accelerator.num_processes


def _steps_per_batch(trainer: Any) -> int:
    """Optimizer steps a generation batch trains (it starts one: `OneStepOff.attach`)."""
    args = trainer.args
    every = args.steps_per_generation * trainer.num_iterations
    return max(1, every // args.gradient_accumulation_steps)


class OneStepOff(TrainerCallback):
    """TRL `rollout_func` + `TrainerCallback` sampling each generation batch while the one
    before it trains (module docstring). `attach(trainer)` after the trainer is built; `summary()`
    counts the batches served from the background (`overlapped`), sampled in place (`fresh`), and
    the seconds the trainer waited for the background."""

    def __init__(
        self,
        policy: Any = None,
        peft_config: Any = None,
        prejudge: Callable[[list[dict[str, Any]], list[Any]], None] | None = None,
    ) -> None:
        """`policy`: the model the trainer is about to wrap, copied now for sampling with
        transformers (None: the trainer samples with vLLM); `peft_config`: its LoRA adapters;
        `prejudge(rows, completions)`: run in the background thread on a batch sampled ahead
        (its rows, its completions as TRL decodes them), e.g. the sandbox rewards' judge
        filling its cache; a failure there is logged, the trainer's reward step judges anyway."""
        self.prejudge = prejudge
        self.prejudged = 0
        self.copy_of_policy = None
        if policy is not None:
            self.copy_of_policy = copy.deepcopy(policy)
            if peft_config is not None:
                from peft import get_peft_model

                self.copy_of_policy = get_peft_model(self.copy_of_policy, peft_config)
        self.trainer: Any = None
        self.generator: Generator | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.in_flight: _InFlight | None = None
        self._thread_ready = False
        self.overlapped = 0
        self.fresh = 0
        self.wait_s = 0.0

    def attach(self, trainer: Any) -> None:
        """Choose the generator for the trainer's generation backend (vLLM colocated, or
        transformers), with one background thread."""
        args = trainer.args
        if not starts_optimizer_step(
            args.steps_per_generation, trainer.num_iterations, args.gradient_accumulation_steps
        ):
            raise ValueError(
                f"training.async_generation: a generation batch must start an optimizer step "
                f"(steps_per_generation {args.steps_per_generation} x num_iterations "
                f"{trainer.num_iterations} a multiple of gradient_accumulation_steps "
                f"{args.gradient_accumulation_steps}): drop the steps_per_generation override"
            )
        if getattr(trainer, "use_vllm", False) and trainer.args.vllm_mode == "server":
            self.generator = VLLMServer(trainer)
        elif getattr(trainer, "use_vllm", False):
            if trainer.args.vllm_enable_sleep_mode or trainer.args.vllm_tensor_parallel_size != 1:
                raise ValueError(
                    "training.async_generation: the colocated vLLM must stay awake with tensor "
                    "parallel 1 (it generates while the optimizer steps): drop the overrides "
                    "vllm_enable_sleep_mode / vllm_tensor_parallel_size"
                )
            self.generator = VLLMColocated(trainer)
        else:
            if trainer.args.use_transformers_paged:
                raise ValueError(
                    "training.async_generation: transformers' paged generation is not "
                    "supported: use generation transformers or vllm_colocate"
                )
            if self.copy_of_policy is None:
                raise ValueError(
                    "training.async_generation: sampling with transformers needs a copy of the "
                    "policy taken before the trainer wraps it: OneStepOff(policy=model)"
                )
            self.generator = TransformersCopy(trainer, self.copy_of_policy)
            self.copy_of_policy = None
        self.trainer = trainer
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="cobalt-generate")
        self._thread_ready = False

    # --- rollout_func ----------------------------------------------------------------------
    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        from trl.extras.profiling import profiling_context

        assert self.generator is not None and self.pool is not None, "attach(trainer) first"
        if isinstance(self.generator, VLLMServer) and trainer.accelerator.num_processes > 1:
            # TRL has just pushed the weights from the main process only: no process may ask
            # the server for samples before that push has ended
            trainer.accelerator.wait_for_everyone()
        ahead, self.in_flight = self.in_flight, None
        if ahead is not None and _on_every_process(ahead.prompts == prompts, trainer):
            output = self._wait(ahead)
            self.overlapped += 1
        else:
            if ahead is not None:  # sent for other prompts: let the engine finish, then drop it
                log.warning("async generation: the batch sent ahead was not the one trained next")
                self._wait(ahead)
            job = self.generator.prepare(trainer, prompts)
            with profiling_context(trainer, "async.generate"):
                output = self.pool.submit(self._in_thread, job).result()
            self.fresh += 1
        trainer.log_metric("async/overlapped", float(ahead is not None))
        upcoming = self._upcoming(trainer)
        if upcoming is not None:
            next_prompts = [row["prompt"] for row in upcoming]
            job = self.generator.prepare(trainer, next_prompts)
            future = self.pool.submit(self._in_thread, job, upcoming)
            self.in_flight = _InFlight(next_prompts, future)
        return output

    def _in_thread(self, job: Any, rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        assert self.generator is not None
        if not self._thread_ready:  # here, not as the pool's initializer: its error would be lost
            self.generator.thread_setup()
            self._thread_ready = True
        output = self.generator.run(job)
        if rows and self.prejudge is not None:
            try:
                prompts = [row["prompt"] for row in rows]
                completions = self.trainer.decoded_completions(
                    prompts, output["prompt_ids"], output["completion_ids"]
                )
                self.prejudge(rows, completions)
                self.prejudged += 1
            except Exception:  # the trainer's reward step judges these rows anyway
                log.warning("async generation: judging a batch ahead failed", exc_info=True)
        return output

    def _upcoming(self, trainer: Any) -> list[dict[str, Any]] | None:
        """The next generation batch's rows, unless this one is the run's last."""
        if trainer.state.global_step + _steps_per_batch(trainer) >= trainer.state.max_steps:
            return None
        return trainer.next_generation_inputs()

    def _wait(self, in_flight: _InFlight) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            return in_flight.future.result()
        finally:
            self.wait_s += time.perf_counter() - started

    # --- TrainerCallback -------------------------------------------------------------------
    def on_step_begin(self, args, state, control, **kwargs):
        """Before a step that generates, let the batch in flight finish: TRL then loads the
        weights into the engine, which must be idle."""
        from trl.extras.profiling import profiling_context

        trainer = self.trainer
        if self.in_flight is None or trainer is None:
            return
        if state.global_step % _steps_per_batch(trainer) == 0:
            started = time.perf_counter()
            with profiling_context(trainer, "async.generate_wait"):
                self.in_flight.future.exception()  # waits; a failure is raised by the rollout
            waited = time.perf_counter() - started
            self.wait_s += waited
            trainer.log_metric("async/wait_s", waited)
            if isinstance(self.generator, VLLMServer) and trainer.accelerator.num_processes > 1:
                # the main process pushes the weights into the one server next: every
                # process's batch must be done (a LoRA push has no collective to wait on)
                trainer.accelerator.wait_for_everyone()

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        """Wait for the batch in flight (never trained: the run ended) and stop the thread."""
        if self.in_flight is not None:
            self.in_flight.future.exception()
            self.in_flight = None
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None

    def summary(self) -> dict[str, Any]:
        return {
            "mode": "one step off",
            "generator": type(self.generator).__name__ if self.generator else None,
            "overlapped_batches": self.overlapped,
            "fresh_batches": self.fresh,
            "prejudged_batches": self.prejudged,
            "wait_s": round(self.wait_s, 3),
        }
