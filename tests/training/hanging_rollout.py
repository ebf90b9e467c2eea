"""rollout_funcs (training.rollout) whose second process goes wrong: one never comes back (what
a hung training process looks like to the others), one fails while the first waits for it in a
collective (tests/training/test_grpo_processes.py)."""

from __future__ import annotations

import time
from typing import Any


def hang_on_the_second_process(prompts: list[Any], trainer: Any) -> dict[str, Any]:
    if trainer.accelerator.process_index == 1:
        time.sleep(3600)
    return _answer(prompts, trainer)


def fail_on_the_second_process(prompts: list[Any], trainer: Any) -> dict[str, Any]:
    if trainer.accelerator.process_index == 1:
        time.sleep(2)  # process 0 is waiting in the gather of completions by then
        raise ValueError("the second process's rollout failed")
    return _answer(prompts, trainer)


def _answer(prompts: list[Any], trainer: Any) -> dict[str, Any]:
    prompt_ids = trainer.tokenized_prompts(prompts)[0]
    answer = trainer.processing_class("```python\nprint(1)\n```", add_special_tokens=False)
    ids = [*answer["input_ids"], trainer.processing_class.eos_token_id]
    return {"prompt_ids": prompt_ids, "completion_ids": [ids] * len(prompts), "logprobs": None}
