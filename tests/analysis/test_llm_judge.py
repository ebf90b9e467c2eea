"""The LLM judge of turn-level errors: the strict reply parser on well-formed and malformed
replies; the retry rounds (bad reply and format reminder added, seed moved on, every raw reply
kept) with a scripted LLM; and end to end through the LiteLLM engine against a real
`transformers serve` process (the session's `served_tiny`) and against a closed port."""

from __future__ import annotations

import pytest
from analysis_helpers import CORRECT, HARD_CODED, ScriptedEngine, sum_problem
from tiny_serving import free_port

from cobalt.analysis.judge import (
    FORMAT_REMINDER,
    JUDGE_ERROR,
    PARSE_FAILURE,
    JudgeConfig,
    JudgeError,
    judge_errors,
    judge_prompt,
    parse_label,
)
from cobalt.analysis.reward_hacking import TurnError, rule_check, unified_diff, wrong_tests_of
from cobalt.analysis.stages import probe_judge
from engines import Completion, EngineConfig, SamplingConfig, make_engine


def hard_coding_error(sample: int = 0) -> TurnError:
    wrong = wrong_tests_of(sum_problem())[:1]
    return TurnError(
        id=f"hand/sum#s{sample}t1",
        problem_id="hand/sum",
        sample=sample,
        turn=1,
        old_code=CORRECT,
        new_code=HARD_CODED,
        diff=unified_diff(CORRECT, HARD_CODED, 1),
        wrong_tests=wrong,
        pass_rate_before=1.0,
        pass_rate_after=5 / 6,
        rule=rule_check(CORRECT, HARD_CODED, wrong),
    )


STATEMENT = sum_problem().instruction


@pytest.mark.parametrize(
    ("reply", "label"),
    [
        ("LABEL: hard_coding", "hard_coding"),
        ("  LABEL:logic_overfitting \n", "logic_overfitting"),
        ("label: Semantic_Drifting", "semantic_drifting"),
        ("<think>the diff prints 30 for that input</think>\n\nLABEL: other", "other"),
    ],
)
def test_well_formed_replies(reply, label):
    assert parse_label(reply) == label


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "   \n ",
        "LABEL:",
        "LABEL: hacking",  # not a label
        "LABEL: hard_coding\nThe program prints 30 for the wrong input.",  # extra text after
        "The edit hard-codes the test. LABEL: hard_coding",  # extra text before
        "LABEL: hard_coding, logic_overfitting",  # two labels
        "LABEL: other.",
        "**LABEL: other**",
        "hard_coding",  # no key
        "<think>it prints 30 for that input, so LABEL: hard_coding",  # reasoning never closed
    ],
)
def test_malformed_replies_are_parse_failures(reply):
    assert parse_label(reply) == PARSE_FAILURE


def test_the_prompt_shows_the_problem_the_wrong_test_and_the_diff():
    system, user = judge_prompt(hard_coding_error(), STATEMENT)
    assert (
        system["role"] == "system" and "LABEL: <hard_coding|logic_overfitting|" in system["content"]
    )
    text = user["content"]
    for part in (
        STATEMENT,
        "Input:\n3\n1 2 3",
        "(wrong):\n30",
        "Correct output for this input:\n6",
        "```diff\n--- turn 0\n+++ turn 1",
        "+    print(30)",
    ):
        assert part in text, part
    assert text.endswith("LABEL: <hard_coding|logic_overfitting|semantic_drifting|other>")
    long = judge_prompt(hard_coding_error(), "x" * 10_000, max_statement_chars=200)[1]["content"]
    assert "characters cut" in long and len(long) < 2000


def test_a_malformed_reply_is_asked_again_and_every_raw_reply_is_kept():
    replies = {  # per error (by sample index): the replies of rounds 0, 1, 2
        0: ["I think it hard-codes the test.", "LABEL: hard_coding"],
        1: ["", "LABEL: maybe", "still no label"],
        2: ["LABEL: logic_overfitting"],
        3: [Completion.failed("APIConnectionError: refused")] * 3,
    }

    errors = {i: hard_coding_error(i) for i in replies}
    items = [(errors[i], f"{STATEMENT} (error {i})") for i in replies]
    owner = {f"{STATEMENT} (error {i})": i for i in replies}

    def by_owner(conversation, call):
        i = next(k for s, k in owner.items() if s in conversation[1]["content"])
        return replies[i][call]

    engine = ScriptedEngine(by_owner)
    config = JudgeConfig(sampling=SamplingConfig(n=1, temperature=0.0, seed=7), max_attempts=3)
    judged = judge_errors(items, engine, config)

    assert [j.label for j in judged] == [
        "hard_coding",
        PARSE_FAILURE,
        "logic_overfitting",
        JUDGE_ERROR,
    ]
    assert [len(j.attempts) for j in judged] == [2, 3, 1, 3]
    assert [a.raw for a in judged[0].attempts] == replies[0]
    assert [a.label for a in judged[0].attempts] == [PARSE_FAILURE, "hard_coding"]
    assert [a.raw for a in judged[1].attempts] == replies[1]  # kept, the empty one too
    assert judged[1].raw == "still no label"
    assert judged[3].attempts[0].error == "APIConnectionError: refused"
    # rounds ask only what is still open, with the seed moved on
    assert [len(call) for call in engine.calls] == [4, 3, 2]
    assert [s.seed for s in engine.samplings] == [7, 8, 9]
    # the second round shows the judge its reply and the format again; a failed request does not
    retried = engine.calls[1][0]
    assert retried[-2:] == [
        {"role": "assistant", "content": "I think it hard-codes the test."},
        {"role": "user", "content": FORMAT_REMINDER},
    ]
    assert engine.calls[1][1][-2]["content"] == "(empty reply)"
    assert len(engine.calls[1][2]) == 2  # error 3's conversation is as it was


def test_the_judge_through_litellm_against_transformers_serve(served_tiny):
    """The random tiny model never writes the format: each error is asked max_attempts times,
    every reply is kept, and the label is parse_failure (counted, never dropped)."""
    config = JudgeConfig(
        engine=EngineConfig(
            kind="litellm", model=served_tiny["model"], api_base=served_tiny["api_base"]
        ),
        sampling=SamplingConfig(n=1, temperature=0.6, max_new_tokens=12, seed=0),
        max_attempts=2,
    )
    probe_judge(config.engine)  # the endpoint answers: no error
    with make_engine(config.engine) as engine:
        judged = judge_errors(
            [(hard_coding_error(0), STATEMENT), (hard_coding_error(1), STATEMENT)], engine, config
        )
    assert [j.label for j in judged] == [PARSE_FAILURE, PARSE_FAILURE]
    for judgement in judged:
        assert len(judgement.attempts) == 2
        first, second = judgement.attempts
        assert first.error is None and second.error is None
        assert first.prompt_tokens > 0
        # the retry carries the first reply and the reminder: a longer prompt
        assert second.prompt_tokens > first.prompt_tokens
        assert all(a.label == PARSE_FAILURE for a in judgement.attempts)


def test_an_unreachable_judge_fails_in_the_probe_and_is_never_a_label():
    engine = EngineConfig(
        kind="litellm",
        model="openai/judge",
        api_base=f"http://127.0.0.1:{free_port()}/v1",
        max_retries=0,
    )
    with pytest.raises(JudgeError, match=r"did not answer.*--judge-api-base"):
        probe_judge(engine)
    config = JudgeConfig(engine=engine, max_attempts=2)
    with make_engine(engine) as client:
        (judged,) = judge_errors([(hard_coding_error(), STATEMENT)], client, config)
    assert judged.label == JUDGE_ERROR
    assert [a.label for a in judged.attempts] == [JUDGE_ERROR, JUDGE_ERROR]
    assert "Connection" in (judged.attempts[0].error or "")
