"""Running a training job in this process or on several, through `accelerate launch`.

`run_job(job)` trains (GRPO, or the offline objective in offline mode) in this process when
the job has one process in all, on a CPU. Otherwise it writes the job, with the run's GPU plan
(`cobalt.training.machinery.plan`), to a JSON file and starts what the plan says:

    accelerate launch --config_file infra/accelerate/SHARDING.yaml --num_processes N \
        --mixed_precision bf16|no -m cobalt.training.launch JOB

TRL's own multi-process path: every process (one per GPU; on a machine without one, CPU
processes over gloo) runs `cobalt.training.grpo.train` on its share of each batch with its own
sandbox pool for the rewards (the machine's sandbox concurrency divided among them), gradients
are averaged (ddp) or the model is sharded over the processes (fsdp, zero3:
`cobalt/training/machinery/sharding.py`), and the main process saves the model, uploads checkpoints
and writes the log history and step timing this process reads back. `config.accelerate_config` names
an accelerate config file of the user's instead (docs/TRAINING.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from cobalt.bandit.dataset import BanditRef, read_bandit_rows
from cobalt.judging import SandboxRuntime
from cobalt.storage import Logger, StorageConfig, open_storage
from cobalt.training.machinery.launch_log import why_it_failed
from cobalt.training.machinery.plan import TrainingPlan, plan_training
from cobalt.training.machinery.sharding import hybrid_env
from cobalt.training.machinery.vllm_server import (
    START_TIMEOUT_S,
    generation_server,
    split_gpus,
    visible_gpu_ids,
    vllm_cache_root,
)
from cobalt.training.settings import TrainingConfig
from cobalt.trajectories.problemsets import ProblemSource, load_problems
from engines import visible_gpus
from engines.cpu_threads import cap_cpu_threads
from engines.serving import stop

log = logging.getLogger(__name__)
LAUNCH_DIR = ".launch"  # inside the output directory: the job, each process's log, the results


class Job(BaseModel):
    """One training run: what it trains on and where it writes."""

    model_config = ConfigDict(extra="forbid")

    config: TrainingConfig
    dataset: BanditRef
    storage: StorageConfig
    sandbox: SandboxRuntime
    model: str
    output_dir: str
    upload_dir: str | None = None  # checkpoints uploaded here as they are saved (S3 runs)
    launch_dir: str | None = None  # the job file, logs and result (default output_dir/.launch)
    problems: ProblemSource | None = None  # multi_turn: whose public tests give the feedback
    plan: TrainingPlan | None = None  # None: planned for this machine when the job runs


class LaunchError(RuntimeError):
    """The launched training processes failed; the message holds the end of their output."""


Result = tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]


def run_job(job: Job, logger: Logger = log) -> Result:
    """Train (GRPO, or the offline objective in offline mode); return the trainer's log history,
    the step timing (StepTimer.summary) and what the trainer reports (rows, numerics, memory).

    On a GPU the training runs in a process of its own, also with one process: its model, optimizer
    and colocated vLLM engine are handed back to the GPU when it exits, so the stages after it (the
    evaluation's vLLM engine) find the memory free (in the same process they did not). With several
    GPUs one process is launched too: the Trainer would otherwise wrap the model in nn.DataParallel,
    which GRPO does not support."""
    if job.plan is None:
        job = job.model_copy(update={"plan": plan_training(job.config, job.model)})
    if job.config.world() == 1 and not _on_gpu():
        return train_here(job)
    return launch(job, logger)


def _on_gpu() -> bool:
    return "LOCAL_RANK" not in os.environ and visible_gpus() > 0


def train_here(job: Job, processes: int = 1) -> Result:
    """This process's part of the job (all of it when it runs alone)."""
    cap_cpu_threads()  # torch's CPU threads: a few, not one per core (engines.cpu_threads)
    from cobalt.training.grpo import train
    from cobalt.training.machinery.checkpoints import (
        SHARED_WAIT_S,
        shared_directory_check,
        uploader,
    )
    from cobalt.training.offline import train_offline
    from cobalt.training.reporting.step_timing import StepTimer

    share = max(1, job.sandbox.concurrency // processes)
    config = job.config.model_copy(
        update={"sandbox": job.sandbox.model_copy(update={"concurrency": share}).config()}
    )
    rows = read_bandit_rows(job.dataset, job.storage)
    output = Path(job.output_dir)
    callbacks: list[Any] = [StepTimer()]
    if job.upload_dir:
        callbacks.append(
            uploader(
                open_storage(job.storage),
                output,
                job.upload_dir,
                job.config.node_rank,
                job.config.nodes,
            )
        )
    elif job.config.nodes > 1 and job.storage.is_local and job.storage.shared:
        # the nodes have met already: their files show within NFS's cache time, or never
        wait = min(SHARED_WAIT_S, job.config.rendezvous_timeout_s)
        callbacks.append(
            shared_directory_check(output, job.config.node_rank, job.config.nodes, wait)
        )
    extra: dict[str, Any] = {}
    with callbacks[0] as timer:
        if config.mode == "offline":
            run = train_offline(config, rows, job.model, output, callbacks=callbacks, plan=job.plan)
            history = run.history
            extra = {
                "rows_trained": run.rows,
                "dropped_zero_advantage": run.dropped_zero_advantage,
                "dropped_too_long": run.dropped_too_long,
                "dropped_empty": run.dropped_empty,
                "reference_logprobs_s": run.reference_logprobs_s,
                "numerics": run.numerics,
            }
        else:
            problems = load_problems(job.problems, job.storage) if job.problems else None
            run = train(
                config,
                rows,
                job.model,
                output,
                callbacks=callbacks,
                problems=problems,
                plan=job.plan,
            )
            history = run.history
            extra = {"numerics": run.numerics, "memory_plan": run.plan}
            extra["format_reward"] = run.format_reward
            if run.overlap:
                extra["overlap"] = run.overlap
    return history, timer.summary(), extra


def launch_command(job_file: Path, plan: TrainingPlan, port: int | None = None) -> list[str]:
    """`accelerate launch` of the job as its plan says: the accelerate config (the sharding's
    from infra/accelerate, or the user's), the process count and the mixed precision given over
    the file's values; one process stays on the first GPU it was given. One node: its processes
    meet at `port` on this host (None: a free one)."""
    command = [sys.executable, "-m", "accelerate.commands.launch"]
    if plan.accelerate_config:
        command += ["--config_file", plan.accelerate_config]
    else:
        command += ["--gpu_ids", _first_gpu(), "--num_machines", "1", "--dynamo_backend", "no"]
    command += ["--mixed_precision", plan.mixed_precision]
    command += ["--num_processes", str(plan.processes)]
    if plan.nodes > 1:  # torch's elastic launcher, static rendezvous at node 0's endpoint
        host, _, port = (plan.rdzv_endpoint or "").rpartition(":")
        command += ["--num_machines", str(plan.nodes), "--machine_rank", str(plan.node_rank)]
        command += ["--main_process_ip", host, "--main_process_port", port]
        command += ["--rdzv_conf", f"timeout={plan.rendezvous_timeout_s}"]
    else:
        command += ["--main_process_port", str(port or _free_port())]
    return [*command, "-m", "cobalt.training.launch", str(job_file)]


def one_node_env(environ: dict[str, str], port: int) -> dict[str, str]:
    """The launched processes' rendezvous on one node: this host at the launch's own free
    `port`, whatever MASTER_ADDR / MASTER_PORT the caller's environment holds. accelerate sets
    them for several processes only; one process keeps the inherited ones, and its colocated
    vLLM starts a process group there: two one-GPU jobs on one host with MASTER_PORT=29500
    inherited collided (EADDRINUSE) at vLLM's start-up."""
    return {**environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def launch(job: Job, logger: Logger = log) -> Result:
    """Run the job on `num_processes` processes and wait; LaunchError if any of them fails.
    A job whose plan has a vLLM server of its own (`server_gpus`) starts it on the GPUs after
    the processes', and the processes while it starts (they wait for it once loaded); a server
    that exits stops them; it is stopped after (cobalt.training.machinery.vllm_server)."""
    work = Path(job.launch_dir or Path(job.output_dir, LAUNCH_DIR))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    assert job.plan is not None
    if not job.plan.server_gpus:
        return _launch(job, work, dict(os.environ), logger)
    training, serving = split_gpus(
        visible_gpu_ids(dict(os.environ), job.plan.gpus), job.plan.processes, job.plan.server_gpus
    )
    kwargs = job.config.grpo_kwargs("plan", job.model, job.plan.gpus)
    logger.info("vLLM server for generation on GPU(s) %s, training on %s", serving, training)
    with generation_server(
        job.model,
        serving,
        work,
        max_model_len=kwargs.get("vllm_max_model_length"),
        quantization="fp8" if job.config.fp8_generation else None,
        kv_cache_dtype="fp8" if job.config.fp8_kv_cache else None,
        wait=False,
    ) as server:
        # the processes see a server at a URL (TRL's server mode), its weight group on a port
        # of this run's (TRL's fixed 51216 would collide with another run's on this host); they
        # load their model while it starts, then wait for it up to vLLM's start-up time
        overrides = {
            "vllm_group_port": _free_port(),
            "vllm_server_timeout": START_TIMEOUT_S,
            **job.config.overrides,
        }
        config = job.config.model_copy(
            update={
                "generation": "vllm_server",
                "vllm_server_base_url": server.url,
                "vllm_server_gpus": 0,
                "overrides": overrides,
            }
        )
        environ = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(training)}
        try:
            return _launch(
                job.model_copy(update={"config": config}), work, environ, logger, server.exited
            )
        except LaunchError as exc:
            raise LaunchError(f"{exc}\nthe vLLM server's log: {work / 'vllm-server.log'}") from None


def _launch(
    job: Job,
    work: Path,
    environ: dict[str, str],
    logger: Logger,
    beside: Callable[[], str | None] | None = None,
) -> Result:
    """`launch`'s processes in `environ`; `beside()` (a server of the job's) says why the
    training cannot go on, else None: then the processes are stopped and LaunchError says it."""
    assert job.plan is not None
    job_file = work / "job.json"
    job_file.write_text(job.model_dump_json(indent=1))
    port = _free_port() if job.plan.nodes == 1 else None
    command = launch_command(job_file, job.plan, port)
    logger.info("training on %d processes: %s", job.config.num_processes, " ".join(command))
    output = work / "launch.log"
    env = {**environ, "PYTHONPATH": os.pathsep.join(filter(None, [_root(), _pythonpath()]))}
    if port is not None:
        env = one_node_env(env, port)
    if job.plan.sharding == "hybrid":  # the 2-D mesh: nodes replicate, a node's GPUs shard
        env |= hybrid_env(job.plan.nodes, job.plan.per_node)
    with output.open("wb") as sink:
        code = run_watched(command, env, sink, beside, job.config.num_processes)
    result = work / "result.json"
    if code != 0 or not result.exists():
        text = output.read_text(errors="replace")
        first = why_it_failed(text, job.plan, job.config.collective_timeout_s, output)
        raise LaunchError(
            f"training on {job.config.num_processes} processes failed ({code}): "
            f"{first}\n{text[-4000:]}"
        )
    found = json.loads(result.read_text())
    return found["history"], found["timing"], found["extra"]


def run_watched(
    command: list[str],
    env: dict[str, str],
    sink: Any,
    beside: Callable[[], str | None] | None,
    processes: int,
    poll_s: float = 1.0,
) -> int:
    """Run the launcher to its end and return its exit code; every `poll_s`, `beside()` (None:
    nothing to watch): once it says why training cannot go on, the launcher and every process
    under it are stopped and LaunchError says why. Stopped also when this process is
    interrupted (as subprocess.call does)."""
    proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        while True:
            try:
                return proc.wait(timeout=poll_s if beside else None)
            except subprocess.TimeoutExpired:
                assert beside is not None
                failed = beside()
                if failed:
                    stop(proc)
                    raise LaunchError(
                        f"training on {processes} processes stopped: {failed}"
                    ) from None
    except BaseException:
        stop(proc)
        raise


def _first_gpu() -> str:
    """The GPU a one-process launch runs on: the first this process may use. accelerate sets
    CUDA_VISIBLE_DEVICES to `--gpu_ids`, so a plain "0" would move a job pinned to another card
    (CUDA_VISIBLE_DEVICES=1) onto card 0."""
    return visible_gpu_ids(dict(os.environ), 1)[0]


def _root() -> str:
    return str(Path(__file__).resolve().parents[2])  # the checkout holding cobalt/


def _pythonpath() -> str:
    return os.environ.get("PYTHONPATH", "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    """One launched process: its part of the job; the main process writes the result."""
    args = sys.argv[1:] if argv is None else argv
    job_file = Path(args[0])
    job = Job.model_validate_json(job_file.read_text())
    processes, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    print(f"cobalt.training.launch: process {rank} of {processes} starts", flush=True)
    if (
        rank == 0
    ):  # the launch log shows each step as it ends (cobalt.training.reporting.step_timing)
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("cobalt").setLevel(logging.INFO)
    _die_with_launcher()
    _indexed_cpu_locations()
    _own_gpu()
    _vllm_cache_per_device()
    _cpu_group(processes, job.config.collective_timeout_s)
    history, timing, extra = train_here(job, processes)
    peaks = _peaks(processes)  # every process takes part (a collective)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # each node's own result (the same history)
        if peaks:  # the parent's meter cannot see these processes' memory
            extra["gpu_peak_memory_gib"] = max(p[0] for p in peaks)
            extra["gpu_peak_reserved_gib"] = max(p[1] for p in peaks)
            extra["gpu_peaks_by_process_gib"] = peaks
        result = {"history": history, "timing": {**timing, "processes": processes}, "extra": extra}
        (job_file.parent / "result.json").write_text(json.dumps(result, indent=1))
    _leave_group()
    return 0


def _leave_group() -> None:
    """Every process leaves the process group together: on several nodes, node 0 hosts the
    rendezvous store, and a process still using it when node 0's exits would abort."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _die_with_launcher() -> None:
    """End this process when its launcher does (Linux: PR_SET_PDEATHSIG). torch's elastic agent
    starts every training process in a session of its own, so a launcher killed with SIGKILL
    (a crash, the job's time limit) would leave them training, holding the GPUs and writing
    checkpoints beside the run that resumes."""
    import ctypes
    import signal

    if not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != launcher:  # it died before the call
        os._exit(1)


def _own_gpu() -> None:
    """Make this process's GPU (LOCAL_RANK) the current one before anything touches CUDA: the
    memory plans measure the current GPU before the trainer sets it, and every process would
    otherwise open a context on GPU 0 and measure that one."""
    import torch

    if torch.cuda.is_available() and "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


def _vllm_cache_per_device() -> None:
    """This process's vLLM cache under its own GPU's index (vllm_cache_root), set before vLLM is
    imported; the launcher's environment, and so the next launch's, keeps the user's value."""
    import torch

    if torch.cuda.is_available():
        os.environ["VLLM_CACHE_ROOT"] = vllm_cache_root(torch.cuda.current_device(), os.environ)


def _cpu_group(processes: int, timeout_s: int) -> None:
    """CPU processes' group (gloo) with the collective timeout: transformers gives its timeout
    (`ddp_timeout`) to GPU process groups only, and gloo's own default is 30 minutes. GPU groups
    are made by accelerate with it."""
    import datetime

    import torch
    import torch.distributed as dist

    if processes > 1 and not torch.cuda.is_available() and not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))


def _indexed_cpu_locations() -> None:
    """Let torch.load restore tensors to "cpu:N": transformers maps a resumed optimizer state to
    `args.device`, which is torch.device("cpu", rank) in CPU processes (gloo), a location torch
    does not know (RuntimeError: don't know how to restore data location ... cpu:0)."""
    import torch.serialization

    def restore(obj: Any, location: str) -> Any:
        return obj if location.startswith("cpu:") else None

    torch.serialization.register_package(95, lambda obj: None, restore)  # after the built-ins


def _peaks(processes: int) -> list[list[float]]:
    """[allocated, reserved] peak GiB of the PyTorch allocator in each process (its GPU), for
    all processes; [] on CPU. A colocated vLLM's sleep-mode pool counts whole in it even while
    asleep (158 GiB on a 141 GiB H200 at verl's 8B shape): the card's own peak is NVML's
    (`cost.gpu_peak_used_gib`, nvidia-smi in scripts/gpu)."""
    import torch

    if not torch.cuda.is_available():
        return []
    mine = [
        round(torch.cuda.max_memory_allocated() / 2**30, 2),
        round(torch.cuda.max_memory_reserved() / 2**30, 2),
    ]
    if processes == 1 or not torch.distributed.is_initialized():
        return [mine]
    everyone: list[Any] = [None] * processes
    torch.distributed.all_gather_object(everyone, mine)
    return everyone


if __name__ == "__main__":
    sys.exit(main())
