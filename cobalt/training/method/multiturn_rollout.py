"""Multi-turn online GRPO, the paper's baseline (METHOD §1.6.3): whole repair conversations sampled
by the policy while it trains, through TRL's experimental `GRPOTrainer(rollout_func=...)`.

`repair_rollout(problems, judge, turns=2)` returns `rollout(prompts, trainer) -> dict`. Each
prompt is a turn-0 context (system + instruction) of a bandit row; TRL's sampler has already
repeated it `num_generations` times, so one group is `num_generations` consecutive rows, one
conversation each. Per conversation: sample a program, run it on the problem's public tests,
give METHOD §1.2's feedback as a user turn, sample the next program, `turns` times. Sampling goes
through the trainer's `sample_turn` (TRL's own path: transformers `generate`, or vLLM colocated or
served, from the current weights); the feedback and its verdict come from the trajectory stage
(`judge_turns`), the program and the thinking split from `make_turn`: one rule for both stages.

Choices (the public Cobalt release has no code for its online baselines):

- Turns: 2 feedback turns (3 programs), as the training trajectories (METHOD §1.2).
- One sequence per conversation: `prompt_ids` = the templated turn-0 prompt (TRL's own
  tokenisation), `completion_ids` = assistant turn 0 + feedback turn 1 (the template's tokens
  for a user turn and the next generation prompt) + assistant turn 1 + ...; `env_mask` is 1 on
  the model's tokens (each turn's end-of-turn token included) and 0 on the feedback tokens.
  Credit assignment: the loss covers every assistant turn and no feedback token, and the one
  trajectory-level reward (one advantage per conversation) applies to every assistant turn.
- Reward: the last turn's program on all tests of the problem (the row's `test_cases`), with
  METHOD §1.5's correctness reward and prev_best = 0 (the row's own `prev_best_pass_rate`): 1 /
  0.2 / 0 / -0.1 by pass rate, -1 without a code block. A conversation is worth the program it
  ends with, what multi-turn evaluation reports at its last turn; rewarding the best turn would
  pay a conversation that breaks a correct program as much as one that keeps it. The rollout
  returns that program (`program`) and its raw response (`response`, for the format term), so
  the reward never parses the decoded completion, which holds the feedback text and its fences.
- History: a later turn is sampled after the model's own sampled tokens (thinking included),
  since its loss is computed on exactly that context. Collection keeps only the answer after
  `</think>` (at most 6000 characters) in the history, and templates that re-render earlier turns
  (Qwen3 drops their thinking) render it differently: the sequence equals the template's rendering
  of the whole conversation for non-thinking models (tested with the tiny model's ChatML).
- A turn cut by the token limit gets the template's end-of-turn token (env_mask 0) before its
  feedback. A conversation whose next context would exceed `max_context_tokens` stops there and
  is rewarded on its last program.

Extra fields per row (TRL passes them to the reward functions): `program`, `response`,
`programs` (each turn's program) and `feedback` (each feedback turn's text).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cobalt.trajectories.collect import judge_turns
from cobalt.trajectories.records import ProblemLike, Turn, make_turn
from engines import Completion, Conversation, with_open_thinking
from engines.thinking import template_opens_thinking
from sandbox import SyncJudge

RolloutFunc = Callable[[list[Any], Any], dict[str, list[Any] | None]]


@dataclass
class _Rollout:
    problem: ProblemLike
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    open: bool = True

    def add(self, ids: Sequence[int], model: bool, logprobs: Sequence[float] | None = None) -> None:
        self.completion_ids += ids
        self.env_mask += [int(model)] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)

    def context(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


def instruction_of(prompt: Conversation) -> str:
    """The instruction of a turn-0 context (its one user turn, after an optional system turn)."""
    roles = [m.get("role") for m in prompt] if isinstance(prompt, list) else []
    if roles not in (["user"], ["system", "user"]):
        raise ValueError(
            f"multi_turn rows must be turn-0 contexts (system + user instruction), got roles "
            f"{roles or type(prompt).__name__}: keep only the turn-0 rows of the bandit dataset"
        )
    return prompt[-1]["content"]


class ProblemIndex:
    """The problem of each prompt. By the row's `example_id` (the problem id, which
    `CobaltGRPOTrainer` hands the rollout as `batch_example_ids`), else by the prompt's
    instruction; an instruction that several problems with different public tests share (one
    statement, other tests: the synthetic kinds, duplicated TACO statements) cannot say whose
    tests give feedback, and fails only when a prompt needs it."""

    def __init__(self, problems: Iterable[ProblemLike]) -> None:
        self.by_id: dict[str, ProblemLike] = {}
        self.by_instruction: dict[str, list[ProblemLike]] = {}
        for problem in problems:
            self.by_id[problem.id] = problem
            same = self.by_instruction.setdefault(problem.instruction, [])
            if all(p.feedback_tests != problem.feedback_tests for p in same):
                same.append(problem)

    def find(self, prompt: Conversation, example_id: str | None = None) -> ProblemLike:
        instruction = instruction_of(prompt)
        if example_id and example_id in self.by_id:
            return self.by_id[example_id]
        found = self.by_instruction.get(instruction)
        if not found:
            raise KeyError(
                f"no problem has the instruction {instruction[:80]!r}: give repair_rollout "
                "the problem set the bandit dataset was built from"
            )
        if len(found) > 1:
            raise ValueError(
                f"problems {found[0].id} and {found[1].id} have the same instruction but "
                "different public tests, and the row names neither (example_id): train with "
                "CobaltGRPOTrainer, which passes each row's example_id to the rollout"
            )
        return found[0]


def feedback_template(trainer: Any, feedback: str) -> tuple[int, list[int]]:
    """(the end-of-turn token the chat template closes an assistant turn with, the tokens that
    follow it: the user turn holding `feedback` and the next generation prompt), read from the
    template's rendering of [user, assistant, user: feedback] with the trainer's template
    settings."""
    tokenizer = trainer.processing_class
    options = {
        "chat_template": trainer.chat_template,
        "tokenize": True,
        "return_dict": False,
        **trainer.chat_template_kwargs,
    }
    head = [{"role": "user", "content": "x"}]
    whole = [*head, {"role": "assistant", "content": "x"}, {"role": "user", "content": feedback}]
    head_ids = tokenizer.apply_chat_template(head, add_generation_prompt=False, **options)
    ids = tokenizer.apply_chat_template(whole, add_generation_prompt=True, **options)
    eos = set(trainer.eos_token_ids)
    end = next((i for i in range(len(head_ids), len(ids)) if ids[i] in eos), None)
    if ids[: len(head_ids)] != head_ids or end is None:
        raise ValueError(
            "the chat template does not render a conversation as its first turns followed by "
            "an assistant turn closed with one of the model's end-of-sequence tokens "
            f"{sorted(eos)}: multi_turn needs a template that does (ChatML does)"
        )
    return ids[end], ids[end + 1 :]


def _completion(ids: Sequence[int], trainer: Any, opened_thinking: bool = False) -> Completion:
    """A sampled turn as the engines report one: text up to the first end-of-sequence token, the
    `<think>` a template opened put back in front (`engines.thinking`)."""
    eos = set(trainer.eos_token_ids)
    stop = next((i for i, t in enumerate(ids) if t in eos), None)
    body = ids if stop is None else ids[:stop]
    text = trainer.processing_class.decode(body, skip_special_tokens=True)
    return Completion(
        text=with_open_thinking(text, opened_thinking),
        finish_reason="length" if stop is None else "stop",
        completion_tokens=len(ids),
    )


def repair_rollout(
    problems: Iterable[ProblemLike],
    judge: SyncJudge,
    turns: int = 2,
    max_answer_chars: int = 6000,
    max_context_tokens: int | None = None,
) -> RolloutFunc:
    """TRL's `rollout_func` for multi-turn repair conversations (see the module docstring).

    `problems` give each prompt's public tests (looked up by the row's example_id, else by the
    prompt's instruction: `ProblemIndex`; a prompt of an unknown problem fails with its first
    words); `judge` runs the programs on them (share
    `CobaltRewards.judge`); `turns` feedback turns per conversation; `max_answer_chars` caps the
    answer kept for code extraction as collection does; `max_context_tokens` stops a
    conversation whose next context would be longer (None: no limit)."""
    if turns < 0:
        raise ValueError(f"turns must be >= 0, got {turns}")
    index = ProblemIndex(problems)

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, list[Any] | None]:
        ids = getattr(trainer, "batch_example_ids", None)
        if ids is None or len(ids) != len(prompts):
            ids = [None] * len(prompts)
        found = [index.find(prompt, i) for prompt, i in zip(prompts, ids, strict=True)]
        prompt_ids = trainer.tokenized_prompts(prompts)[0]
        opened = template_opens_thinking(trainer.processing_class, **trainer.chat_template_kwargs)
        rows = [_Rollout(p, list(ids)) for p, ids in zip(found, prompt_ids, strict=True)]
        sampled_logprobs = True
        for t in range(turns + 1):
            live = [r for r in rows if r.open]
            # every process samples every turn (vLLM's gathers and sharded models' parameter
            # gathers are collective): a process without an open conversation samples a
            # placeholder whose result is dropped
            contexts = [r.context() for r in live] or [rows[0].prompt_ids]
            completion_ids, logprobs = trainer.sample_turn(contexts)
            sampled_logprobs = sampled_logprobs and logprobs is not None
            for i, row in enumerate(live):
                ids = list(completion_ids[i])
                row.add(ids, True, logprobs[i] if logprobs is not None else None)
                completion = _completion(ids, trainer, opened)
                row.turns.append(make_turn(t, completion, max_answer_chars))
            if t == turns:
                break
            judge_turns([(r.problem, r.turns[-1]) for r in live], judge)
            for row in live:
                end, suffix = feedback_template(trainer, row.turns[-1].feedback or "")
                closing = [] if row.turns[-1].finish_reason == "stop" else [end]
                grown = len(row.context()) + len(closing) + len(suffix)
                if max_context_tokens is not None and grown > max_context_tokens:
                    row.open = False
                else:
                    row.add(closing + suffix, False)
        return {
            "prompt_ids": [r.prompt_ids for r in rows],
            "completion_ids": [r.completion_ids for r in rows],
            "logprobs": [r.logprobs for r in rows] if sampled_logprobs else None,
            "env_mask": [r.env_mask for r in rows],
            "program": [r.turns[-1].code for r in rows],
            "response": [r.turns[-1].response for r in rows],
            "programs": [[turn.code for turn in r.turns] for r in rows],
            "feedback": [[turn.feedback for turn in r.turns[:-1]] for r in rows],
        }

    return rollout
