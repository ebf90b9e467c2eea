"""One seed of the learning check in this process: SFT, reference trajectories, bandit and
offline rows, evaluation of the SFT model, then every mode (training + evaluation) in turn. The
result, `<out>/runs/<label>.json` (`results.SeedResult`), is rewritten after every phase, so a
stopped run keeps what it finished. A mode whose training fails (a non-finite bf16 step:
`NonFiniteError`; anything else) is recorded as data and the seed goes on; a mode that would not
finish before `--deadline-at` is skipped.

Determinism: every sampler is seeded from the seed (SFT data order and initialisation, the
trajectories' sampling, bandit shuffling, GRPO and offline data order and sampling, evaluation
sampling), and torch runs with `use_deterministic_algorithms(True, warn_only=True)` (without
`warn_only` under strict determinism, the default on a GPU) and
`CUBLAS_WORKSPACE_CONFIG=:4096:8` (set by the parent before torch starts). Fingerprints of every
model's weights and of every generated text show where two runs of one seed part.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import logging
import os
import platform
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from engines import visible_gpus
from experiments.learning_check import results, stages, training
from experiments.learning_check.config import MODES, SHORT, as_json, cpus, mode_list, offline_twins
from experiments.learning_check.kinds import GROUPS, KIND_GROUPS

log = logging.getLogger("learning_check")


def _determinism(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import set_seed

    set_seed(args.seed)
    chosen = getattr(args, "strict_determinism", None)
    gpu = visible_gpus() > 0 if args.device == "auto" else args.device.startswith("cuda")
    strict = gpu if chosen is None else bool(chosen)
    if getattr(args, "generation", "transformers").startswith("vllm"):
        strict = False  # vLLM's compiled graphs have no deterministic variant
    if not args.no_deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=not strict)
        # not the NaN fill of every torch.empty that comes with it: a cost on every allocation,
        # and no part of determinism for code that writes what it allocates
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "strict": torch.are_deterministic_algorithms_enabled()
        and not torch.is_deterministic_algorithms_warn_only_enabled(),
        "strict_source": "default (on for a GPU, off on CPU)" if chosen is None else "flag",
        "generation": getattr(args, "generation", "transformers"),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "torch_threads": torch.get_num_threads(),
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
    }


CODE = (
    "cobalt.reference",
    "cobalt.trajectories.evaluation",
    "cobalt.trajectories.collect",
    "cobalt.bandit.rows",
    "cobalt.training.settings",
    "cobalt.training.grpo",
    "cobalt.training.method.sandbox_reward",
    "cobalt.training.machinery.weights",
    "cobalt.training.offline",
    "cobalt.training.method.offline_rows",
    "experiments.learning_check.kinds",
    "experiments.learning_check.config",
    "experiments.learning_check.stages",
    "experiments.learning_check.training",
    "experiments.learning_check.seed_run",
)


def _code_version() -> str | None:
    """A hash of the source of the modules a run's numbers come from: two runs of one seed with
    different hashes ran different code (the same-seed section of the report says so)."""
    from cobalt.storage import code_version

    try:
        return code_version(*CODE)
    except (ImportError, OSError, TypeError):
        return None


class SeedRun:
    """The seed's result document and its phases (timing, GPU memory, rewrite after each)."""

    def __init__(self, args: argparse.Namespace):
        import torch
        import transformers
        import trl

        self.args = args
        self.torch = torch
        self.path = results.result_path(args.out, args.label)
        self.started = time.perf_counter()
        self.cuda = args.device.startswith("cuda")
        self.doc: results.SeedResult = {
            "check": results.CHECK,
            "version": results.VERSION,
            "seed": args.seed,
            "label": args.label,
            "status": "running",
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": {
                "device": torch.cuda.get_device_name(0) if self.cuda else "cpu",
                "cpus": cpus(),
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "trl": trl.__version__,
                "code": _code_version(),
            },
            "settings": as_json(args),
            "groups": GROUPS,
            "kinds": {g: list(k) for g, k in KIND_GROUPS.items()},
            "modes": mode_list(args),
            "determinism": _determinism(args),
            "training": {},
            "evaluation": {},
            "fingerprints": {},
            "gpu_memory_gib": {},
            "phases_s": {},
        }

    def save(self) -> None:
        self.doc["wall_s"] = round(time.perf_counter() - self.started, 1)
        results.write(self.path, self.doc)

    def begin(self) -> float:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()  # raises if CUDA is broken: the seed stops
        return time.perf_counter()

    def end(self, name: str, t0: float) -> float:
        seconds = round(time.perf_counter() - t0, 2)
        self.doc["phases_s"][name] = seconds
        gc.collect()
        if self.cuda:
            try:  # a CUDA error in the phase (a device-side assert) leaves CUDA unusable
                peak = self.torch.cuda.max_memory_reserved() / 2**30
                self.doc["gpu_memory_gib"][name] = round(peak, 2)
                self.torch.cuda.empty_cache()
            except RuntimeError as exc:
                self.doc.setdefault("cuda_errors", {})[name] = str(exc)[:500]
        log.info("%s: %s done in %.1f s", self.args.label, name, seconds)
        self.save()
        return seconds


def run_seed(args: argparse.Namespace) -> int:
    """The whole seed; the exit status is 0 when the SFT model and at least its evaluation
    finished."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "sandbox", "datasets", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.device == "auto":
        args.device = "cuda" if visible_gpus() > 0 else "cpu"
    run = SeedRun(args)
    run.save()
    work = (args.work / args.label) if args.work else Path(tempfile.mkdtemp(prefix="lc-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        phases(run, args, work)
        run.doc["status"] = "done"
    except BaseException as exc:
        run.doc["status"] = "failed"
        run.doc["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        run.doc["traceback"] = traceback.format_exc()[-4000:]
        run.save()
        raise
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    run.save()
    return 0


def phases(run: SeedRun, args: argparse.Namespace, work: Path) -> None:
    from sandbox import SyncJudge

    doc = run.doc
    t0 = run.begin()
    sft = work / "sft"
    doc["sft"] = stages.fit(args, sft, args.device)
    doc["fingerprints"]["sft_weights"] = stages.weights_fingerprint(sft)
    run.end("sft", t0)

    reference = stages.rl_problems(args)
    evaluation = stages.eval_problems(args)
    with SyncJudge(stages.sandbox_config(args)) as judge:
        doc["sandbox_backend"] = judge.backend_name
        t0 = run.begin()
        records, evals, stats = stages.rollout(
            sft, reference, args, judge, work / "reference", args.n, args.seed
        )
        doc["reference"] = stages.evaluation_result(reference, records, evals, stats)
        doc["fingerprints"]["reference_texts"] = doc["reference"]["fingerprint"]
        rows, doc["bandit"] = training.bandit_dataset(reference, records, evals, sft, args.seed)
        offline_rows, doc["offline"] = training.offline_dataset(reference, records, evals)
        run.end("reference_trajectories", t0)

        def evaluate(name: str, model: Path) -> float:
            t0 = run.begin()
            records, evals, stats = stages.rollout(
                model, evaluation, args, judge, work / f"eval-{name}", args.eval_n, args.seed + 7
            )
            doc["evaluation"][name] = stages.evaluation_result(evaluation, records, evals, stats)
            doc["fingerprints"][f"eval_{name}_texts"] = doc["evaluation"][name]["fingerprint"]
            return run.end(f"evaluate_{name}", t0)

        eval_s = evaluate("sft", sft)
        if not rows:
            doc["training"]["note"] = (
                "the bandit dataset is empty (every reference sample of every RL problem passed "
                "at turn 0): nothing to train on"
            )
            return
        run_modes(run, args, work, rows, offline_rows, sft, evaluate, eval_s, reference)


def run_modes(
    run: SeedRun,
    args: argparse.Namespace,
    work: Path,
    rows: list[dict[str, Any]],
    offline_rows: list[dict[str, Any]],
    sft: Path,
    evaluate: Any,
    eval_s: float,
    problems: list[Any] | None = None,
) -> None:
    """Every mode in turn: training, fingerprint, evaluation. offline_grpo reuses the weights
    of the offline mode it would retrain (`reusable`): that mode's directory is kept until
    offline_grpo has run."""
    doc = run.doc
    modes = mode_list(args)
    spent: list[float] = []  # GRPO modes: training + evaluation, seconds
    kept: list[Path] = []  # offline_grpo's possible offline phases, removed after it
    for i, mode in enumerate(modes):
        kind = MODES[mode][0]
        reuse = reusable(doc, args, work) if kind == "offline_grpo" else None
        if too_late(
            time.time(),
            spent,
            eval_s,
            args.deadline_at,
            kind,
            grpo_share(args, kind),
            offline_reused=reuse is not None,
        ):
            doc["training"][mode] = {"outcome": "skipped", "reason": "deadline"}
            log.warning("%s: %s skipped (deadline)", args.label, mode)
            run.save()
            continue
        t_mode = time.perf_counter()
        out_dir = work / f"rl-{mode}"
        t0 = run.begin()
        doc["training"][mode] = train(mode, rows, offline_rows, sft, args, out_dir, reuse, problems)
        run.end(f"train_{mode}", t0)
        if kind == "offline_grpo" and not args.work:
            for path in kept:
                shutil.rmtree(path, ignore_errors=True)
            kept.clear()
        if doc["training"][mode]["outcome"] != "completed":
            continue
        doc["fingerprints"][f"{mode}_weights"] = stages.weights_fingerprint(out_dir)
        if kind == "offline_grpo":
            same_phase(doc, mode)
        evaluate(mode, out_dir)
        if not args.work:
            later = "offline_grpo" in modes[i + 1 :]
            if later and mode in offline_twins(args.offline_objective):
                kept.append(out_dir)  # offline_grpo starts from these weights
            else:
                shutil.rmtree(out_dir, ignore_errors=True)
        if kind == "grpo":
            spent.append(time.perf_counter() - t_mode)
    if not args.work:
        for path in kept:
            shutil.rmtree(path, ignore_errors=True)


def reusable(
    doc: dict[str, Any], args: argparse.Namespace, work: Path
) -> tuple[str, Path, dict[str, Any]] | None:
    """(mode, weights directory, training record) of an offline mode of this seed run that
    trained exactly offline_grpo's offline phase: the same SFT model and rows (one seed run),
    --offline-objective at the full learning rate, completed, and its directory still holding
    the weights it recorded (the same fingerprint); None when none did (not listed, skipped by
    the deadline, failed): then offline_grpo trains its offline phase itself."""
    lr = args.offline_lr or args.rl_lr
    for mode in offline_twins(args.offline_objective):
        record = doc["training"].get(mode)
        printed = doc["fingerprints"].get(f"{mode}_weights")
        path = work / f"rl-{mode}"
        if not isinstance(record, dict) or record.get("outcome") != "completed" or not printed:
            continue
        if record.get("objective") != args.offline_objective:
            continue
        if record.get("steps") != args.rl_steps or record.get("learning_rate") != lr:
            continue
        if stages.weights_fingerprint(path) == printed:
            return mode, path, record
    return None


def grpo_share(args: argparse.Namespace, kind: str) -> float:
    """The share of a GRPO mode's steps that a mode of this trainer kind runs."""
    if kind == "grpo":
        return 1.0
    if kind == "offline_grpo":
        return args.offline_grpo_steps / max(1, args.rl_steps)
    return 0.0


def same_phase(doc: dict[str, Any], mode: str) -> None:
    """offline_grpo's offline phase is the offline mode of its objective: the same seed, data
    and settings give the same weights (recorded: True / False; None when that mode did not
    run here)."""
    result = doc["training"][mode]
    objective = result.get("objective")
    twins = [
        m
        for m, (kind, _, extra) in MODES.items()
        if kind == "offline" and extra.get("objective") == objective and "lr_scale" not in extra
    ]
    twins += ["offline"] if doc["settings"].get("offline_objective") == objective else []
    printed = [doc["fingerprints"].get(f"{m}_weights") for m in twins]
    printed = [p for p in printed if p]
    result["offline_phase_mode"] = f"offline_{SHORT.get(objective, objective)}"
    result["offline_phase_same_weights"] = (
        all(p == result.get("offline_phase_weights") for p in printed) if printed else None
    )


def too_late(
    now: float,
    spent: list[float],
    eval_s: float,
    deadline_at: float,
    kind: str = "grpo",
    grpo_share: float = 1.0,
    offline_reused: bool = False,
) -> bool:
    """Would the next mode (training + evaluation) end after `deadline_at` (epoch seconds; 0:
    none)? A GRPO mode's cost is guessed as the mean of the GRPO modes done so far (`spent`), or
    2.5 evaluations before any (GRPO trains in about 1.5 evaluations' time); an offline mode,
    which generates nothing, as 2 evaluations (on one H100 with three seeds: ~30 s each);
    offline_grpo as an offline mode plus `grpo_share` of a GRPO mode's training, less the offline
    training (one evaluation's time) when it reuses an offline mode's weights
    (`offline_reused`); with a 10% margin."""
    if not deadline_at:
        return False
    guess = sum(spent) / len(spent) if spent else 2.5 * eval_s
    if kind == "offline":
        estimate = 2.0 * eval_s
    elif kind == "offline_grpo":
        offline = 1.0 if offline_reused else 2.0  # (offline training +) evaluation
        estimate = offline * eval_s + grpo_share * max(0.0, guess - eval_s)
    else:
        estimate = guess
    return now + 1.1 * estimate > deadline_at


def train(
    mode: str,
    rows: list[dict[str, Any]],
    offline_rows: list[dict[str, Any]],
    sft: Path,
    args: argparse.Namespace,
    out_dir: Path,
    reuse: tuple[str, Path, dict[str, Any]] | None = None,
    problems: list[Any] | None = None,
) -> dict[str, Any]:
    """One mode's training; a failure is returned as data (outcome non_finite or failed).
    `reuse`: offline_grpo's offline phase, already trained (`reusable`); `problems`: the RL
    problems (multi_turn's feedback)."""
    from cobalt.training.reporting.guards import NonFiniteError

    trainer, trl_mode, extra = MODES[mode]
    started = time.perf_counter()
    try:
        if trainer == "offline":
            result = training.train_offline_mode(offline_rows, sft, args, out_dir, **extra)
            result["mode"] = mode
        elif trainer == "offline_grpo":
            result = training.train_offline_then_grpo(
                offline_rows, rows, sft, args, out_dir, reuse=reuse
            )
        else:
            result = training.train_mode(
                trl_mode, rows, sft, args, out_dir, extra, problems=problems
            )
    except NonFiniteError as exc:
        log.warning("%s: %s stopped on a non-finite step: %s", args.label, mode, exc)
        return {"outcome": "non_finite", "error": str(exc)[:2000], "wall_s": _since(started)}
    except Exception as exc:
        log.exception("%s: %s failed", args.label, mode)
        return {
            "outcome": "failed",
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "traceback": traceback.format_exc()[-3000:],
            "wall_s": _since(started),
        }
    return {"outcome": "completed", **result}


def _since(t0: float) -> float:
    return round(time.perf_counter() - t0, 2)
