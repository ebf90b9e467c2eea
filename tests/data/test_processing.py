"""Cleaning rules, test capping, verification in the real sandbox, split and perturbation."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from cobalt.data.cleaning import CleanRules, cap_tests, clean_problems, has_image
from cobalt.data.splits import SplitConfig, build_sets, in_dev, perturb_problem, perturb_tests
from cobalt.data.tally import Rejected
from cobalt.data.verify import VerifyConfig, verify_problems
from cobalt.judging import SandboxRuntime
from cobalt.problems import Problem, Provenance
from sandbox import TestSuite as Suite

STATEMENT = "Read an integer from standard input and print it doubled, on its own line. " * 2


def problem(
    pid: str,
    inputs: list[str],
    outputs: list[str],
    *,
    statement: str = STATEMENT,
    solutions: list[str] | None = None,
    n_public: int = 4,
    fn_name: str | None = None,
    difficulty: str = "easy",
) -> Problem:
    return Problem(
        id=f"t/{pid}",
        source="t",
        difficulty=difficulty,
        statement=statement,
        instruction="x",
        fn_name=fn_name,
        public_tests=Suite(inputs=inputs[:n_public], outputs=outputs[:n_public], fn_name=fn_name),
        hidden_tests=Suite(inputs=inputs[n_public:], outputs=outputs[n_public:], fn_name=fn_name),
        solutions=solutions or [],
        provenance=Provenance(dataset="d", revision="r", row=0, kind="taco"),
    )


def doubling(n: int, pid: str = "p", **kw) -> Problem:
    inputs = [f"{'9' * (i + 1)}\n" for i in range(n)]
    return problem(pid, inputs, [f"{2 * int(x)}\n" for x in inputs], **kw)


# --- cleaning ---


def test_cap_keeps_5_shortest_and_15_longest_ordered_by_length():
    inputs = [str(i) * (i % 7 + 1) + f"#{i}" for i in range(30)]
    tests = Suite(inputs=inputs, outputs=[f"o{i}" for i in range(30)])
    capped = cap_tests(tests, CleanRules())
    by_length = sorted(range(30), key=lambda i: len(inputs[i]))
    expected = by_length[:5] + by_length[-15:]
    assert capped.inputs == [inputs[i] for i in expected]
    assert capped.outputs == [f"o{i}" for i in expected]
    assert (
        cap_tests(Suite(inputs=inputs[:20], outputs=inputs[:20]), CleanRules()).inputs
        == inputs[:20]
    )


def test_cleaning_rules_drop_and_cap():
    problems = [
        doubling(30, "long"),
        doubling(7, "few"),
        doubling(10, "image", statement=STATEMENT + " See the image below."),
        doubling(10, "md-image", statement=STATEMENT + "\n![graph](http://x/y.png)"),
        doubling(10, "short", statement="Double n. " * 5),
    ]
    kept, tally = clean_problems(problems, CleanRules())
    assert [p.id for p in kept] == ["t/long"]
    assert len(kept[0].public_tests.inputs) == 4 and len(kept[0].hidden_tests.inputs) == 16
    assert kept[0].public_tests.inputs == ["9\n", "99\n", "999\n", "9999\n"]
    reasons = {o: n for (_, _, o), n in tally.counts.items()}
    assert reasons == {"kept": 1, "too_few_tests": 1, "has_image": 2, "short_statement": 1}
    relaxed, _ = clean_problems(
        problems, CleanRules(min_tests=1, drop_images=False, min_statement_alnum=0)
    )
    assert len(relaxed) == 5
    assert has_image("An IMAGE.") and not has_image("imagine")


# --- verification (real sandbox) ---


def test_verification_keeps_problems_a_reference_solves():
    problems = [
        doubling(
            5, "second-passes", solutions=["print(int(input()) * 3)", "print(int(input()) * 2)"]
        ),
        doubling(5, "none-pass", solutions=["print(0)", "import sys; sys.exit(3)"]),
        doubling(5, "no-reference"),
    ]
    kept, tally = verify_problems(
        problems, VerifyConfig(), SandboxRuntime(backend="namespace", concurrency=2)
    )
    # METHOD §1.1: only problems a reference solves are kept; without one nothing is verified
    assert [(p.id, p.verification) for p in kept] == [("t/second-passes", "passed")]
    outcomes = Counter({o: n for (_, _, o), n in tally.counts.items()})
    assert outcomes == Counter({"passed": 1, "no_solution": 1, "no_passing_reference": 1})
    published, _ = verify_problems(
        problems,
        VerifyConfig(require_reference=False),  # a test set (LiveCodeBench has no solutions)
        SandboxRuntime(backend="namespace", concurrency=2),
    )
    assert [(p.id, p.verification) for p in published] == [
        ("t/second-passes", "passed"),
        ("t/no-reference", "no_reference"),
    ]
    (example,) = [e for (_, o), e in tally.examples.items() if o == "no_passing_reference"]
    assert "2 reference solution(s) failed" in example

    off, _ = verify_problems(problems, VerifyConfig(enabled=False), SandboxRuntime())
    assert [p.verification for p in off] == ["not_run"] * 3


# --- split and perturbation (METHOD §1.7) ---


def test_perturbation_swaps_the_outputs_of_exactly_two_pairs():
    inputs = ["1\n", "2\n", "3\n", "4\n", "5\n"]
    outputs = ["a\n", "b\n", "a\n", "c\n", "d\n"]
    truth = dict(zip(inputs, outputs, strict=True))
    for seed in range(20):
        modified, public = perturb_tests(Suite(inputs=inputs, outputs=outputs), random.Random(seed))
        assert len(modified.inputs) == 2
        (i1, i2), (o1, o2) = modified.inputs, modified.outputs
        assert (o1, o2) == (truth[i2], truth[i1]) and o1 != o2  # swapped, and really wrong
        assert public.inputs[:2] == modified.inputs and public.outputs[:2] == modified.outputs
        assert sorted(public.inputs) == sorted(inputs)
        assert Counter(public.outputs) == Counter(outputs)
        wrong = [i for i, o in zip(public.inputs, public.outputs, strict=True) if truth[i] != o]
        assert sorted(wrong) == sorted(modified.inputs)
        # distinct pairs come before duplicates: the last pair repeats an earlier output
        assert public.outputs[-1] in public.outputs[:-1]


def test_outputs_the_judge_accepts_for_each_other_are_not_distinct():
    tests = Suite(inputs=["x", "y", "z"], outputs=["1\n", "1.0", " 1 "])  # all equal as numbers
    with pytest.raises(Rejected) as err:
        perturb_tests(tests, random.Random(0))
    assert err.value.reason == "few_distinct_outputs"
    call = Suite(inputs=["1", "2"], outputs=["[5]", "5"], fn_name="f")  # [5] accepts 5
    with pytest.raises(Rejected):
        perturb_tests(call, random.Random(0))


def test_sets_split_perturb_and_count():
    pools = {
        "train": [doubling(6, f"p{i}", n_public=4) for i in range(40)]
        + [problem("one", ["1\n", "2\n"], ["7\n", "7\n"])],
        "test": [doubling(3, "lcb", n_public=1)],
    }
    config = SplitConfig(dev_fraction=0.25, seed=3)
    sets, tally = build_sets(pools, config)
    assert len(sets["train"]) + len(sets["dev"]) == 41 and len(sets["test"]) == 1
    assert 3 <= len(sets["dev"]) <= 20
    assert all(in_dev(p.id, config) for p in sets["dev"])
    assert sets == build_sets(pools, config)[0]  # deterministic
    assert len(sets["train_perturbed"]) + len(sets["dev_perturbed"]) == 40  # 't/one' skipped
    skipped = {o for (_, _, o) in tally.counts if o.startswith("perturb_skipped")}
    assert skipped == {"perturb_skipped:few_distinct_outputs"}
    p = sets["train_perturbed"][0]
    assert p.public_tests == next(q for q in sets["train"] if q.id == p.id).public_tests
    assert p.feedback_tests == p.perturbed_public_tests != p.public_tests
    assert perturb_problem(p, seed=9) is p  # already perturbed: kept as is
