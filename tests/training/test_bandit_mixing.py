"""Mixing repair contexts from perturbed-feedback trajectories into the bandit rows (METHOD §1.7)."""

from __future__ import annotations

from cobalt.bandit.dataset import mix_perturbed


def row(example: str, depth: int) -> dict:
    prompt = [{"role": "user", "content": example}]
    for _ in range(depth):
        prompt += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "fb"}]
    return {"prompt": prompt, "example_id": example}


def test_perturbed_contexts_make_up_the_ratio_of_repair_contexts():
    clean = [row("t0-a", 0), row("t0-b", 0)] + [row(f"r{i}", 1) for i in range(6)]
    perturbed = [row(f"p{i}", 2) for i in range(10)]
    mixed, taken = mix_perturbed(clean, perturbed, ratio=0.25, seed=0)
    # 6 clean repair contexts; 0.25 of all repair contexts perturbed -> 2 added (2 / 8)
    assert taken == 2 and len(mixed) == 10
    added = [r for r in mixed if r["example_id"].endswith("#perturbed")]
    assert len(added) == 2 and {r["example_id"][:2] for r in added} <= {f"p{i}" for i in range(10)}
    assert sorted(r["example_id"] for r in mixed if "#" not in r["example_id"]) == sorted(
        r["example_id"] for r in clean
    )
    # the same seed draws the same contexts; fewer available than wanted: all of them
    assert mix_perturbed(clean, perturbed, 0.25, 0) == (mixed, 2)
    mixed, taken = mix_perturbed(clean, perturbed[:1], ratio=0.5, seed=0)
    assert taken == 1 and len(mixed) == 9
    assert mix_perturbed(clean, perturbed, 0.0, 0)[1] == 0
