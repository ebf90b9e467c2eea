"""Local `transformers` engine: the model runs in this process (CPU or GPU).

Two paths: padded batches through `model.generate` (left padding, each prompt's n rows), or,
with `continuous_batching=True` and a transformers that has it, `model.generate_batch` (paged KV
cache, requests scheduled as they finish). Both take the seed; the padded path is the default
because it is the one that runs everywhere at the same speed. The padded path samples with
`engines.keyed_sampling`: each row's randomness comes from its own key (seed, prompt, sample), so
its text does not depend on the batch it ran in, and two models sampled with one seed share
their noise.

Padded batches are sized by memory (`engines.memory`): on GPU, or with `memory_budget_gb`, the
conversations are grouped so that each batch's KV cache and activations fit the budget, at most
`batch_size` conversations each (default: 8 on CPU, where a step costs in proportion to its rows
and a batch runs until its longest row; on GPU the memory budget alone, where a step of a small
model costs about the same for 8 rows as for 500); an out-of-memory error splits the batch in
halves.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from .base import Completion, Conversation, Engine, reopen_thinking, validate_conversations
from .config import EngineConfig, SamplingConfig
from .cpu_threads import cap_cpu_threads
from .keyed_sampling import KeyedSampler, row_keys
from .memory import FIXES, Footprint, check_fits, is_out_of_memory, plan_batches

log = logging.getLogger(__name__)

# Default conversations per padded batch. CPU: a decoding step costs in proportion to its rows
# and a batch runs until its longest row, so small batches (the embedded default's feedback turns
# generated in 18.3 s with 8, 24.1 s with 64 single-sample conversations: docs/RESULTS.md). GPU:
# a small model's step costs about the same for 8 rows as for hundreds, so as many as the memory
# plan holds (the same turns took 57 s in batches of 8 on an H100: docs/RESULTS.md).
CPU_BATCH = 8
GPU_BATCH = 4096


class TransformersEngine(Engine):
    kind = "transformers"

    def __init__(self, config: EngineConfig, *, model: Any = None, tokenizer: Any = None):
        super().__init__(config)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch = torch
        if config.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(config.device)
        if self.device.type == "cpu":  # a few threads for a small model, not one per core
            cap_cpu_threads()
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(config.model)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        if model is None:
            kwargs = dict(config.extra)
            kwargs.setdefault("dtype", self._dtype())
            model = AutoModelForCausalLM.from_pretrained(config.model, **kwargs)
            model.to(self.device)
        model.eval()
        self.model = model
        dtype = getattr(model, "dtype", None) or next(model.parameters()).dtype  # floating
        self.footprint = Footprint.of(model.config, dtype)
        self.last_plan: list[list[int]] = []  # the conversation groups of the last padded call
        self._eos_ids = self._stop_ids()
        self._think_close_id = tokenizer.get_added_vocab().get("</think>")
        self._cb_available = config.continuous_batching and hasattr(model, "generate_batch")
        if config.continuous_batching and not self._cb_available:
            log.warning(
                "continuous batching asked for, but this transformers has no generate_batch; "
                "using padded batches"
            )

    # --- setup helpers ---------------------------------------------------------------------

    def _dtype(self):
        torch = self._torch
        if self.config.dtype != "auto":
            return getattr(torch, self.config.dtype)
        return "auto" if self.device.type == "cuda" else torch.float32

    def _stop_ids(self) -> list[int]:
        ids: list[int] = []
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        for value in (gen_eos, self.tokenizer.eos_token_id):
            if value is None:
                continue
            for token in value if isinstance(value, list) else [value]:
                if token not in ids:
                    ids.append(int(token))
        return ids

    def render(self, conversation: Conversation, sampling: SamplingConfig) -> str:
        """The prompt text: the chat template with the generation prompt."""
        return self.tokenizer.apply_chat_template(
            conversation,
            tokenize=False,
            add_generation_prompt=True,
            **sampling.chat_template_kwargs(),
        )

    def _encode(self, conversations: Sequence[Conversation], sampling: SamplingConfig):
        texts = [self.render(c, sampling) for c in conversations]
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    @contextlib.contextmanager
    def _seeded(self, seed: int | None):
        torch = self._torch
        if seed is None:
            yield
            return
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield

    def batch_cap(self) -> int:
        """Most conversations of one padded generate call: `batch_size`, else the device's
        default (`CPU_BATCH` on CPU; on GPU the memory plan decides, up to `GPU_BATCH`)."""
        if self.config.batch_size is not None:
            return self.config.batch_size
        return CPU_BATCH if self.device.type == "cpu" else GPU_BATCH

    def memory_budget(self) -> int | None:
        """Bytes a padded batch may use: on GPU, the free memory (plus what torch's allocator holds
        unused) x `memory_fraction`, at most `memory_budget_gb`; on CPU `memory_budget_gb` or None
        (no memory rule: batches of `batch_size`, as before)."""
        cap = self.config.memory_budget_gb
        if self.device.type != "cuda":
            return None if cap is None else int(cap * 1e9)
        cuda = self._torch.cuda
        free, _ = cuda.mem_get_info(self.device)
        unused = cuda.memory_reserved(self.device) - cuda.memory_allocated(self.device)
        budget = int((free + unused) * self.config.memory_fraction)
        return budget if cap is None else min(budget, int(cap * 1e9))

    def _completion(self, prompt_len: int, generated: list[int], seconds: float) -> Completion:
        stop_at = next((i for i, t in enumerate(generated) if t in self._eos_ids), None)
        if stop_at is not None:
            body, finish, n_tokens = generated[:stop_at], "stop", stop_at + 1
        else:
            body, finish, n_tokens = generated, "length", len(generated)
        reasoning = 0
        if self._think_close_id is not None and self._think_close_id in body:
            reasoning = body.index(self._think_close_id) + 1
        return Completion(
            text=self.tokenizer.decode(body, skip_special_tokens=True),
            finish_reason=finish,
            prompt_tokens=prompt_len,
            completion_tokens=n_tokens,
            reasoning_tokens=reasoning,
            seconds=seconds,
        )

    # --- generation ------------------------------------------------------------------------

    def generate(
        self, conversations: Sequence[Conversation], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        validate_conversations(conversations)
        if not conversations:
            return []
        results = self._generate(conversations, sampling)
        return reopen_thinking(results, self.tokenizer, sampling)

    def _generate(
        self, conversations: Sequence[Conversation], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        prompts = self._encode(conversations, sampling)
        budget = self.memory_budget()
        if self._cb_available:
            if budget is not None:  # generate_batch sizes its own cache; one conversation must fit
                longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
                check_fits(
                    len(prompts[longest]),
                    sampling.n,
                    sampling.max_new_tokens,
                    self.footprint,
                    budget,
                    longest,
                )
            try:
                return self._generate_continuous(prompts, sampling)
            except Exception as exc:  # the API moves fast; padded batches always work
                log.warning("continuous batching failed (%s); using padded batches", exc)
                self._cb_available = False
        rows = 1 if sampling.greedy else sampling.n
        plan = plan_batches(
            [len(p) for p in prompts],
            rows,
            sampling.max_new_tokens,
            self.footprint,
            budget,
            self.batch_cap(),
        )
        self.last_plan = plan
        if len(plan) > 1 and budget is not None:
            log.info(
                "%d conversations x %d rows in %d batches (budget %.2f GB)",
                len(prompts),
                rows,
                len(plan),
                budget / 1e9,
            )
        # each row's noise is its own (keyed sampling): the plan's cut points, a halving retry
        # or another batch size change no text
        keys = row_keys(sampling.seed, prompts, 1 if sampling.greedy else sampling.n)
        results: list[list[Completion]] = [[] for _ in prompts]
        for group in plan:
            batch = self._generate_batch(
                [prompts[i] for i in group], [keys[i] for i in group], sampling
            )
            for i, row in zip(group, batch, strict=True):
                results[i] = row
        return results

    def _generation_kwargs(self, sampling: SamplingConfig) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "eos_token_id": self._eos_ids or None,
            "pad_token_id": self.tokenizer.pad_token_id,
        }
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(
                do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=None
            )
        return kwargs

    def _generate_batch(
        self, prompts: list[list[int]], keys: list[list[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """One padded batch. Out of memory: the batch is split in halves and retried (the memory
        estimate was too low). Any other failure: each conversation is retried alone, so one bad
        prompt only fails its own completions. A conversation that fails alone is recorded."""
        try:
            return self._run_padded(prompts, keys, sampling)
        except Exception as exc:
            error, oom = f"{type(exc).__name__}: {exc}", is_out_of_memory(exc)
        # retried outside the handler, so the traceback's frames (and their tensors) are freed
        if oom and self.device.type == "cuda":
            self._torch.cuda.empty_cache()
        if len(prompts) == 1:
            if oom:
                error += f" (one conversation alone; {FIXES})"
            log.warning("generation failed: %s", error)
            return [[Completion.failed(error) for _ in range(sampling.n)]]
        if oom:
            half = len(prompts) // 2
            log.warning(
                "out of memory on a batch of %d conversations (%s); retrying it in halves of %d "
                "and %d",
                len(prompts),
                error,
                half,
                len(prompts) - half,
            )
            first = self._generate_batch(prompts[:half], keys[:half], sampling)
            return first + self._generate_batch(prompts[half:], keys[half:], sampling)
        log.warning("batch of %d failed (%s); retrying one by one", len(prompts), error)
        out: list[list[Completion]] = []
        for prompt, key in zip(prompts, keys, strict=True):
            out.extend(self._generate_batch([prompt], [key], sampling))
        return out

    def _run_padded(
        self, prompts: list[list[int]], keys: list[list[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        from transformers import LogitsProcessorList

        torch = self._torch
        started = time.perf_counter()
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        per_prompt = 1 if sampling.greedy else sampling.n  # greedy samples are all the same
        kwargs = self._generation_kwargs(sampling.model_copy(update={"temperature": 0}))
        if not sampling.greedy:  # greedy decoding of keyed Gumbel-perturbed logits: sampling
            flat = [k for row in keys for k in row]
            sampler = KeyedSampler(flat, width, sampling.temperature, sampling.top_p)
            kwargs["logits_processor"] = LogitsProcessorList([sampler])
            # the rows of each prompt side by side, as num_return_sequences would (greedy
            # decoding refuses it)
            input_ids = input_ids.repeat_interleave(per_prompt, dim=0)
            attention = attention.repeat_interleave(per_prompt, dim=0)
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                **kwargs,
            )
        generated = output[:, width:].tolist()
        seconds = (time.perf_counter() - started) / (len(prompts) * sampling.n)
        results = []
        for i, prompt in enumerate(prompts):
            rows = generated[i * per_prompt : (i + 1) * per_prompt]
            completions = [self._completion(len(prompt), row, seconds) for row in rows]
            while len(completions) < sampling.n:
                completions.append(completions[0].model_copy())
            results.append(completions)
        return results

    def _generate_continuous(
        self, prompts: list[list[int]], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        started = time.perf_counter()
        n = sampling.n
        inputs = [p for p in prompts for _ in range(n)]
        kwargs = self._generation_kwargs(sampling)
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        gen_config = GenerationConfig(num_return_sequences=1, **kwargs)
        cb_kwargs: dict[str, Any] = {"seed": sampling.seed}
        on_gpu = self.device.type == "cuda"
        if not on_gpu:  # size the paged cache for this workload (defaults assume a GPU)
            block = 32
            blocks = sum(math.ceil((len(p) + sampling.max_new_tokens) / block) for p in inputs)
            cb_kwargs.update(block_size=block, num_blocks=blocks + 4, max_batch_tokens=512)
        with self._seeded(sampling.seed):
            outputs = self.model.generate_batch(
                inputs,
                generation_config=gen_config,
                continuous_batching_config=ContinuousBatchingConfig(**cb_kwargs),
                progress_bar=False,
                warmup=on_gpu,
            )
        seconds = (time.perf_counter() - started) / max(1, len(inputs))
        ordered = list(outputs.values())
        if len(ordered) != len(inputs):
            raise RuntimeError(f"generate_batch returned {len(ordered)} of {len(inputs)} results")
        results: list[list[Completion]] = []
        for i, prompt in enumerate(prompts):
            row = []
            for out in ordered[i * n : (i + 1) * n]:
                if out.error is not None:
                    row.append(Completion.failed(str(out.error), seconds))
                else:
                    row.append(self._completion(len(prompt), list(out.generated_tokens), seconds))
            results.append(row)
        return results

    def close(self) -> None:
        self.model = None
        if self._torch.cuda.is_available():
            self._torch.cuda.empty_cache()
