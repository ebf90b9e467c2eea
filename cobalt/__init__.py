"""Cobalt, the method: contextual bandit learning over offline multi-turn trajectories for code
LLMs (arXiv 2602.03806), and its baselines. Plain Python, no Prefect: usable from a notebook or a
script; the Prefect layer (`tasks/`, `flows/`) only wraps these functions.

In pipeline order, each importing only what comes before it (tests/test_layers.py):

    errors, params, tables, plots, problems, storage, judging, run_settings, models
                    shared by every stage (models: how a model is named and resolved)
    data/           sources -> clean, verified, versioned problem sets (METHOD §1.1, §1.7)
    trajectories/   reference LLM + sandbox feedback -> multi-turn trajectories (§1.2); their
                    evaluation: every turn's program on all tests -> per-turn Pass@1 (§1.3)
    bandit/         trajectories -> contexts with prev_best_pass_rate, the rows' format (§1.4)
    training/       reward (§1.5), GRPO with TRL (§1.6), the offline mode; one load/save path
    reference.py    the embedded default's reference model: its SFT fit and `python -m`
    presets.py      the embedded run's settings (tiny) and the paper's
    analysis/       reward hacking (§1.7); intervals over seeds and problems, turn transitions
    seed_spread.py  the embedded default's run-to-run spread
    pipeline/       the whole chain's parameters, its printed settings and its summary

"METHOD §1.4" here and throughout the code is a section of docs/METHOD.md.

This package's own module wires the reference fit into model naming: `cobalt.models` resolves
the name 'fitted' by fitting it, with `cobalt.reference`, which comes after the stages that
resolve names.

From a notebook:

    from cobalt.bandit.selection import bandit_rows
    from cobalt.training.method.cobalt_reward import correctness_reward
    from cobalt.trajectories.collect import collect_initial, collect_multiturn
"""

from pathlib import Path

from cobalt import models as _models


def _fit_embedded(path: Path, fit_steps: int | None) -> Path:
    from cobalt.reference import FIT_STEPS, fit_embedded

    return fit_embedded(path, fit_steps or FIT_STEPS)


_models.fit_embedded_with(_fit_embedded)
