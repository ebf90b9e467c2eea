"""The loop with the real transformers engine on the tiny model (CPU), on sample problems. A
random model writes no code block, so every turn gets the no-code-block feedback."""

from __future__ import annotations

import pytest
from trajectory_helpers import sample_problems

from cobalt.trajectories.collect import CollectConfig, collect_initial, collect_multiturn
from cobalt.trajectories.evaluation import evaluate, turn_table
from cobalt.trajectories.prompts import no_code_feedback
from engines import EngineConfig, SamplingConfig, make_engine


@pytest.fixture(scope="module")
def tiny_engine(tiny_model):
    with make_engine(
        EngineConfig(kind="transformers", model=str(tiny_model), device="cpu", batch_size=16)
    ) as engine:
        yield engine


def test_tiny_model_gets_no_code_feedback_every_turn(tmp_path, tiny_engine, judge):
    problems = sample_problems(limit=3)
    cfg = CollectConfig(sampling=SamplingConfig(n=2, seed=0, max_new_tokens=24), turns=2)
    initial, _ = collect_initial(problems, tiny_engine, cfg, tmp_path / "i.jsonl")
    records, stats = collect_multiturn(
        problems, initial, tiny_engine, judge, cfg, tmp_path / "m.jsonl"
    )
    assert sorted(records) == sorted(p.id for p in problems)
    turns = [t for r in records.values() for s in r.samples for t in s.turns]
    assert len(turns) == 3 * 2 * 3
    assert {t.outcome for t in turns} <= {"no_code", "empty", "truncated"}
    assert all(t.code is None and t.public is None for t in turns)
    assert all(t.feedback == no_code_feedback() for t in turns)
    assert all(
        t.usage.prompt_tokens > 0 and t.usage.completion_tokens > 0
        for t in turns
        if t.outcome != "empty"
    )
    assert stats.completions == 12 and stats.programs_judged == 0 and stats.generate_s > 0
    # turn 2's prompt holds turn 1's answer and feedback: the conversation grew
    first = next(iter(records.values())).samples[0].turns
    assert (
        first[2].usage.prompt_tokens > first[1].usage.prompt_tokens > first[0].usage.prompt_tokens
    )

    evals, _ = evaluate(problems, records, judge, cfg.turns, tmp_path / "e.jsonl")
    table = turn_table(evals.values())
    all_rows = [r for r in table if r["difficulty"] == "all"]
    assert [(r["pass@1"], r["no_program"]) for r in all_rows] == [(0.0, 100.0)] * 3


def test_an_over_long_conversation_ends_its_sample(tmp_path, tiny_engine, judge):
    problems = sample_problems(limit=1)
    cfg = CollectConfig(
        sampling=SamplingConfig(n=2, seed=0, max_new_tokens=8), turns=2, max_prompt_tokens=40
    )
    initial, _ = collect_initial(problems, tiny_engine, cfg, tmp_path / "i.jsonl")
    records, stats = collect_multiturn(
        problems, initial, tiny_engine, judge, cfg, tmp_path / "m.jsonl"
    )
    for sample in records[problems[0].id].samples:
        assert sample.ended == "context_overflow"
        assert [t.outcome for t in sample.turns][1:] == ["context_overflow"]
        assert "over max_prompt_tokens=40" in sample.turns[1].error
    assert stats.completions == 0  # nothing was sent for turn 1
