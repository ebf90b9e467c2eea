"""The embedded default's reference model: its recipe, a tiny chat model fitted on CPU to the
synthetic problem family (`cobalt.data.synthetic`), and `python -m cobalt.reference` (fit it where
the pipeline's defaults keep it). How a model is named ('fitted', 'tiny', a directory, a storage
URI, a Hub id) and resolved is `cobalt/models.py`, which resolves 'fitted' with `fit_embedded` here.

`fit_tiny_model(path)` builds a Qwen2-shaped model of about 1M parameters with `engines.tiny`
(its BPE tokenizer trained on the built-in corpus plus the synthetic prompts, programs and the
pipeline's feedback turns), then fits it with TRL's `SFTTrainer` on problems of the seen kinds in
the conversations the pipeline shows it with `system_prompt=''` (instruction -> one line of
reasoning and the reference program; a quarter of them after a repair: a wrong program and the
sandbox's feedback words; independently a quarter after the right program and the all-passed
feedback, once or, for the embedded default, twice: the evaluation's second feedback turn follows
two passes), stopping after `max_steps` optimizer steps or a wall-time budget, and saves model
and tokenizer (loaded and saved as every trainer does: `cobalt.training.machinery.weights`). A
`fitted_recipe.json` records the recipe and its `stats`; a second call with the same recipe
returns the saved model at once.

The weights are the same for any thread count on one kind of CPU, not on every CPU: the code path
torch and MKL pick for the CPU's instruction set (AVX2, AVX-512) rounds differently, and 240 steps
carry that into different weights (docs/RESULTS.md, the fitted reference model).
`stats.weights_sha256` names the build (`cobalt.models.build_of`, logged when a flow resolves
'fitted'); a comparison across machines carries one build's directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import time
from pathlib import Path

from cobalt.models import FITTED, RECIPE_FILE, TINY, resolve_model, weights_digest

log = logging.getLogger(__name__)

RECIPE_VERSION = 2
FIT_STEPS = 240
# passed-feedback rounds a kept answer may get in the embedded fit's SFT corpus: the evaluation's
# 2 feedback turns reach a context where the public tests passed twice
FIT_KEEP_ROUNDS = 2
# share of the embedded fit's SFT rows that end with the right program kept after the passed
# feedback: half (a quarter before) keeps the trained policy from rewriting a passing program
# when told to look for edge cases (docs/RESULTS.md, earlier settings: the fourth round)
FIT_KEEP_SHARE = 0.5
FIT_SECONDS_CAP = 900  # the fit stops here even short of its steps (a very slow machine)


def planned_parameters(reference: str) -> int | None:
    """Parameters of the model 'fitted' or 'tiny' names, from the shape it is built with (known
    before it is built: the engine choice of a run's printed settings); None for a directory
    (its config.json tells)."""
    import inspect

    from engines.auto import count_parameters
    from engines.tiny import build_tiny_model, tiny_config

    builder = {FITTED: fit_tiny_model, TINY: build_tiny_model}.get(reference)
    if builder is None:
        return None
    defaults = inspect.signature(builder).parameters
    return count_parameters(tiny_config(**{k: defaults[k].default for k in SHAPE}))


def _embedded(fit_steps: int) -> dict:
    return {"seed": 0, "seconds_budget": FIT_SECONDS_CAP, "max_steps": fit_steps,
            "keep_rounds": FIT_KEEP_ROUNDS, "keep_share": FIT_KEEP_SHARE}  # fmt: skip


def fit_embedded(path: str | Path, fit_steps: int = FIT_STEPS) -> Path:
    """The embedded default's reference: `fit_tiny_model` with the pipeline's recipe."""
    return fit_tiny_model(path, **_embedded(fit_steps))


def embedded_recipe_hash(fit_steps: int = FIT_STEPS) -> str:
    """The recipe hash of the embedded default's reference, without fitting it (what a
    measurement of the default names its reference by)."""
    import inspect

    bound = inspect.signature(fit_tiny_model).bind("model", **_embedded(fit_steps))
    bound.apply_defaults()
    return _recipe_of(bound.arguments)["hash"]


def _recipe_of(a: dict) -> dict:
    """The recipe (and its hash) of `fit_tiny_model`'s arguments `a`: what decides the model."""
    from cobalt.data import synthetic

    held = tuple(synthetic.HELD_OUT if a["held_out"] is None else a["held_out"])
    family = tuple(synthetic.KINDS if a["kinds"] is None else a["kinds"])
    return _recipe(
        seed=a["seed"],
        seconds_budget=a["seconds_budget"],
        **({} if a["max_steps"] is None else {"max_steps": a["max_steps"]}),
        n_examples=a["n_examples"],
        held_out=list(held),
        # only when not the default, so that the default's recipe hash (and model) stay
        **({} if family == synthetic.KINDS else {"kinds": list(family)}),
        **{k: a[k] for k in _RECIPE_FIELDS},
        **({} if a["keep_rounds"] == 1 else {"keep_rounds": a["keep_rounds"]}),
        batch_size=a["batch_size"],
        max_epochs=a["max_epochs"],
        **({} if a["device"] == "cpu" else {"device": a["device"]}),
        **({} if a["save_dtype"] == "float32" else {"save_dtype": a["save_dtype"]}),
    )


# the model's shape (engines.tiny.tiny_config's arguments)
SHAPE = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
)
_RECIPE_FIELDS = (
    *SHAPE,
    "learning_rate",
    "repair_share",
    "keep_share",
)


def _recipe(**kwargs) -> dict:
    # "builder" names the recipe (its module before cobalt/ existed): kept, so models fitted
    # before the move are still found
    recipe = {"builder": "engines.fitted.fit_tiny_model", "version": RECIPE_VERSION, **kwargs}
    blob = json.dumps(recipe, sort_keys=True).encode()
    recipe["hash"] = hashlib.sha256(blob).hexdigest()[:16]
    return recipe


def cached_recipe(path: str | Path) -> dict | None:
    """The recipe of the fitted model saved in `path`, or None when there is none."""
    path = Path(path)
    try:
        recipe = json.loads((path / RECIPE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not (path / "config.json").exists() or not (path / "tokenizer.json").exists():
        return None
    return recipe


def fit_tiny_model(
    path: str | Path,
    seed: int = 0,
    seconds_budget: float = 60.0,
    max_steps: int | None = None,
    *,
    n_examples: int = 3000,
    held_out: tuple[str, ...] | None = None,
    kinds: tuple[str, ...] | None = None,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    learning_rate: float = 3e-3,
    repair_share: float = 0.25,
    keep_share: float = 0.25,
    keep_rounds: int = 1,
    batch_size: int = 8,
    max_epochs: int = 50,
    threads: int | None = None,
    device: str = "cpu",
    save_dtype: str = "float32",
) -> Path:
    """Fit (or reuse) the tiny model in `path`; returns `path`. `device`: "cpu" (the default,
    float32) or "cuda" (bf16 mixed precision; part of the recipe, so not the CPU model's hash).
    `kinds`: the family it is fitted on, minus `held_out` (default: the 30 `synthetic.KINDS`;
    the learning check passes `synthetic.ALL_KINDS`); the tokenizer's corpus covers all of them.
    `save_dtype`: the dtype of the saved weights ("bfloat16": a checkpoint as the paper's models
    ship, which training must not train in pure bf16; cobalt.training.machinery.precision)."""
    from cobalt.data import synthetic

    arguments = dict(locals())
    path = Path(path)
    held = tuple(synthetic.HELD_OUT if held_out is None else held_out)
    family = tuple(synthetic.KINDS if kinds is None else kinds)
    recipe = _recipe_of(arguments)
    cached = cached_recipe(path)
    if cached is not None and cached.get("hash") == recipe["hash"]:
        return path

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from cobalt.training.decisions import Numerics
    from cobalt.training.machinery.weights import (
        load_policy,
        load_tokenizer,
        numerics_for,
        save_policy,
    )
    from cobalt.training.reporting.guards import NonFiniteGuard
    from cobalt.trajectories.prompts import failed_feedback, passed_feedback
    from engines.cpu_threads import cap_cpu_threads
    from engines.tiny import build_tiny_model, builtin_corpus

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if threads:
        torch.set_num_threads(threads)
    else:  # a ~1M-parameter model: a few threads, not one per core (engines.cpu_threads)
        cap_cpu_threads()
    started = time.monotonic()

    kinds = synthetic.seen_kinds(held, family)
    problems = synthetic.make_problems(kinds, n_examples, seed=seed)
    rng = random.Random(seed)
    rows = [conversation(p, kinds, rng, repair_share, keep_share, keep_rounds) for p in problems]
    # the tokenizer sees every kind's text (held-out ones included: only pieces, no pairing)
    corpus = builtin_corpus()
    for kind in family:
        corpus += [synthetic.statement(kind), synthetic.reference_answer(kind)] * 4
    corpus += [failed_feedback("", 0, 2), passed_feedback(2)] * 16
    corpus += [p.instruction for p in problems[:64]]

    path.mkdir(parents=True, exist_ok=True)
    (path / RECIPE_FILE).unlink(missing_ok=True)
    build_tiny_model(
        path,
        seed=seed,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=2048,
        eos_logit=0.0,
        corpus=corpus,
    )
    tokenizer = load_tokenizer(path)
    # the SFT's numerics from the one place that decides them: fp32 on CPU, fp32 master weights
    # with bf16 autocast on a GPU; saved in `save_dtype`
    gpu = device != "cpu"
    numerics = numerics_for("mixed" if gpu else "fp32", path, gpu=gpu, mixed=False)
    numerics = Numerics(**{**numerics.as_dict(), "saved": save_dtype})
    model = load_policy(path, numerics)
    fit_started = time.monotonic()
    budget = max(1.0, seconds_budget - (fit_started - started))

    class _TimeBudget(TrainerCallback):
        """Cosine learning-rate decay over the steps (max_steps) or else the wall time; stop
        at max_steps or when the time budget is spent, whichever comes first."""

        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            elapsed = (time.monotonic() - fit_started) / budget
            frac = elapsed if max_steps is None else state.global_step / max_steps
            if frac >= 1.0 or elapsed >= 1.0:
                control.should_training_stop = True
                return control
            if optimizer is not None:
                warm = min(1.0, (state.global_step + 1) / 20)
                scale = warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate * scale
            return control

    out_dir = path / "_trainer"
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(path / "tensorboard")
    config = SFTConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        num_train_epochs=max_epochs,
        max_length=1024,
        completion_only_loss=True,
        packing=False,
        logging_steps=50,
        save_strategy="no",
        report_to=["tensorboard"],
        use_cpu=device == "cpu",
        **numerics.trainer_kwargs(),
        gradient_checkpointing=False,
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[_TimeBudget(), guard := NonFiniteGuard()],
    )
    result = trainer.train()
    guard.check(numerics.describe() + ".")  # a void step: no model saved
    model = trainer.model
    model.generation_config.do_sample = True
    model.generation_config.temperature = 0.6
    model.generation_config.top_p = 0.95
    save_policy(trainer, path, numerics, tokenizer, lora=False)
    stats = {
        "steps": trainer.state.global_step,
        "train_loss": round(float(result.training_loss), 4),
        "fit_seconds": round(time.monotonic() - fit_started, 1),
        "total_seconds": round(time.monotonic() - started, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "cpu_threads": torch.get_num_threads(),
        "weights_sha256": weights_digest(path),
    }
    log.info("fitted tiny model: %s", stats)
    (path / RECIPE_FILE).write_text(json.dumps({**recipe, "stats": stats}, indent=1) + "\n")

    shutil.rmtree(out_dir, ignore_errors=True)
    return path


def conversation(
    problem,
    kinds: list[str],
    rng: random.Random,
    repair_share: float,
    keep_share: float,
    keep_rounds: int = 1,
) -> dict:
    """One SFT row: the instruction (no system prompt), then the reference answer. With
    probability `repair_share` a repair comes first: a program of another operation on the same
    input format and the feedback turn the sandbox gives on its first failing public test; then,
    with probability `keep_share` (independently: some rows have both, two turns deep), the
    right program and the all-tests-passed feedback before it is given again, 1 to `keep_rounds`
    times (drawn uniformly; with 1 the draw is skipped, so older corpora stay the same)."""
    from cobalt.data import synthetic
    from cobalt.trajectories.prompts import failed_feedback, passed_feedback
    from sandbox.feedback import test_report

    kind = synthetic.kind_of(problem)
    answer = {"role": "assistant", "content": synthetic.reference_answer(kind)}
    prompt = [{"role": "user", "content": problem.instruction}]
    tests = problem.public_tests
    others = [k for k in kinds if k.endswith("/" + kind.split("/")[1]) and k != kind]
    if others and rng.random() < repair_share:
        wrong = rng.choice(others)
        for index, (given, expected) in enumerate(zip(tests.inputs, tests.outputs, strict=True)):
            actual = synthetic.output_of(wrong, given)
            if actual.strip() != expected.strip():
                report = test_report("wrong_answer", given, expected, stdout=actual)
                prompt += [
                    {"role": "assistant", "content": synthetic.reference_answer(wrong)},
                    {"role": "user", "content": failed_feedback(report, index, len(tests.inputs))},
                ]
                break
    if rng.random() < keep_share:
        rounds = 1 if keep_rounds <= 1 else rng.randint(1, keep_rounds)
        passed = {"role": "user", "content": passed_feedback(len(tests.inputs))}
        prompt += [answer, passed] * rounds
    return {"prompt": prompt, "completion": [answer]}


def main(argv: list[str] | None = None) -> int:
    """Fit (or reuse) the embedded reference model where the pipeline's defaults keep it (every
    flow's default storage and work directory, the default fit_steps), then print its directory.
    `make run` runs this beside the Docker engine's and sandbox image's install (the fit needs no
    sandbox); the flow's reference-model task then reuses it."""
    import argparse

    from cobalt.run_settings import ModelRunSettings

    argparse.ArgumentParser(prog="python -m cobalt.reference", description=main.__doc__).parse_args(
        argv
    )
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    defaults = ModelRunSettings()
    print(resolve_model(FITTED, defaults.storage, defaults.work_dir, fit_steps=FIT_STEPS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
