"""The GPU learning check (`scripts/learning_check.py`, docs/LEARNING.md) in pieces:

- `config`: the command line, the kind groups, the modes, the CPU smoke sizes;
- `stages`: SFT, trajectories and their evaluation, bandit and offline rows, one training mode;
- `seed_run`: one seed in one process, every phase in turn, its result JSON rewritten after each;
- `parallel`: several seeds as processes at once on one machine, a deadline, then the aggregate.

The statistics and the report are library code: `cobalt.analysis.learning` (seed results ->
intervals, differences, verdicts) and `cobalt.analysis.learning_report` (REPORT.md, plots).
"""
