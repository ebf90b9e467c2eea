"""Training: the bandit dataset (or the logged turns) into a trained policy, in rooms a reader can
find by what they hold, each importing only the rooms above it in this list
(tests/test_layers.py):

- `method/`: what the paper defines, plain functions where it can be: the Cobalt reward
  (`cobalt_reward`), the sandbox's rewards as TRL reward callables (`sandbox_reward`) and the dense
  option (`dense_reward`), the k2 KL (`k2_kl`), the offline objectives with AWR
  (`offline_objectives`) and their rows (`offline_rows`), the multi-turn rollout
  (`multiturn_rollout`), and what each preset decides (`preset_defaults`);
- `decisions`: what a run decides from its settings and the machine, each once: the GPU count,
  the numerics, the sharding, the batch's divisibility;
- `settings`: every training setting (`TrainingConfig`), validated before any work;
- `machinery/`: what runs the method at scale: the run's plan (`plan`, made once and handed to
  every process), memory and activations, numerics applied to a model (`precision`, `weights`),
  sharding configs, checkpoints, the padded / trimmed / packed passes, one-step-off generation,
  the vLLM server, the collectives' accounting, and TRL's private surface (`trl_trainer`);
- `reporting/`: what a run tells: the non-finite guard, step timing, cost, curves, the console,
  the phases;
- the assembly: the trainers (`grpo`, `offline`), the launch on one or several processes
  (`launch`) and the stage in storage (`stages`).
"""
