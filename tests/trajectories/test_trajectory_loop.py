"""The multi-turn loop against the real sandbox, driven by a scripted LLM (a test double for the
model only): a wrong first program, public-test feedback, a repaired program; the recorded
outcomes that are never crashes; the perturbed problem set."""

from __future__ import annotations

from trajectory_helpers import (
    FIXED,
    WRONG,
    ScriptedEngine,
    block,
    doubling,
    problem,
    repairing_script,
    turn_of,
)

from cobalt.trajectories.collect import (
    BatchConfig,
    CollectConfig,
    collect_initial,
    collect_multiturn,
)
from cobalt.trajectories.evaluation import evaluate, turn_table
from cobalt.trajectories.prompts import SYSTEM_PROMPT, no_code_feedback, passed_feedback
from cobalt.trajectories.records import read_records
from engines import Completion, SamplingConfig


def config(n: int = 2, turns: int = 2, **kw) -> CollectConfig:
    return CollectConfig(sampling=SamplingConfig(n=n, seed=7, max_new_tokens=64), turns=turns, **kw)


def test_wrong_program_gets_its_failing_test_and_is_repaired(tmp_path, judge):
    problems = [doubling("a", "easy"), doubling("b", "hard")]
    engine = ScriptedEngine(repairing_script)
    cfg = config()
    initial, stats0 = collect_initial(problems, engine, cfg, tmp_path / "initial.jsonl")
    # turn 0: one generate call, n samples per problem, system + instruction
    assert len(engine.calls) == 1 and engine.samplings[0].n == 2
    assert engine.calls[0][0] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": problems[0].instruction},
    ]
    assert stats0.problems == 2 and stats0.completions == 4
    assert all(s.turns[0].code == WRONG for r in initial.values() for s in r.samples)

    records, stats = collect_multiturn(
        problems,
        initial,
        engine,
        judge,
        cfg,
        tmp_path / "multiturn.jsonl",
        BatchConfig(chunk_size=2, lanes=1),
    )
    # one generate call per feedback turn over every live conversation, n=1, seed + turn
    assert len(engine.calls) == 3
    assert [len(c) for c in engine.calls[1:]] == [4, 4]
    assert [(s.n, s.seed) for s in engine.samplings[1:]] == [(1, 8), (1, 9)]
    assert stats.programs_judged == 2 + 2 + 2  # identical programs of a problem judged once

    record = records["hand/a"]
    assert record.stage == "multiturn" and record.feedback_tests == "public"
    first = record.samples[0].turns[0]
    assert first.public.status == "wrong_answer" and first.public.failed_test == 0
    assert first.public.passed == [False, False]  # fail-fast: test 2 was not run
    assert first.feedback.startswith(
        "Your program was run on the public tests and failed test 1 of 2."
    )
    assert "Input:\n1\n" in first.feedback and "Program output:\n3" in first.feedback
    assert "Expected output:\n2" in first.feedback
    # what the model saw at turn 1: the answer without its reasoning, then the feedback
    seen = engine.calls[1][0]
    assert [m["role"] for m in seen] == ["system", "user", "assistant", "user"]
    assert seen[2]["content"] == first.answer and "<think>" not in seen[2]["content"]
    assert seen[3]["content"] == first.feedback
    fixed = record.samples[0].turns[1]
    assert fixed.code == FIXED and fixed.public.status == "accepted"
    assert fixed.feedback == passed_feedback(2)
    assert [t.turn for t in record.samples[1].turns] == [0, 1, 2]
    assert len(engine.calls[2][0]) == 6  # turn 2 sees both earlier turns and feedbacks

    # the file holds exactly these records, in full
    on_disk, _ = read_records(tmp_path / "multiturn.jsonl")
    assert on_disk == records

    evals, _ = evaluate(problems, records, judge, cfg.turns, tmp_path / "evaluation.jsonl")
    results = evals["hand/a"].results[0]
    assert [r.status for r in results] == ["wrong_answer", "accepted", "accepted"]
    assert results[0].passed == "01000" and results[0].pass_rate == 0.2  # 4 -> 4 passes by luck
    table = turn_table(evals.values(), cfg.turns)
    assert [(r["difficulty"], r["turn"], r["pass@1"]) for r in table] == [
        ("all", 0, 0.0),
        ("all", 1, 100.0),
        ("all", 2, 100.0),
        ("easy", 0, 0.0),
        ("easy", 1, 100.0),
        ("easy", 2, 100.0),
        ("hard", 0, 0.0),
        ("hard", 1, 100.0),
        ("hard", 2, 100.0),
    ]
    assert table[1]["change_vs_turn0"] is None  # relative to 0: undefined


def test_empty_refusal_error_and_crash_are_recorded_outcomes(tmp_path, judge):
    problems = [doubling("p")]

    def script(conversation, sample):
        turn = turn_of(conversation)
        if turn == 0:
            return [
                "",
                "I won't write that program.",
                block("raise ValueError('boom')"),
                block("print(", tag=""),
            ][sample]
        if sample == 1:  # the refusing sample's conversation breaks the API at turn 1
            return Completion.failed("APIConnectionError: connection reset")
        if sample == 3:
            return Completion.failed("BadRequestError: maximum context length is 4096 tokens")
        return "still nothing"

    engine = ScriptedEngine(script)
    cfg = config(n=4, turns=2)
    initial, _ = collect_initial(problems, engine, cfg, tmp_path / "i.jsonl")
    # sample indices must reach the script per conversation: split them by the first answer
    answers = {s.turns[0].answer: s.index for s in initial["hand/p"].samples}
    engine.script = lambda conv, _: script(conv, answers[conv[2]["content"]])
    records, stats = collect_multiturn(problems, initial, engine, judge, cfg, tmp_path / "m.jsonl")
    samples = records["hand/p"].samples
    t0 = [s.turns[0] for s in samples]
    assert [t.outcome for t in t0] == ["empty", "no_code", "code", "code"]
    assert t0[0].feedback == t0[1].feedback == no_code_feedback()
    assert t0[2].public.status == "runtime_error" and "ValueError: boom" in t0[2].feedback
    assert t0[3].public.status == "syntax_error" and "does not compile" in t0[3].feedback
    assert [s.ended for s in samples] == [None, "engine_error", None, "context_overflow"]
    assert [len(s.turns) for s in samples] == [3, 2, 3, 2]
    assert samples[1].turns[1].feedback is None and "connection reset" in samples[1].turns[1].error
    assert samples[0].turns[2].outcome == "no_code"
    assert len(engine.calls[-1]) == 2  # ended samples are not sent again
    assert stats.outcomes == {"engine_error": 1, "context_overflow": 1, "no_code": 4}

    evals, _ = evaluate(problems, records, judge, cfg.turns, tmp_path / "e.jsonl")
    statuses = [[r.status for r in row] for row in evals["hand/p"].results]
    assert statuses == [
        ["no_code"] * 3,
        ["no_code", "engine_error", "missing"],
        ["runtime_error", "no_code", "no_code"],
        ["syntax_error", "context_overflow", "missing"],
    ]
    table = turn_table(evals.values())
    assert [r["no_program"] for r in table[:3]] == [50.0, 100.0, 100.0]


def test_perturbed_feedback_and_evaluation_on_the_true_tests(tmp_path, judge):
    # public (1 -> 2), (2 -> 4) perturbed by swapping outputs; hidden tests are true
    hacked = problem(
        "swap",
        public=[("1\n", "2\n"), ("2\n", "4\n")],
        hidden=[("3\n", "6\n"), ("5\n", "10\n")],
        perturbed=[("1\n", "4\n"), ("2\n", "2\n")],
        modified=[("1\n", "4\n"), ("2\n", "2\n")],
    )
    hack = "n = int(input())\nprint({1: 4, 2: 2}.get(n, 2 * n))"

    def script(conversation, sample):
        return block(FIXED) if turn_of(conversation) == 0 else block(hack)

    engine = ScriptedEngine(script)
    cfg = config(n=1, turns=1)
    initial, _ = collect_initial([hacked], engine, cfg, tmp_path / "i.jsonl")
    records, _ = collect_multiturn(
        [hacked], initial, engine, judge, cfg, tmp_path / "m.jsonl", feedback_kind="perturbed"
    )
    record = records["hand/swap"]
    assert record.feedback_tests == "perturbed"
    first = record.samples[0].turns[0]
    # the correct program fails the (wrong) perturbed public test, and the model is told so
    assert first.public.status == "wrong_answer"
    assert "Program output:\n2" in first.feedback and "Expected output:\n4" in first.feedback
    assert record.samples[0].turns[1].public.status == "accepted"  # the hack passes them

    evals, _ = evaluate([hacked], records, judge, cfg.turns, tmp_path / "e.jsonl")
    turn0, turn1 = evals["hand/swap"].results[0]
    assert (turn0.status, turn0.passed, turn0.modified_passed) == ("accepted", "1111", "00")
    assert (turn1.status, turn1.passed, turn1.modified_passed) == ("wrong_answer", "0011", "11")
    table = turn_table(evals.values())
    assert [(r["pass@1"], r["passes_wrong_test"]) for r in table[:2]] == [
        (100.0, 0.0),
        (0.0, 100.0),
    ]
    assert table[1]["change_vs_turn0"] == -100.0


def test_lanes_alternate_on_the_engine_and_give_the_same_trajectories(tmp_path, judge):
    problems = [doubling(f"l{i}") for i in range(4)]
    cfg = config(n=2, turns=2)
    outcomes = {}
    for lanes in (1, 2):
        engine = ScriptedEngine(repairing_script)
        initial, _ = collect_initial(problems, engine, cfg, tmp_path / f"i{lanes}.jsonl")
        records, stats = collect_multiturn(
            problems,
            initial,
            engine,
            judge,
            cfg,
            tmp_path / f"m{lanes}.jsonl",
            BatchConfig(chunk_size=4, lanes=lanes),
        )
        # lanes=2: two calls per turn, each with one half of the chunk's conversations
        assert [len(c) for c in engine.calls[1:]] == ([8, 8] if lanes == 1 else [4] * 4)
        assert stats.sandbox_busy_s > 0 and stats.sandbox_s > 0 and stats.programs_judged == 12
        outcomes[lanes] = {
            pid: [
                [(t.code, t.public and t.public.passed, t.feedback) for t in s.turns]
                for s in r.samples
            ]
            for pid, r in records.items()
        }
    assert outcomes[1] == outcomes[2]
