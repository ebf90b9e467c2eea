"""GRPO and the offline trainer on two processes through `accelerate launch` (the multi-GPU path,
here on CPU over gloo): real GRPOTrainer, real sandbox pool per process, the model saved once by
the main process (`cobalt.training.machinery.weights`), the log history and step timing read back; a
failing launch says why."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel
from test_grpo_tiny import rows as rows_of_test

from cobalt.bandit.dataset import BanditRef, commit_rows
from cobalt.bandit.rows import prepare_rows
from cobalt.judging import SandboxRuntime
from cobalt.storage import StorageConfig, open_storage
from cobalt.training.launch import Job, LaunchError, launch_command, run_job
from cobalt.training.machinery.sharding import config_file
from cobalt.training.settings import TrainingConfig

SANDBOX = SandboxRuntime(backend="namespace", concurrency=2)
# a job file's run in a process of its own (another node, or a launcher to kill)
RUN_JOB = (
    "import sys; from cobalt.training.launch import Job, run_job; "
    "run_job(Job.model_validate_json(open(sys.argv[1]).read()))"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bandit_dataset(storage: StorageConfig) -> BanditRef:
    """The test rows as a committed bandit dataset (what the training stage reads)."""
    st = open_storage(storage)
    rows = prepare_rows(rows_of_test(), "cobalt")
    return commit_rows(st, st.path("bandit", "k"), "k", rows, {}, BanditSpecStub())


class BanditSpecStub(BaseModel):
    """What the manifest records as the dataset's spec (hand-made rows have none)."""

    source: str = "tests/training/test_grpo_tiny.py rows()"


def job(tmp_path, model: str, **config) -> Job:
    storage = StorageConfig(url=str(tmp_path / "runs"))
    return Job(
        config=TrainingConfig(preset="tiny", mode="cobalt", **config),
        dataset=bandit_dataset(storage),
        storage=storage,
        sandbox=SANDBOX,
        model=model,
        output_dir=str(tmp_path / "out"),
    )


@pytest.mark.parametrize(
    ("sharding", "kind"), [("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("zero3", "DEEPSPEED")]
)
def test_the_shipped_accelerate_configs_load(sharding: str, kind: str) -> None:
    """accelerate reads each file as the strategy it is named for."""
    from accelerate.commands.config.config_args import load_config_from_file

    loaded = load_config_from_file(str(config_file(sharding)))
    assert loaded.distributed_type.value == kind and loaded.num_machines == 1
    if sharding == "fsdp":
        assert loaded.fsdp_config["fsdp_version"] == 2
        assert loaded.fsdp_config["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    if sharding == "zero3":
        assert loaded.deepspeed_config["zero_stage"] == 3


def test_a_one_process_launch_stays_on_the_card_its_caller_was_given(tmp_path, monkeypatch) -> None:
    """accelerate sets CUDA_VISIBLE_DEVICES to --gpu_ids: a job pinned to card 1 (two jobs on a
    two-GPU worker) must not be moved to card 0."""
    from cobalt.training.machinery.plan import plan_training
    from engines.machine import Machine

    one_gpu = plan_training(TrainingConfig(), None, Machine(1, 80 << 30, "H100", 1 << 40, 16))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    one = launch_command(tmp_path / "job.json", one_gpu)
    assert one[one.index("--gpu_ids") + 1] == "0" and "--multi_gpu" not in one
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    pinned = launch_command(tmp_path / "job.json", one_gpu)
    assert pinned[pinned.index("--gpu_ids") + 1] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e1f,GPU-77aa")
    uuid = launch_command(tmp_path / "job.json", one_gpu)
    assert uuid[uuid.index("--gpu_ids") + 1] == "GPU-5e1f"


def test_a_one_node_launch_meets_at_its_own_port_not_an_inherited_one(
    tmp_path, tiny_model, monkeypatch
) -> None:
    """Two one-GPU jobs on one host inherited MASTER_PORT=29500 and collided (EADDRINUSE) where
    their colocated vLLMs started a process group (accelerate sets the rendezvous for several
    processes only): every one-node launch gives its processes the free port it chose."""
    import cobalt.training.launch as launching
    from cobalt.training.machinery.plan import plan_training
    from engines.machine import Machine

    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("MASTER_ADDR", "10.9.9.9")
    seen = {}

    def run(command, env, *_, **__):  # the launched processes' command line and environment
        seen.update(command=command, env=env)
        return 1

    monkeypatch.setattr(launching, "run_watched", run)
    for processes in (1, 2):
        unplanned = job(tmp_path, str(tiny_model), num_processes=processes)
        gpus = Machine(processes, 80 << 30, "H100", 1 << 40, 16)
        plan = plan_training(unplanned.config, None, gpus)
        planned = unplanned.model_copy(update={"plan": plan})
        with pytest.raises(LaunchError):
            launching.launch(planned)
        port = seen["command"][seen["command"].index("--main_process_port") + 1]
        assert seen["env"]["MASTER_PORT"] == port != "29500"
        assert seen["env"]["MASTER_ADDR"] == "127.0.0.1"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grpo_on_two_processes(tmp_path, tiny_model) -> None:
    from transformers import AutoModelForCausalLM

    model = tiny_model
    history, timing, _ = run_job(job(tmp_path, str(model), num_processes=2, max_steps=2))
    assert [h["step"] for h in history if "loss" in h] == [1, 2]
    assert all(-1.0 <= h["reward"] <= 1.0 for h in history if "reward" in h)
    assert timing["processes"] == 2 and timing["steps"] == 2
    log = (tmp_path / "out" / ".launch" / "launch.log").read_text()
    assert "process 0 of 2 starts" in log and "process 1 of 2 starts" in log
    assert "cobalt.training.reporting.step_timing: step 2: " in log  # each step logged as it ends
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))  # saved once, loadable
    assert log.count("the policy saved to") == 1, log[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_offline_training_on_two_processes_saves_once_from_the_main_process(tmp_path) -> None:
    """The offline trainer saves through the same path as GRPO: the state gathered from both
    processes, cast to the checkpoint's dtype (bf16 here, trained in fp32) and written by the
    main process alone, which says so once; the other waits for it."""
    import json

    from test_offline_trainer import rows as offline_rows
    from transformers import AutoModelForCausalLM

    from cobalt.training.settings import OfflineSettings
    from engines.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", seed=0, dtype="bfloat16")
    storage = StorageConfig(url=str(tmp_path / "runs"))
    st = open_storage(storage)
    rows = offline_rows() * 4
    dataset = commit_rows(st, st.path("offline", "k"), "k", rows, {}, BanditSpecStub())
    config = TrainingConfig(
        preset="tiny",
        mode="offline",
        num_processes=2,
        max_steps=2,
        offline=OfflineSettings(batch_size=2, learning_rate=3e-3),
    )
    out = tmp_path / "out"
    the_job = Job(
        config=config,
        dataset=dataset,
        storage=storage,
        sandbox=SANDBOX,
        model=str(model),
        output_dir=str(out),
    )
    history, timing, extra = run_job(the_job)
    assert [h["step"] for h in history if "loss" in h] == [1, 2]
    assert timing["processes"] == 2 and extra["numerics"]["trainable"] == "float32"
    log = (out / ".launch" / "launch.log").read_text()
    assert "process 0 of 2 starts" in log and "process 1 of 2 starts" in log
    assert log.count("the policy saved to") == 1, log[-3000:]
    assert "by the main process of 2" in log
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    saved = AutoModelForCausalLM.from_pretrained(str(out))
    assert {str(p.dtype) for p in saved.parameters()} == {"torch.bfloat16"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_training_sets_its_cpu_threads_and_reports_them(tmp_path, tiny_model, monkeypatch):
    """engines.cpu_threads in the training process: here COBALT_THREADS; the step timing (the
    training stage's summary) says how many threads the steps ran on."""
    import torch

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("COBALT_THREADS", "1")
    try:
        _, timing, _ = run_job(job(tmp_path, str(tiny_model), max_steps=1))
        assert timing["steps"] == 1 and timing["cpu_threads"] == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_failed_launch_says_why(tmp_path) -> None:
    with pytest.raises(LaunchError) as failed:
        run_job(job(tmp_path, str(tmp_path / "nope"), num_processes=2, max_steps=1))
    first = str(failed.value).splitlines()[0]  # the child's exception first, then its output
    assert re.match(r"training on 2 processes failed \(\d+\): \w*(Error|Exception): .*nope", first)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_multi_process_run_resumes_with_the_same_command(tmp_path, tiny_model) -> None:
    """Two training processes (gloo here; the same launcher and checkpoints as on GPUs) killed
    with SIGKILL, the launcher with them, once a checkpoint is on disk: the same job again goes
    on from the newest complete checkpoint, runs only the steps left, and saves one model
    directory that transformers loads. A checkpoint the kill cut short (no trainer_state.json)
    is skipped. Over 60 s: two launches of two training processes."""
    import json
    import signal
    import time

    from transformers import AutoModelForCausalLM

    from cobalt.training.machinery.checkpoints import last_checkpoint

    model = tiny_model
    steps = 20  # the kill lands at the first checkpoint (step 2): many steps after it
    the_job = job(tmp_path, str(model), num_processes=2, max_steps=steps, save_steps=2)
    job_file = tmp_path / "job.json"
    job_file.write_text(the_job.model_dump_json())
    out = Path(the_job.output_dir)
    first = subprocess.Popen(
        [sys.executable, "-c", RUN_JOB, str(job_file)],
        start_new_session=True,  # its own process group: the launcher and both trainers
        stdout=(tmp_path / "first.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 600
    while last_checkpoint(out) is None and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if first.poll() is not None:
        pytest.fail(
            f"the run ended before it could be killed:\n{(tmp_path / 'first.log').read_text()[-3000:]}"
        )
    os.killpg(first.pid, signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    survived = last_checkpoint(out)
    assert survived is not None
    done = int(survived.rsplit("-", 1)[-1])
    assert done < steps
    partial = out / f"checkpoint-{done + 100}"  # what a kill during a save leaves
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"cut short")

    history, timing, _ = run_job(the_job)
    assert [h["step"] for h in history if "loss" in h] == list(range(1, steps + 1))
    log = (out / ".launch" / "launch.log").read_text()
    assert timing["steps"] == steps - done, log[-3000:]  # only the steps the kill left undone
    assert "process 1 of 2 starts" in log
    state = json.loads((Path(last_checkpoint(out)) / "trainer_state.json").read_text())
    assert state["global_step"] == steps
    AutoModelForCausalLM.from_pretrained(str(out))  # the policy: a plain model directory


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_hung_process_fails_the_job_within_the_collective_timeout(tmp_path, tiny_model) -> None:
    """One process stops answering (its rollout sleeps): the other waits in the next collective
    for training.collective_timeout_s, not transformers' 30 minutes, and the error says so."""
    import time

    model = tiny_model
    hanging = "tests.training.hanging_rollout:hang_on_the_second_process"
    the_job = job(
        tmp_path, str(model), num_processes=2, max_steps=1, collective_timeout_s=15,
        rollout=hanging,
    )  # fmt: skip
    started = time.perf_counter()
    with pytest.raises(LaunchError) as failed:
        run_job(the_job)
    first = str(failed.value).splitlines()[0]
    assert "waited 15 s in a collective" in first and "collective_timeout_s" in first, first
    assert time.perf_counter() - started < 150


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_failed_process_is_named_with_its_own_error(tmp_path, tiny_model) -> None:
    """Process 1's rollout raises while process 0 waits for it: the error's first line is
    process 1's own exception, naming that process."""

    model = tiny_model
    failing = "tests.training.hanging_rollout:fail_on_the_second_process"
    the_job = job(tmp_path, str(model), num_processes=2, max_steps=1, rollout=failing)
    with pytest.raises(LaunchError) as failed:
        run_job(the_job)
    first = str(failed.value).splitlines()[0]
    assert first.endswith(
        "ValueError: the second process's rollout failed (process 1 failed first)"
    ), first


def test_the_first_failure_wins_over_the_errors_it_caused() -> None:
    """What a GPU run's log looked like (1 node x 2, vLLM colocated): process 1 died starting
    vLLM, process 0's collective then failed and its traceback came last. The first line names
    process 1's error, not process 0's consequence; without a traceback of its own, the
    process and where its output is."""
    from cobalt.training.machinery.launch_log import first_failure

    root = (
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-28_21:51:07\n"
        "  host      : localhost\n  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 12497)\n"
    )
    own = "[rank1]: Traceback (most recent call last):\n[rank1]: RuntimeError: CUDA error: invalid argument\n"
    victim = (
        "[rank0]:     dist.all_reduce(memory_tensor, group=cpu_group, op=dist.ReduceOp.MIN)\n"
        "[rank0]: RuntimeError: [gloo/transport/tcp/pair.cc:547] Connection closed by peer\n"
    )
    log = Path("launch.log")
    assert first_failure(own + victim + root, log) == (
        "RuntimeError: CUDA error: invalid argument (process 1 failed first)"
    )
    assert first_failure(victim + root, log) == (
        "process 1 failed first (exit code 1) without a Python error in the output; each "
        "process's output: launch.log"
    )
    assert first_failure(own + victim, log) is None  # no launcher verdict: the last error


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("rank", "message"), [
    (0, r"only 1 of 2 nodes joined at the rendezvous 127\.0\.0\.1:\d+ within 8 s: start the same "
        r"job on every node \(--node-rank 0 to 1, the same --rdzv-endpoint\)"),
    (1, r"node 1 could not reach the rendezvous 127\.0\.0\.1:\d+ within 8 s: start node 0"),
])  # fmt: skip
def test_a_node_alone_fails_naming_the_rendezvous(tmp_path, rank, message, tiny_model) -> None:
    """Training on two nodes where only one ever starts: it gives up after the rendezvous
    timeout with one line naming the endpoint and what to do, on either side."""

    model = tiny_model
    the_job = job(
        tmp_path, str(model), nodes=2, node_rank=rank, rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        rendezvous_timeout_s=8, max_steps=1,
    )  # fmt: skip
    with pytest.raises(LaunchError) as failed:
        run_job(the_job)
    first = str(failed.value).splitlines()[0]
    assert re.search(message, first), first


# one node's training stage in a process of its own: TrainingSpec and Runtime JSON files in
STAGE = (
    "import sys; from cobalt.training.stages import Runtime, TrainingSpec, training_stage; "
    "spec = TrainingSpec.model_validate_json(open(sys.argv[1]).read()); "
    "runtime = Runtime.model_validate_json(open(sys.argv[2]).read()); "
    "print(training_stage(spec, runtime).model_dump_json())"
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_nodes_train_in_one_directory_they_both_mount(tmp_path, tiny_model) -> None:
    """Two nodes (two launchers, one rendezvous, one CPU process each) on a local storage
    directory declared shared (storage.shared: an NFS mount on a cluster), through the training
    stage with --refresh: node 0 alone empties the directory, node 1 keeps its launch files on
    its own disk, both train in the directory, node 0 commits and node 1 returns its commit."""
    import json

    from transformers import AutoModelForCausalLM

    from cobalt.training.stages import PolicyRef, Runtime, TrainingSpec, training_stage

    model = tiny_model
    storage = StorageConfig(url=str(tmp_path / "runs"), shared=True)
    dataset = bandit_dataset(storage)
    stage = tmp_path / "runs" / "training" / "k"
    (stage / "checkpoint-9").mkdir(parents=True)  # an earlier run's, which --refresh removes
    endpoint = f"127.0.0.1:{_free_port()}"

    def node(rank: int) -> tuple[TrainingSpec, Runtime]:
        config = TrainingConfig(
            preset="tiny", mode="cobalt", max_steps=2, nodes=2, node_rank=rank,
            rdzv_endpoint=endpoint, rendezvous_timeout_s=120,
            overrides={"save_strategy": "steps", "save_steps": 1},
        )  # fmt: skip
        spec = TrainingSpec(key="k", dataset=dataset, model="tiny", config=config)
        runtime = Runtime(model=str(model), sandbox=SANDBOX, storage=storage,
                          work_dir=str(tmp_path / f"work{rank}"), refresh=True)  # fmt: skip
        return spec, runtime

    files = []
    for i, part in enumerate(node(1)):
        files.append(tmp_path / f"node1-{i}.json")
        files[-1].write_text(part.model_dump_json())
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    other = subprocess.Popen(
        [sys.executable, "-c", STAGE, *map(str, files)], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env={**os.environ, **env},
    )  # fmt: skip
    try:
        ref = training_stage(*node(0))
    finally:
        out, _ = other.communicate(timeout=300)
    assert other.returncode == 0, out[-3000:]
    theirs = PolicyRef.model_validate_json(out.strip().splitlines()[-1])
    assert theirs.uri == ref.uri and theirs.steps == ref.steps == 2
    assert not (stage / "checkpoint-9").exists()
    checkpoint = stage / "checkpoint-2"
    assert sorted(p.name for p in checkpoint.glob("rng_state_*.pth")) == [
        "rng_state_0.pth", "rng_state_1.pth",
    ]  # fmt: skip
    assert "process 0 of 2 starts" in (stage / ".launch" / "launch.log").read_text()
    theirs_log = tmp_path / "work1" / "training" / "k" / "launch-node1" / "launch.log"
    assert "process 1 of 2 starts" in theirs_log.read_text()
    assert not any((stage / ".nodes").iterdir())  # the probe cleaned up after itself
    assert json.loads((stage / "MANIFEST.json").read_text())
    AutoModelForCausalLM.from_pretrained(ref.uri)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nodes_that_do_not_share_the_declared_directory_stop_naming_what_each_sees(
    tmp_path, tiny_model
) -> None:
    """storage.shared declared, but each node writes a directory of its own (two machines'
    local disks): every node stops before its first step, saying what each node saw (the
    rendezvous waits 45 s: node 1, started in a fresh interpreter, missed a
    10 s one on CI's two loaded cores). Over 60 s: two launchers, and the check waits its whole
    window for files that never come."""

    model = tiny_model
    the_job = job(
        tmp_path, str(model), nodes=2, node_rank=0, rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        rendezvous_timeout_s=45, max_steps=1,
    )  # fmt: skip
    the_job = the_job.model_copy(
        update={"storage": the_job.storage.model_copy(update={"shared": True})}
    )
    config = the_job.config.model_copy(update={"node_rank": 1})
    theirs = the_job.model_copy(update={"config": config, "output_dir": str(tmp_path / "out1")})
    job_file = tmp_path / "node1.json"
    job_file.write_text(theirs.model_dump_json())
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    other = subprocess.Popen(
        [sys.executable, "-c", RUN_JOB, str(job_file)], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        with pytest.raises(LaunchError) as failed:
            run_job(the_job)
    finally:
        out, _ = other.communicate(timeout=200)
    expected = (
        r"storage\.shared: \S+ is not one directory for all 2 nodes \(node 0 sees the files "
        r"of nodes \[0\]; node 1 sees the files of nodes \[1\] only\): use a directory every "
        r"node mounts"
    )
    first = str(failed.value).splitlines()[0]
    assert re.search(expected, first), first
    assert other.returncode != 0 and re.search(expected, out), out[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_step_reports_the_bytes_its_collectives_moved_and_a_micro_batch_sync_twice_them(
    tmp_path, monkeypatch, fsdp_on_cpu, tiny_model
):
    """With torch's flight recorder on, the step timing holds the GB each step put through
    collectives: under fsdp (float32 on CPU processes), the whole model gathered at least twice a
    step (forward, backward) and its gradients reduced at least once (gloo has no
    reduce-scatter: FSDP2 all-reduces there). A step of two micro-batches reduces its gradients
    once (accelerate's no_sync holds them whole until the last micro-batch); with
    training.gradient_sync micro_batch (what the memory plan picks when whole gradients do not
    fit) it reduces them after each, twice the bytes, and the run's numerics say which the
    Trainer did. (Without the recorder, no bytes: the fsdp run of
    test_async_generation_under_fsdp_gathers_the_weights_it_samples_from.) Over 60 s: two
    two-process fsdp launches with the flight recorder on."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = tiny_model
    model_gb = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).num_parameters()
    model_gb *= 4 / 1e9
    fsdp_on_cpu("1")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "20000")
    two = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4}  # 2 a process
    reduced, synced = {}, {}
    for sync, steps in (("step", 2), ("micro_batch", 1)):
        config = {"num_processes": 2, "sharding": "fsdp", "max_steps": steps, "overrides": two,
                  "gradient_sync": sync}  # fmt: skip
        _, timing, extra = run_job(job(tmp_path / sync, str(model), **config))
        assert timing["collectives_complete"] is True
        by_op = timing["collective_gb_step_by_op"]
        for step in range(steps):
            assert by_op["all_gather"][step] >= 2 * model_gb
            reduced_gb = by_op.get("reduce_scatter", [0] * steps)[step]
            reduced_gb += by_op.get("all_reduce", [0] * steps)[step]
            assert reduced_gb >= model_gb
            assert timing["collective_gb_step"][step] == pytest.approx(
                sum(gb[step] for gb in by_op.values()), abs=1e-5
            )
            reduced.setdefault(sync, reduced_gb)
        synced[sync] = extra["numerics"]["gradient_sync"]
    assert synced == {"step": "step", "micro_batch": "micro_batch"}
    assert reduced["micro_batch"] == pytest.approx(2 * reduced["step"], rel=0.1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_async_generation_under_fsdp_gathers_the_weights_it_samples_from(
    tmp_path, fsdp_on_cpu, tiny_model
) -> None:
    """One step off on two fsdp processes: each process's background copy is refreshed from the
        sharded policy (a gather every process joins) before each batch is sent ahead; across the
        epoch's end (4 batches of 1 prompt an epoch) each process reads its share of the next
        epoch's first batch right; the run ends with every batch after the first served from the
        background, nothing hanging; without torch's flight recorder the timing holds no collective
    bytes."""

    model = tiny_model
    fsdp_on_cpu("1")
    config = {"num_processes": 2, "sharding": "fsdp", "max_steps": 6, "async_generation": True}
    history, timing, extra = run_job(job(tmp_path, str(model), **config))
    assert [h["step"] for h in history if "loss" in h] == [1, 2, 3, 4, 5, 6]
    assert [h["epoch"] for h in history if "loss" in h][3:5] == [1.0, 1.25]  # a second epoch
    assert extra["overlap"]["overlapped_batches"] == 5 and extra["overlap"]["fresh_batches"] == 1
    assert timing["processes"] == 2
    assert "collective_gb_step" not in timing  # no flight recorder, no bytes
