"""The tiny model fitted on CPU to the synthetic family solves some seen-kind problems."""

from __future__ import annotations

import json
import os

import pytest
from tensorboard_events import scalars

from cobalt.data import synthetic
from cobalt.reference import (
    FIT_KEEP_ROUNDS,
    FIT_KEEP_SHARE,
    RECIPE_FILE,
    conversation,
    fit_embedded,
)
from cobalt.trajectories.prompts import extract_code
from engines import EngineConfig, SamplingConfig, make_engine
from sandbox import JudgeRequest, SandboxConfig, SyncJudge

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytestmark = pytest.mark.slow


def test_fit_generate_judge_and_cache(fitted_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = fitted_model["path"]  # fitted once per machine (the pipeline tests use it too)
    assert (path / RECIPE_FILE).exists()
    recipe = json.loads((path / RECIPE_FILE).read_text())
    assert (recipe["keep_share"], recipe["keep_rounds"]) == (FIT_KEEP_SHARE, FIT_KEEP_ROUNDS)
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

    # same recipe: the saved model is the answer, nothing is rewritten
    written = {f.name: f.stat().st_mtime_ns for f in path.iterdir() if f.is_file()}
    assert fit_embedded(path) == path
    assert {f.name: f.stat().st_mtime_ns for f in path.iterdir() if f.is_file()} == written


def test_the_sft_corpus_keeps_a_passing_program_through_as_many_passes_as_the_evaluation_gives():
    """The embedded fit's conversations hold contexts where the public tests passed twice (the
    evaluation's second feedback turn after two passes), and keep the answer there; with one
    round the corpus is the older one, draw for draw (the learning check's SFT models stay)."""
    import random

    kinds = synthetic.seen_kinds()
    problems = synthetic.make_problems(kinds, 400, seed=3)

    def rows(keep_rounds: int) -> list[dict]:
        rng = random.Random(0)
        return [conversation(p, kinds, rng, 0.25, 0.5, keep_rounds) for p in problems]

    def passes(row: dict) -> int:
        return sum("passed all" in m["content"] for m in row["prompt"] if m["role"] == "user")

    two = rows(2)
    counts = [passes(r) for r in two]
    assert {0, 1, 2} <= set(counts) and max(counts) == 2
    for row in two:  # after the passes the answer is the one already given: kept
        if passes(row) == 2:
            answers = [m["content"] for m in row["prompt"] if m["role"] == "assistant"]
            assert answers[-2:] == [row["completion"][0]["content"]] * 2
    assert max(passes(r) for r in rows(1)) == 1
    rng = random.Random(0)
    assert rows(1) == [conversation(p, kinds, rng, 0.25, 0.5) for p in problems]
