"""Fixed completions for GRPO (a `training.rollout`): sample j of a prompt's group is always the
same text, whatever the number of processes, so that runs on 1 and N processes train on the same
completions and any difference between them is the training's own (benchmarks/parity.py).

The completions come from a JSON file named by COBALT_REPLAY: {example_id: [text, ...]}; sample
j of a group is text (j + crc32(example_id)) mod len. The group's samples are the consecutive rows
of TRL's global generation batch (this process holds rows process_index x n .. + n of it).
"""

from __future__ import annotations

import json
import os
import zlib
from functools import cache
from typing import Any

ENV = "COBALT_REPLAY"


@cache
def _table(path: str) -> dict[str, list[str]]:
    return json.loads(open(path).read())


def replay(prompts: list[Any], trainer: Any) -> dict[str, Any]:
    """TRL's rollout_func: the prompts' token ids (TRL's own templating) and each row's fixed
    completion, ending with the end-of-sequence token."""
    table = _table(os.environ[ENV])
    ids = trainer.batch_example_ids or []
    if len(ids) != len(prompts):
        raise ValueError("replay needs the rows' example_id (CobaltGRPOTrainer sets them)")
    tokenizer = trainer.processing_class
    offset = trainer.accelerator.process_index * len(prompts)
    completions = []
    for i, example in enumerate(ids):
        texts = table[example]
        sample = (offset + i) % trainer.num_generations
        text = texts[(sample + zlib.crc32(example.encode())) % len(texts)]
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        completions.append([*tokens, tokenizer.eos_token_id])
    prompt_ids = trainer.tokenized_prompts(prompts)[0]
    return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": None}
