"""A rollout_func (training.rollout) whose second process never comes back: what a hung
training process looks like to the others (tests/training/test_grpo_processes.py)."""

from __future__ import annotations

import time
from typing import Any


def hang_on_the_second_process(prompts: list[Any], trainer: Any) -> dict[str, Any]:
    if trainer.accelerator.process_index == 1:
        time.sleep(3600)
    prompt_ids = trainer._tokenize_prompts(prompts)[0]
    answer = trainer.processing_class("```python\nprint(1)\n```", add_special_tokens=False)
    ids = [*answer["input_ids"], trainer.processing_class.eos_token_id]
    return {"prompt_ids": prompt_ids, "completion_ids": [ids] * len(prompts), "logprobs": None}
