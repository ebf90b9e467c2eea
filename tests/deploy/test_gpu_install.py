"""The GPU worker's install resolves: a resolver dry run of the `gpu` extra against
the package index's metadata (vLLM's wheel included), without a GPU. CI has the index."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLATFORM = ["--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28"]


def uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert found, "uv is in the dev extra: make setup"
    return found


def compile_gpu(*extra: str) -> subprocess.CompletedProcess[str]:
    command = [uv(), "pip", "compile", "pyproject.toml", "--extra", "gpu", *PLATFORM]
    command += ["--no-annotate", "--no-header", *extra]
    if os.environ.get("PIP_INDEX_URL"):  # the index pip installs from, where one is configured
        command += ["--index-url", os.environ["PIP_INDEX_URL"]]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def pins(text: str) -> dict[str, str]:
    found = (re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)", line) for line in text.splitlines())
    return {m[1].lower().split("[")[0]: m[2] for m in found if m}


@pytest.mark.slow
def test_gpu_extra_resolves_with_the_lock_and_the_fastapi_override():
    done = compile_gpu("--override", "overrides-gpu.txt", "-c", "constraints-gpu.txt")
    assert done.returncode == 0, done.stderr[-2000:]
    resolved = pins(done.stdout)
    locked = pins((ROOT / "constraints-gpu.txt").read_text())
    assert resolved["fastapi"] == "0.136.3"
    assert resolved["vllm"] == locked["vllm"]
    assert resolved == {k: v for k, v in locked.items() if k in resolved}
    # the project's direct pins hold on the GPU set too (one prefect, trl, transformers)
    cpu = pins((ROOT / "constraints.txt").read_text())
    for name in ("prefect", "trl", "transformers", "peft", "accelerate", "datasets", "litellm"):
        assert resolved[name] == cpu[name], name


@pytest.mark.slow
def test_without_the_override_the_gpu_extra_does_not_resolve_and_fastapi_is_why():
    done = compile_gpu()
    assert done.returncode != 0
    assert "fastapi" in done.stderr


def test_the_override_is_the_only_departure_from_prefects_declared_range():
    lines = [
        line
        for line in (ROOT / "overrides-gpu.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines == ["fastapi==0.136.3"]


def build_wheel(tmp: Path, name: str) -> Path:
    """A one-module wheel with a console script `name` (built offline with this venv's setuptools)."""
    src = tmp / f"src-{name}"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text("def main():\n    print('hello from " + name + "')\n")
    (src / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "1.0"\n'
        f'[project.scripts]\n{name} = "{name}:main"\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    out = tmp / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(src)],
        check=True, timeout=120,
    )  # fmt: skip
    return next(out.glob(f"{name}-*.whl"))


def pack_group(tmp: Path, wheel: Path, out: Path) -> None:
    """What build.sh makes of a group: its wheels installed with pip --target, tarred, xz."""
    import tarfile

    site = tmp / f"site-{wheel.name}"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
         "--target", str(site), str(wheel)],
        check=True, timeout=120,
    )  # fmt: skip
    with tarfile.open(out, "w:xz") as tar:
        tar.add(site, arcname=".")


def test_the_bundle_installs_call_by_call_and_keeps_every_console_script(tmp_path):
    """infra/gpu-bundle/install.sh on the worker, one packed group per device call and vLLM's
    parts over two calls: the second group must not take the first one's console scripts away
    (`prefect: command not found` on the H200, 2026-11-26), the scripts run with the worker's
    python3 (the build machine's interpreter path is rewritten), and vLLM is unpacked once its
    last part has arrived."""
    import tarfile

    checkout = tmp_path / "checkout"
    (checkout / "infra/gpu-bundle").mkdir(parents=True)
    (checkout / ".gpu").mkdir()
    shutil.copy(ROOT / "infra/gpu-bundle/install.sh", checkout / "infra/gpu-bundle/install.sh")
    site, store = tmp_path / "site", tmp_path / "store"
    bin_dir = tmp_path / "bin"  # `python3` on the worker's PATH: this interpreter
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "GPU_SITE": str(site), "GPU_BUNDLE_STORE": str(store),
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}  # fmt: skip
    fake = tmp_path / "vllm-site"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("x = 1\n")
    with tarfile.open(tmp_path / "vllm.tar.xz", "w:xz") as tar:
        tar.add(fake, arcname=".")
    blob = (tmp_path / "vllm.tar.xz").read_bytes()
    half = len(blob) // 2
    parts = {"vllm.part-00": blob[:half], "vllm.part-01": blob[half:]}

    def install() -> str:
        done = subprocess.run(
            ["bash", "infra/gpu-bundle/install.sh"], cwd=checkout, env=env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    for call, (group, name) in enumerate((("core", "cobaltfirst"), ("remote", "cobaltsecond"))):
        pack_group(
            tmp_path, build_wheel(tmp_path, name), checkout / ".gpu" / f"site-{group}.tar.xz"
        )
        part = f"vllm.part-0{call}"
        (checkout / ".gpu" / part).write_bytes(parts[part])
        (checkout / ".gpu" / "PARTS").write_text("\n".join(parts) + "\n")
        said = install()
        assert f"site-{group} installed" in said
        assert not (checkout / ".gpu" / f"site-{group}.tar.xz").exists()  # once, then gone
        assert ("waiting for vllm.part-01" in said) == (call == 0), said
    assert (site / "vllm" / ".complete").exists() and (site / "vllm" / "__init__.py").exists()
    for name in ("cobaltfirst", "cobaltsecond"):
        script = site / "bin" / name
        assert script.read_text().splitlines()[0] == "#!/usr/bin/env python3"
        ran = subprocess.run(
            [str(script)], env={**env, "PYTHONPATH": str(site)}, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert ran.stdout.strip() == f"hello from {name}", ran.stderr
