"""The VeRPO-style dense reward: test weights worked out by hand, and the TRL callable on real
sandbox verdicts (namespace backend)."""

from __future__ import annotations

import pytest

from cobalt.training.method.dense_reward import dense_reward_func, dense_terms, group_weights
from cobalt.training.method.sandbox_reward import CobaltRewards
from sandbox import SandboxConfig
from sandbox import TestSuite as Suite

T, F = True, False


def test_weights_by_hand() -> None:
    # 4 programs, 3 tests: passed by 3, 2 and 1 of them (the last row wrote no program)
    group = [[T, T, F], [T, F, F], [T, T, T], [F, F, F]]
    # rho = 3/4, 2/4, 1/4 -> 1 - rho = 1/4, 1/2, 3/4 (sum 3/2) -> w = 1/6, 1/3, 1/2
    assert group_weights(group) == pytest.approx([1 / 6, 1 / 3, 1 / 2])
    rows = [[T, T, F], [T, F, F], [T, T, T], None]
    # D = 1/6 + 1/3, 1/6, 1 (passes all: no dense term), none (no program: 0); times 0.5
    assert dense_terms(rows, 4) == pytest.approx([0.25, 1 / 12, 0.0, 0.0])
    assert dense_terms(rows, 4, scale=1.0) == pytest.approx([0.5, 1 / 6, 0.0, 0.0])


def test_the_frontier_test_outweighs_easy_ones() -> None:
    # tests 1-3 easy (3 of 4 pass them), test 4 medium (2 of 4), test 5 hard (1 of 4)
    group = [
        [T, T, T, T, F],  # pass rate 0.8
        [T, T, T, T, F],  # 0.8
        [T, T, T, F, F],  # 0.6
        [F, F, F, F, T],  # 0.2: only the hard test
    ]
    # 1 - rho = 1/4, 1/4, 1/4, 1/2, 3/4 (sum 2) -> w = 1/8, 1/8, 1/8, 1/4, 3/8
    assert group_weights(group) == pytest.approx([1 / 8, 1 / 8, 1 / 8, 1 / 4, 3 / 8])
    # D = 5/8, 5/8, 3/8, 3/8: the program passing only the hard test ties the one passing 3 easy
    assert dense_terms(group, 4, scale=1.0) == pytest.approx([5 / 8, 5 / 8, 3 / 8, 3 / 8])


def test_groups_are_weighted_apart_and_edge_cases() -> None:
    everyone = [[T, T], [T, T]]
    assert group_weights(everyone) == [0.5, 0.5]  # nothing separates the samples: uniform
    nobody = [None, None]
    # group 1: all pass everything; group 2: no program at all; group 3: rho = 1/2, 0
    rows = [*everyone, *nobody, [T, F], [F, F]]
    # group 3: 1 - rho = 1/2, 1 -> w = 1/3, 2/3; D = 1/3, 0
    assert dense_terms(rows, 2, scale=1.0) == pytest.approx([0, 0, 0, 0, 1 / 3, 0])
    with pytest.raises(ValueError, match="groups of num_generations=4"):
        dense_terms(rows, 4)
    with pytest.raises(ValueError, match=r"judged on \[1, 2\] tests"):
        dense_terms([[T], [T, F]], 2)


SUM = Suite(inputs=["1 2\n", "5 7\n", "0 0\n"], outputs=["3\n", "12\n", "0\n"])
OTHER = Suite(inputs=["abc\n"], outputs=["cba\n"])


def block(code: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": f"Here it is.\n```python\n{code}\n```"}]


def test_dense_callable_on_real_verdicts() -> None:
    """The `cobalt` path (programs from the completions) and the multi-turn path (`program`
    given): the same programs give the same terms; groups are checked for one problem."""
    programs = [
        "a, b = map(int, input().split())\nprint(a + b)",  # passes all: 0
        "print(3)",  # passes test 1 only
        "print(0)",  # passes test 3 only
        None,  # no code block
    ]
    completions = [
        block(p) if p else [{"role": "assistant", "content": "no idea"}] for p in programs
    ]
    tests = [SUM.model_dump_json()] * 4
    # s: [T,T,T], [T,F,F], [F,F,T], none -> rho = 1/2, 1/4, 1/2 -> 1 - rho = 1/2, 3/4, 1/2
    # (sum 7/4) -> w = 2/7, 3/7, 2/7; D(print(3)) = 2/7, D(print(0)) = 2/7; times 0.5
    expected = [0.0, 1 / 7, 1 / 7, 0.0]
    with CobaltRewards(SandboxConfig(backend="namespace", concurrency=2)) as rewards:
        dense = dense_reward_func(rewards, num_generations=4)
        assert dense.__name__ == "dense"
        assert dense(completions=completions, test_cases=tests) == pytest.approx(expected)
        noise = [[{"role": "assistant", "content": "```python\nprint(1)\n```"}]] * 4
        got = dense(completions=noise, test_cases=tests, program=programs)
        assert got == pytest.approx(expected)
        mixed = [*tests[:3], OTHER.model_dump_json()]
        with pytest.raises(ValueError, match=r"rows 0\.\.3 hold different problems"):
            dense(completions=completions, test_cases=mixed)
