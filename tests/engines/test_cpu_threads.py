"""torch's CPU threads: one rule (engines.cpu_threads) for every process of a run: an explicit
COBALT_THREADS or OMP_NUM_THREADS, else at most CAP threads of the cores the process may use; and
the processes that run torch on CPU (the reference fit, the transformers engine; training:
tests/training/test_grpo_processes.py) apply it, seen through torch.get_num_threads() in them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cobalt.errors import USER_ERRORS
from engines.cpu_threads import CAP, ThreadSettingError, cap_cpu_threads, decide_threads

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def threads(monkeypatch):
    """No thread setting in the environment; torch's thread count restored after the test."""
    for name in ("COBALT_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_an_explicit_setting_wins_else_the_cap_of_the_usable_cores():
    assert CAP == 4
    assert decide_threads({}, cores=64) == (4, "cap 4 of 64 cores")  # a GPU host: not 64
    assert decide_threads({}, cores=2) == (2, "cap 4 of 2 cores")
    assert decide_threads({}, cores=1)[0] == 1
    assert decide_threads({"OMP_NUM_THREADS": "8"}, cores=64) == (8, "OMP_NUM_THREADS")
    both = {"OMP_NUM_THREADS": "8", "COBALT_THREADS": "16"}
    assert decide_threads(both, cores=2) == (16, "COBALT_THREADS")  # ours first, even above cores
    assert decide_threads({"COBALT_THREADS": " "}, cores=3)[0] == 3  # empty: unset


@pytest.mark.parametrize("value", ["0", "-2", "four", "2.5"])
def test_a_bad_setting_is_a_user_error_naming_the_variable(value):
    with pytest.raises(ThreadSettingError, match=f"COBALT_THREADS='{value}': give a whole number"):
        decide_threads({"COBALT_THREADS": value}, cores=2)
    assert issubclass(ThreadSettingError, USER_ERRORS)  # printed as one `error:` line


def test_the_cores_are_the_process_affinity_not_the_machine():
    code = (
        "import os; os.sched_setaffinity(0, {0}); "
        "from engines.cpu_threads import decide_threads; print(decide_threads({}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "(1, 'cap 4 of 1 cores')"


def test_the_cap_only_lowers_an_explicit_setting_is_used_as_given(threads, monkeypatch):
    torch.set_num_threads(64)  # torch's default on a 64-core host
    assert cap_cpu_threads() == min(CAP, len(os.sched_getaffinity(0))) == torch.get_num_threads()
    torch.set_num_threads(1)  # a caller's own choice (the Dask workers' setting) stays
    assert cap_cpu_threads() == 1 == torch.get_num_threads()
    monkeypatch.setenv("COBALT_THREADS", "3")
    assert cap_cpu_threads() == 3 == torch.get_num_threads()


def probe(code: str, env: dict[str, str]) -> str:
    """Run `code` in a fresh Python (no thread setting but `env`); its last stdout line."""
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "COBALT_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**base, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_the_transformers_engine_on_cpu_applies_it(tiny_model):
    make = (
        f"make_engine(EngineConfig(kind='transformers', model={str(tiny_model)!r}, device='cpu'))"
    )
    code = (
        "import os, torch; from engines import EngineConfig, make_engine; "
        # a fresh process on a 64-core host: torch's default lowered to the cap
        f"torch.set_num_threads(64); {make}; capped = torch.get_num_threads(); "
        f"os.environ['COBALT_THREADS'] = '1'; {make}; print(capped, torch.get_num_threads())"
    )
    assert probe(code, {}) == f"{min(CAP, len(os.sched_getaffinity(0)))} 1"


@pytest.mark.slow
@pytest.mark.usefixtures("threads")
def test_the_reference_fit_applies_it_and_is_the_same_model_for_any_thread_count(
    monkeypatch, tmp_path
):
    """The fit runs at the threads set and records them; `stats.weights_sha256` names the saved
    weights (sha256sum's digest), and one recipe fitted at 1 or 2 threads is one build."""
    import hashlib

    from cobalt.reference import RECIPE_FILE, fit_tiny_model

    digests = []
    for count in ("1", "2"):
        monkeypatch.setenv("COBALT_THREADS", count)
        path = fit_tiny_model(tmp_path / count, max_steps=2, n_examples=16, seconds_budget=300)
        stats = json.loads((path / RECIPE_FILE).read_text())["stats"]
        assert stats["steps"] == 2 and stats["cpu_threads"] == int(count)
        on_disk = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
        assert stats["weights_sha256"] == on_disk[:16]
        digests.append(stats["weights_sha256"])
    assert digests[0] == digests[1]
