"""The GPU learning check (docs/LEARNING.md): does training on the bandit rows teach a small SFT
model more than the baselines, at the same data budget? `python -m experiments.learning_check`
(`__main__`: the command). Its pieces:

- `kinds`: the split of the generated family into RL, never-seen and SFT kinds;
- `config`: the command line, the modes, the CPU smoke sizes;
- `results`: the seed result, the one contract between the two halves below;

running seeds:

- `stages`: the problems, SFT, trajectories and their evaluation, what an evaluation leaves;
- `training`: bandit and offline rows, one training mode (GRPO, offline, offline then GRPO);
- `seed_run`: one seed in one process, every phase in turn, its result rewritten after each;
- `parallel`: several seeds as processes at once on one machine, a deadline;
- `bf16_probe`: the bf16 crash probe on the same recipe (`python -m
  experiments.learning_check.bf16_probe`);

reading them:

- `runs`: the seed results of several output directories, one primary run per seed;
- `aggregate`: 95% intervals over seeds and problems, paired differences, verdicts, costs;
- `run_stats`: offline diagnostics, curve stability, phase times;
- `report` and `plots`: REPORT.md and its figures.

The general statistics it uses stay in the library: `cobalt.analysis.intervals` (the bootstrap)
and `cobalt.analysis.transitions` (the repair transitions).
"""
