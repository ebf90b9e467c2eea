"""GRPO post-training on the Cobalt bandit dataset (SPEC §1.5, §1.6) with TRL's `GRPOTrainer`.

`CobaltRewards` holds one shared sandbox judge and gives TRL's reward callables `correctness` and
`format` (logged by TRL as `rewards/correctness/mean` and `rewards/format/mean`). `prepare_rows`
filters the bandit rows by mode and prompt length; `train(...)` runs the trainer (resuming from the
last checkpoint in its output directory), saves the final model and returns the log history.
Settings: `cobalt/training/config.py`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from cobalt.training.config import Mode, TrainingConfig
from cobalt.training.guards import NonFiniteGuard
from cobalt.training.reward import correctness_reward, format_reward
from cobalt.trajectories.prompts import extract_code
from sandbox import JudgeRequest, SandboxConfig, SyncJudge, TestSuite

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

    `correctness` judges every completion of the batch concurrently (`judge_many`) and returns
    `correctness_reward(pass_rate or None, prev_best_pass_rate, training=True)`; `format` is
    `format_reward` with `correct` = correctness reward >= 0 (results are cached per program).

    TRL sums the reward functions (weights 1) without clipping, so `format` returns the clipped
    contribution clip(correctness + format_term, -1, 1) - correctness: the sum TRL trains on is
    SPEC §1.5's clipped total (`tasks.reward.total_reward`), and `rewards/format/mean` logs that
    contribution (0 when correctness is already -1).

    Rows from the multi-turn rollout (cobalt/training/multiturn.py) carry the rewarded `program`
    and its `response`: those are judged and formatted instead of the decoded completion."""

    def __init__(self, sandbox: SandboxConfig, count_tokens: Callable[[str], int] | None = None):
        self.judge = SyncJudge(sandbox)
        self.count_tokens = count_tokens
        self._cache: dict[tuple[str, str], Judged] = {}

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

    @staticmethod
    def programs(
        completions: Sequence[Any], program: Sequence[str | None] | None = None
    ) -> list[str | None]:
        """The program each row is rewarded on: the rollout's `program`, else the completion's."""
        if program is not None:
            return list(program)
        return [extract_code(completion_text(c)) for c in completions]

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
        if mode == "single_turn" and not is_turn0(row):
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
    """The newest `checkpoint-N` directory in `output_dir` (what a killed run resumes from)."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(output_dir)) if Path(output_dir).is_dir() else None


def train(
    config: TrainingConfig,
    dataset_rows: Sequence[dict[str, Any]],
    model_path: str | Path,
    output_dir: str | Path,
    callbacks: Sequence[Any] = (),
) -> list[dict[str, Any]]:
    """Run TRL's GRPOTrainer on the bandit rows, resuming from the last checkpoint in
    `output_dir` if there is one; save the final model and tokenizer to `output_dir`; return the
    trainer's log history."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

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
    dataset = Dataset.from_list(rows)
    args = GRPOConfig(**config.grpo_kwargs(output_dir))
    if not config.cudnn_attention:
        import torch

        torch.backends.cuda.enable_cudnn_sdp(False)
    attention = (
        {"attn_implementation": config.attn_implementation} if config.attn_implementation else {}
    )
    model = AutoModelForCausalLM.from_pretrained(str(model_path), **attention)

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    guard = NonFiniteGuard()
    with CobaltRewards(config.sandbox, count_tokens) as rewards:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=rewards.reward_funcs(config.use_format_reward),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[*callbacks, guard],
            peft_config=config.lora.peft_config() if config.lora else None,
        )
        trainer.train(resume_from_checkpoint=last_checkpoint(output_dir))
    guard.check("Mixed precision was " + ("bf16" if args.bf16 else "off") + ".")
    if config.lora:  # a plain model for the engines: adapters merged into the weights
        if trainer.is_world_process_zero():
            trainer.model.merge_and_unload().save_pretrained(str(output_dir))
    else:
        trainer.save_model(str(output_dir))  # every process takes part (sharded states)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(str(output_dir))
    return list(trainer.state.log_history)
