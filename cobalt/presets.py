"""The pipeline's presets: the embedded run's settings (`tiny`, CPU minutes on the bundled
synthetic problems) and the paper's (`paper`, METHOD §1.6.1 for a real model), and the fields
they decide (`PRESET_FIELDS`). `PipelineParams` (cobalt/pipeline/params.py) fills what the
parameters leave unset from them; the standalone reward-hacking flow samples as the tiny preset
does (`tiny_collect`)."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel

from cobalt.bandit.dataset import BanditConfig
from cobalt.data.cleaning import CleanRules
from cobalt.data.stages import SAMPLES
from cobalt.models import FITTED
from cobalt.training.settings import Mode, OfflineSettings, TrainingConfig
from cobalt.trajectories.collect import CollectConfig
from engines import EngineConfig, SamplingConfig

SYNTHETIC_SOURCES = tuple(
    f"{os.path.relpath(SAMPLES / name)}:taco{query}"
    for name, query in (("synthetic_train.jsonl", ""), ("synthetic_test.jsonl", "?role=test"))
)
# the synthetic statements are short and have exactly 8 tests
SYNTHETIC_RULES = CleanRules(min_statement_alnum=40)


def tiny_collect() -> CollectConfig:
    """The embedded run's trajectories and evaluations: 8 samples (with 4, a third of the
    training problems had every first sample right and gave no context, and the evaluation's own
    noise was larger than what training changed; docs/RESULTS.md, the embedded default over seeds),
    2 feedback turns, 128 new tokens, no system prompt (the fitted model's conversations have
    none)."""
    return CollectConfig(
        sampling=SamplingConfig(n=8, temperature=0.6, top_p=0.95, max_new_tokens=128, seed=0),
        turns=2,
        system_prompt="",
    )


def tiny_training(mode: Mode = "cobalt") -> TrainingConfig:
    """The embedded default's training: 32 GRPO steps of 32 completions, 8 prompts x 4 (cobalt,
    single_turn: about 1.2 passes over the ~200 bandit rows), learning rate 1e-4, sampled at
    temperature 0.6. Chosen over seeds with `scripts/embedded_seeds.py` on an evaluation with its
    own noise (docs/RESULTS.md, the embedded default over seeds): among five settings on seeds
    0-11, confirmed on new seeds 14-27, then on 46 more: +3.8 / +2.6 points at turns 0 / 2 over 72
    seeds; 16 completions a step gained +1.2 / +0.3 (28 seeds), groups of 8 (4 prompts x 8) 0.4 /
    0.7 less (45 seeds). Offline: one epoch over the offline rows in batches of 16, learning rate
    1e-4."""
    if mode == "offline":
        return TrainingConfig(
            preset="tiny",
            mode="offline",
            save_steps=8,
            offline=OfflineSettings(batch_size=16, learning_rate=1e-4, epochs=1),
        )
    return TrainingConfig(
        preset="tiny",
        mode=mode,
        max_steps=32,
        save_steps=8,
        overrides={
            "num_generations": 4,
            "per_device_train_batch_size": 32,
            "max_completion_length": 128,
            "learning_rate": 1e-4,
            # the trajectories' and evaluation's temperature, not METHOD §1.6.1's 1.0: at 1.0 the
            # default's gains did not hold on new seeds (docs/RESULTS.md, earlier settings)
            "temperature": 0.6,
        },
    )


PipelinePreset = Literal["tiny", "paper"]
# the settings a preset decides, unless the parameters set them (a partial nested object merges
# over them: {"collect": {"turns": 3}} keeps the preset's sampling)
PRESET_FIELDS = ("collect", "eval_turns", "bandit", "training", "engine")


def paper_collect() -> CollectConfig:
    """METHOD §1.2: 16 samples, T 0.6 / top-p 0.95, 6144 new tokens, 2 feedback turns, its system
    prompt."""
    return CollectConfig(
        sampling=SamplingConfig(n=16, temperature=0.6, top_p=0.95, max_new_tokens=6144, seed=0),
        turns=2,
    )


def preset_defaults(preset: PipelinePreset, mode: Mode = "cobalt") -> dict[str, Any]:
    """The fields of PRESET_FIELDS for a preset, as JSON (what a user's values merge over).
    tiny: the embedded run (CPU minutes); paper: METHOD §1.6.1 for a real model (16 samples, 8
    evaluation turns, 10,000-token contexts, the paper training preset)."""
    if preset == "tiny":
        values = {
            "collect": tiny_collect(),
            "eval_turns": 2,
            "bandit": BanditConfig(max_prompt_tokens=1024),
            "training": tiny_training(mode),
        }
    else:
        values = {
            "collect": paper_collect(),
            "eval_turns": 8,
            "bandit": BanditConfig(max_prompt_tokens=10_000),
            "training": TrainingConfig(preset="paper", mode=mode),
        }
    values["engine"] = EngineConfig(kind="auto", model=FITTED)
    return {
        k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in values.items()
    }
