"""A VeRPO-style dense reward (Wang et al., arXiv 2601.03525), a reward option beside METHOD §1.5's
for the `cobalt` (one sampled next turn per row) and `multi_turn` (the conversation's last program)
modes.

VeRPO scores a program by the tests it passes, each test weighted by how hard it is for the
current policy, estimated from the group of samples of the same prompt, and ties that dense
signal to the all-tests outcome. The paper's text gives no code; the formula used here:

For one group (the `num_generations` consecutive rows of one prompt: G programs, M tests, all
tests of the problem), s_ij = 1 when program i passes test j (a row without a program passes
none and still counts in the group):

    rho_j = (1/G) * sum_i s_ij                        how often the group passes test j
    w_j   = (1 - rho_j) / sum_k (1 - rho_k)           (w_j = 1/M when every sample passes all)
    D_i   = sum_j w_j * s_ij                          in [0, 1]
    dense_i = scale * D_i  if program i exists and fails a test, else 0   (scale 0.5)

Why this form:
- Weight by rarity: with plain pass rates (uniform weights) one more easy test is worth as much
  as the frontier test the group cannot pass yet, and suites with many easy tests reward
  partial programs for the easy ones (the paper's cardinality bias). Weighting by the group's
  failure rate 1 - rho_j puts the weight on the tests that separate the samples; a test every
  sample passes gets weight 0 (it separates nothing).
- Normalised weights: D_i is in [0, 1] whatever the number of tests, so problems with 8 and 20
  tests weigh alike, and D_i = 1 exactly when program i passes every test (a failed test j has
  rho_j < 1, hence w_j > 0).
- Combined with the outcome: the dense term is added to the outcome reward (METHOD §1.5's
  correctness reward: 1 when every test passes) only for programs that fail a test, and is
  below 0.5. A failing program's total (correctness at most 0.2 + 0.1 improvement bonus, plus
  dense < 0.5) stays under the 1.0 of a fully correct one, so partial success never outranks
  the outcome; among failing programs it separates those the 0.2 / 0 / -0.1 steps tie.

TRL calls reward functions on each process's rows; a group may straddle processes, so the
callable gathers the pass vectors of the whole generation batch (`accelerate.gather_object`, a
collective every process reaches), computes the weights per group and returns its own rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cobalt.training.method.sandbox_reward import CobaltRewards

DENSE_SCALE = 0.5

Passed = Sequence[bool] | None  # one program's per-test flags on all tests; None: no program


def group_weights(passed: Sequence[Sequence[bool]]) -> list[float]:
    """w_j of one group's tests from its programs' pass flags (all of one length M)."""
    m = len(passed[0])
    fail = [1.0 - sum(bool(p[j]) for p in passed) / len(passed) for j in range(m)]
    total = sum(fail)
    return [f / total for f in fail] if total > 0 else [1.0 / m] * m


def dense_terms(
    passed: Sequence[Passed], group_size: int, scale: float = DENSE_SCALE
) -> list[float]:
    """The dense term of every row: consecutive groups of `group_size` rows, weights per group."""
    if group_size < 1 or len(passed) % group_size:
        raise ValueError(
            f"{len(passed)} rows do not split into groups of num_generations={group_size}"
        )
    terms: list[float] = []
    for start in range(0, len(passed), group_size):
        group = passed[start : start + group_size]
        sizes = {len(p) for p in group if p is not None}
        if len(sizes) > 1:
            raise ValueError(f"the rows of one group were judged on {sorted(sizes)} tests")
        if not sizes or not (m := sizes.pop()):
            terms += [0.0] * group_size
            continue
        flags = [list(p) if p is not None else [False] * m for p in group]
        weights = group_weights(flags)
        for program, f in zip(group, flags, strict=True):
            score = sum(w for w, ok in zip(weights, f, strict=True) if ok)
            terms.append(scale * score if program is not None and not all(f) else 0.0)
    return terms


def dense_reward_func(
    rewards: CobaltRewards, num_generations: int, scale: float = DENSE_SCALE
) -> Callable[..., list[float]]:
    """TRL reward callable `dense` (logged as `rewards/dense/mean`), added beside `correctness`:
    judges each row's program on all its tests with `rewards` (cached, so `correctness` judges
    nothing twice) and returns its dense term. Rows of the multi-turn rollout are judged on
    their `program`, other rows on the program in the completion."""

    def dense(completions, test_cases, program=None, **kwargs) -> list[float]:
        from accelerate import PartialState
        from accelerate.utils import gather_object

        results = rewards.results(rewards.programs(completions, program), test_cases)
        local: list[Any] = [r.passed if r is not None else None for r in results]
        rows = gather_object(list(zip(local, map(str, test_cases), strict=True)))
        for start in range(0, len(rows) - len(rows) % num_generations, num_generations):
            if len({tests for _, tests in rows[start : start + num_generations]}) > 1:
                raise ValueError(
                    f"rows {start}..{start + num_generations - 1} hold different problems: "
                    f"the dense reward's num_generations ({num_generations}) must be the trainer's"
                )
        terms = dense_terms([p for p, _ in rows], num_generations, scale)
        first = PartialState().process_index * len(local)
        return terms[first : first + len(local)]

    return dense
