"""GRPO on two processes through `accelerate launch` (the multi-GPU path, here on CPU over
gloo): real GRPOTrainer, real sandbox pool per process, the model saved once, the log history and
step timing read back; a failing launch says why."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel
from test_grpo_tiny import rows as rows_of_test

from cobalt.bandit.dataset import BanditRef, commit_rows
from cobalt.judging import SandboxRuntime
from cobalt.storage import StorageConfig, open_storage
from cobalt.training.config import TrainingConfig
from cobalt.training.grpo import prepare_rows
from cobalt.training.launch import Job, LaunchError, launch_command, run_job

SANDBOX = SandboxRuntime(backend="namespace", concurrency=2)


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


def test_the_launch_command_is_accelerate_with_ddp_or_a_config_file(tmp_path) -> None:
    ddp = launch_command(tmp_path / "job.json", TrainingConfig(num_processes=4))
    assert ddp[1:3] == ["-m", "accelerate.commands.launch"] and "--multi_gpu" in ddp
    assert ddp[ddp.index("--num_processes") + 1] == "4"
    assert ddp[-3:] == ["-m", "cobalt.training.launch", str(tmp_path / "job.json")]
    zero = launch_command(
        tmp_path / "job.json", TrainingConfig(num_processes=8, accelerate_config="zero2.yaml")
    )
    assert "--multi_gpu" not in zero and zero[zero.index("--config_file") + 1] == "zero2.yaml"


def test_a_one_process_launch_stays_on_the_card_its_caller_was_given(tmp_path, monkeypatch) -> None:
    """accelerate sets CUDA_VISIBLE_DEVICES to --gpu_ids: a job pinned to card 1 (two jobs on a
    two-GPU worker) must not be moved to card 0."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    one = launch_command(tmp_path / "job.json", TrainingConfig())
    assert one[one.index("--gpu_ids") + 1] == "0" and "--multi_gpu" not in one
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    pinned = launch_command(tmp_path / "job.json", TrainingConfig())
    assert pinned[pinned.index("--gpu_ids") + 1] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e1f,GPU-77aa")
    uuid = launch_command(tmp_path / "job.json", TrainingConfig())
    assert uuid[uuid.index("--gpu_ids") + 1] == "GPU-5e1f"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grpo_on_two_processes(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from engines.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    history, timing, _ = run_job(job(tmp_path, str(model), num_processes=2, max_steps=2))
    assert [h["step"] for h in history if "loss" in h] == [1, 2]
    assert all(-1.0 <= h["reward"] <= 1.0 for h in history if "reward" in h)
    assert timing["processes"] == 2 and timing["steps"] == 2
    log = (tmp_path / "out" / ".launch" / "launch.log").read_text()
    assert "process 0 of 2 starts" in log and "process 1 of 2 starts" in log
    assert "cobalt.training.step_timing: step 2: " in log  # each step logged as it ends
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))  # saved once, loadable


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
