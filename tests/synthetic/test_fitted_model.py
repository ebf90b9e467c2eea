"""The tiny model fitted on CPU to the synthetic family solves some seen-kind problems."""

from __future__ import annotations

import os
import time

import pytest
from tensorboard_events import scalars

from cobalt.data import synthetic
from cobalt.reference import RECIPE_FILE, fit_tiny_model
from cobalt.trajectories.prompts import extract_code
from engines import EngineConfig, SamplingConfig, make_engine
from sandbox import JudgeRequest, SandboxConfig, SyncJudge

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytestmark = pytest.mark.slow


def test_fit_generate_judge_and_cache(fitted_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = fitted_model["path"]  # fitted once for the session (the pipeline tests use it too)
    assert fitted_model["seconds"] < 300
    assert (path / RECIPE_FILE).exists()
    model = AutoModelForCausalLM.from_pretrained(path)
    AutoTokenizer.from_pretrained(path)
    curve = scalars(path / "tensorboard")["train/loss"]  # the SFT's curve (report_to tensorboard)
    assert [step for step, _ in curve][:2] == [50, 100] and curve[-1][1] < curve[0][1]
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 2e6

    problems = synthetic.make_problems(synthetic.seen_kinds(), 8, seed=99)
    with make_engine(EngineConfig(kind="transformers", model=str(path), batch_size=8)) as engine:
        outs = engine.generate(
            [[{"role": "user", "content": p.instruction}] for p in problems],  # no system prompt
            SamplingConfig(temperature=0.6, max_new_tokens=160, seed=0),
        )
    requests = [
        JudgeRequest(id=p.id, code=extract_code(o[0].text) or "", tests=p.hidden_tests)
        for p, o in zip(problems, outs, strict=True)
    ]
    with SyncJudge(SandboxConfig(backend="namespace", concurrency=2)) as judge:
        verdicts = judge.judge_many(requests)
    texts = [o[0].text for o in outs]
    assert sum(v.accepted for v in verdicts) >= 1, texts

    # same recipe: the cache answers at once; another recipe would refit
    start = time.monotonic()
    assert fit_tiny_model(path, seed=0, seconds_budget=900, max_steps=240) == path
    assert time.monotonic() - start < 1.0
