"""The sandbox's rewards as TRL reward callables (METHOD §1.5): `CobaltRewards` holds one shared
sandbox judge and gives `correctness` and `format` (logged by TRL as `rewards/correctness/mean`
and `rewards/format/mean`); the dense reward (`cobalt/training/method/dense_reward.py`) builds on
its judged results. The reward's formulas are `cobalt/training/method/cobalt_reward.py`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from cobalt.training.method.cobalt_reward import correctness_reward, format_reward
from cobalt.trajectories.prompts import extract_code
from engines import split_thinking, with_open_thinking
from sandbox import JudgeRequest, SandboxConfig, SyncJudge, TestSuite


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
    METHOD §1.5's clipped total (`tasks.reward.total_reward`), and `rewards/format/mean` logs that
    contribution (0 when correctness is already -1).

    Rows from the multi-turn rollout (cobalt/training/method/multiturn_rollout.py) carry the
    rewarded `program`
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
        self._lock = threading.Lock()

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
        with self._lock:  # the trainer's thread and the background one (`prejudge`) share it
            found = {k: self._cache[k] for k in keys if k and k in self._cache}
        todo = {k: s for k, s in zip(keys, suites, strict=True) if k and k not in found}
        if todo:
            requests = [
                JudgeRequest(id=str(i), code=k[0], tests=s) for i, (k, s) in enumerate(todo.items())
            ]
            for key, verdict in zip(todo, self.judge.judge_many(requests), strict=True):
                found[key] = Judged(verdict.pass_rate, tuple(verdict.passed))
            with self._lock:
                if len(self._cache) > 50_000:
                    self._cache.clear()
                self._cache.update({k: found[k] for k in todo})
        return [found[k] if k else None for k in keys]

    def programs(
        self, completions: Sequence[Any], program: Sequence[str | None] | None = None
    ) -> list[str | None]:
        """The program each row is rewarded on: the rollout's `program`, else the completion's
        (`program`)."""
        if program is not None:
            return list(program)
        return [self.program(completion_text(c)) for c in completions]

    def prejudge(self, rows: Sequence[dict[str, Any]], completions: Sequence[Any]) -> None:
        """Judge a batch's programs before TRL asks for its rewards (generation overlapped with
        training judges the batch sampled ahead in the background): the results are cached
        under the same keys the reward functions read, so they compute the same rewards."""
        self.results(self.programs(completions), [row["test_cases"] for row in rows])

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
