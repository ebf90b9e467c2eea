"""Cobalt, the method: contextual bandit learning over offline multi-turn trajectories for code
LLMs (arXiv 2602.03806), and its baselines. Plain Python, no Prefect: usable from a notebook or a
script; the Prefect layer (`tasks/`, `flows/`) only wraps these functions.

In pipeline order:

    data/           sources -> clean, verified, versioned problem sets (SPEC §1.1, §1.7)
    trajectories/   reference LLM + sandbox feedback -> multi-turn trajectories (§1.2)
    evaluation.py   every turn's program on all tests -> per-turn Pass@1 (§1.3)
    bandit/         trajectories -> contexts with prev_best_pass_rate (§1.4)
    training/       reward (§1.5), GRPO with TRL (§1.6): single_turn and cobalt modes
    pipeline.py     the whole chain's parameters and its before/after summary

Shared: `problems.py` (the Problem record), `storage.py` (local or S3 storage, content-addressed
and committed by manifest), `judging.py` (how stages open the sandbox), `reference.py` (the
embedded default's reference model), `tables.py`, `errors.py`.

From a notebook:

    from cobalt.bandit.selection import bandit_rows
    from cobalt.training.reward import correctness_reward
    from cobalt.trajectories.collect import collect_initial, collect_multiturn
"""
