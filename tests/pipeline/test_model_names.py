"""Naming a model (cobalt/models.py): a Hub id (at a branch, tag or commit) resolves
through huggingface_hub from its cache, offline; a model directory in S3 storage (moto) or in
local storage is downloaded once or used in place; every name that resolves to nothing says
which flag and what to do, the Hub's refusals included (a local server answering as the Hub
does: gated, not found, no such revision); a Hub snapshot is keyed by repo and commit, not by
where the cache is. Through the flows' CLIs: a Hub id and a stored policy evaluated, and two
evaluations compared side by side."""

from __future__ import annotations

import json
import re
import shutil
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import fsspec
import pytest
from hub_cache import lay_out
from huggingface_hub import constants

from cobalt.models import ModelNameError, display_name, resolve_model, stable_name
from cobalt.pipeline import PipelineParams
from cobalt.storage import StorageConfig
from cobalt.training.stages import PolicyRef, TrainingParams, local_model
from cobalt.training.stages import preflight as training_preflight
from cobalt.trajectories.stages import TrajectoryParams, stage_specs
from cobalt.trajectories.stages import preflight as trajectories_preflight
from flows import pipeline, trajectories

REPO = "cobalt-test/tiny"
MAIN, V1 = "a" * 40, "b" * 40
TINY_RUN = [  # 2 problems, 2 samples, 1 feedback turn of 8 tokens: seconds on a CPU
    *("--problems", "samples/apps_sample.jsonl:taco", "--limit", "2", "--n", "2"),
    *("--turns", "1", "--max-new-tokens", "8", "--backend", "namespace"),
]


@pytest.fixture
def hub(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hub cache holding the tiny model as REPO at two commits (main, and tag v1), set as
    huggingface_hub's cache for this test (HF_HUB_OFFLINE=1 as in every test)."""
    cache = tmp_path / "hf-hub"
    lay_out(cache, REPO, {MAIN: tiny_model, V1: tiny_model}, {"main": MAIN, "v1": V1})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert constants.is_offline_mode()
    return cache


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def storage(tmp_path: Path) -> StorageConfig:
    return StorageConfig(url=str(tmp_path / "runs"))


def test_a_hub_id_resolves_from_the_cache_offline(hub: Path, tmp_path: Path, monkeypatch):
    st, work = storage(tmp_path), str(tmp_path / "work")
    snapshots = hub / f"models--{REPO.replace('/', '--')}" / "snapshots"
    path = resolve_model(REPO, st, work)
    assert path == str(snapshots / MAIN) and Path(path, "config.json").is_symlink()
    assert resolve_model(f"{REPO}@v1", st, work) == str(snapshots / V1)  # a tag
    assert resolve_model(f"{REPO}@{V1}", st, work) == str(snapshots / V1)  # a commit
    # the identity a cache key records is itself a name: the same snapshot again
    assert stable_name(path) == f"{REPO}@{MAIN}"
    assert display_name(path) == display_name(stable_name(path)) == "tiny@aaaaaaa"  # titles
    assert resolve_model(stable_name(path), st, work) == path
    # a local directory of that name wins, as in from_pretrained
    local = tmp_path / "cwd" / REPO
    shutil.copytree(snapshots / MAIN, local)
    monkeypatch.chdir(tmp_path / "cwd")
    assert resolve_model(REPO, st, work) == REPO
    assert stable_name(REPO) == REPO
    monkeypatch.setenv("HOME", str(tmp_path / "cwd"))  # a path from home, expanded for loaders
    assert resolve_model(f"~/{REPO}", st, work) == str(local)


def test_a_name_that_resolves_to_nothing_names_the_flag_and_the_fix(hub: Path, tmp_path: Path):
    st, work = storage(tmp_path), str(tmp_path / "work")
    (tmp_path / "empty").mkdir()
    cases = {
        f"{REPO}@v9": rf"--model {REPO}@v9: not in the Hugging Face cache {hub} \(cached: main, "
        rf"v1\) and the Hub cannot be reached \(HF_HUB_OFFLINE=1\): download it where there is "
        rf"a network \(`hf download {REPO} --revision v9`\) into this cache",
        "cobalt-test/absent": r"not in the Hugging Face cache \S+ and the Hub cannot be reached "
        r"\(HF_HUB_OFFLINE=1\): download it .*`hf download cobalt-test/absent`",
        str(tmp_path / "nope"): r"--model \S+/nope: no such directory: name a Hub id "
        r"\(org/name\[@revision\]\), a local model directory, a model directory in storage",
        str(tmp_path / "empty"): r"--model \S+/empty: the directory has no config\.json: pass a "
        r"directory saved with save_pretrained",
        "a/b/c": r"--model a/b/c: no such directory",
        "bad name!": r"--model bad name!: no such directory here, and not a Hub id",
        "gs://bucket/model": r"--model gs://bucket/model: unknown scheme",
    }
    for name, pattern in cases.items():
        with pytest.raises(ModelNameError, match=pattern):
            resolve_model(name, st, work)
    with pytest.raises(ModelNameError, match=r"^--judge-model cobalt-test/absent: "):
        resolve_model("cobalt-test/absent", st, work, flag="--judge-model")


# how the Hub refuses `repo_info`: status and X-Error-Code, by repo (or repo@revision)
REFUSALS = {
    "org/gated": (403, "GatedRepo"),
    "org/private": (401, "RepoNotFound"),
    f"{REPO}@nope": (404, "RevisionNotFound"),
    "org/down": (503, None),
}


class _Hub(BaseHTTPRequestHandler):
    """Answers `repo_info` as the Hub does when it refuses: X-Error-Code and a JSON error."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        found = re.match(r"/api/models/([^/]+/[^/]+)/revision/([^/?]+)", self.path)
        repo, revision = found.groups() if found else ("", "")
        status, code = (
            REFUSALS.get(repo)
            or REFUSALS.get(f"{repo}@{revision}")
            or (
                404,
                "RepoNotFound",
            )
        )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if code:
            self.send_header("X-Error-Code", code)
        self.end_headers()
        self.wfile.write(json.dumps({"error": f"{code or 'unavailable'}"}).encode())

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def online(hub: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """huggingface_hub online, its endpoint a local server answering as the Hub refuses."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    try:
        yield constants.ENDPOINT
    finally:
        server.shutdown()


def test_the_hubs_refusals_name_the_fix(online: str, hub: Path, tmp_path: Path, monkeypatch):
    st, work = storage(tmp_path), str(tmp_path / "work")
    cases = {
        "org/gated": r"--model org/gated: org/gated is a gated model and this machine has no "
        r"access to it: accept its terms at https://huggingface\.co/org/gated and set HF_TOKEN",
        "org/private": r"--model org/private: no model org/private on the Hub \(or it is "
        r"private: set HF_TOKEN\), and no directory org/private here: check the name",
        f"{REPO}@nope": rf"--model {REPO}@nope: {REPO} has no revision 'nope': name a branch, "
        rf"tag or commit of it \({REPO}@main\)",
        "org/down": r"--model org/down: not in the Hugging Face cache \S+ and the Hub cannot be "
        r"reached \(HfHubHTTPError\)",
    }
    for name, pattern in cases.items():
        with pytest.raises(ModelNameError, match=pattern):
            resolve_model(name, st, work)
    # no network at all: a cached model resolves from the cache (a ref, and a commit), an
    # uncached one says so
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    snapshots = hub / f"models--{REPO.replace('/', '--')}" / "snapshots"
    assert resolve_model(REPO, st, work) == str(snapshots / MAIN)
    assert resolve_model(f"{REPO}@{V1}", st, work) == str(snapshots / V1)
    with pytest.raises(ModelNameError, match=r"the Hub cannot be reached \(ConnectError\)"):
        resolve_model("cobalt-test/absent", st, work)


def test_a_model_directory_in_s3_storage_is_downloaded_once(
    s3_endpoint: str, s3_bucket: str, tiny_model: Path, tmp_path: Path
):
    st = StorageConfig(url=f"s3://{s3_bucket}/cobalt", endpoint_url=s3_endpoint)
    fs = fsspec.filesystem("s3", endpoint_url=s3_endpoint, skip_instance_cache=True)
    uri = f"s3://{s3_bucket}/cobalt/training/k0"
    for path in tiny_model.iterdir():
        fs.put_file(str(path), f"{uri}/{path.name}")
    fs.pipe_file(f"{uri}/checkpoint-1/optimizer.pt", b"not needed")  # not downloaded
    work = tmp_path / "work"
    path = resolve_model(uri, st, str(work))
    assert path == str(work / "models" / "k0")  # where the training stage's download goes too
    assert sorted(p.name for p in Path(path).iterdir()) == sorted(
        p.name for p in tiny_model.iterdir()
    )
    fs.rm(uri, recursive=True)  # once downloaded, storage is not asked again
    assert resolve_model(uri, st, str(work)) == path
    assert str(local_model(PolicyRef(key="k0", uri=uri, steps=1), st, str(work))) == path
    # nothing there, or no model there
    with pytest.raises(ModelNameError, match=r"--model s3://\S+/training/absent: holds nothing: "
                       r"name a model directory in storage, such as a finished training"):  # fmt: skip
        resolve_model(f"s3://{s3_bucket}/cobalt/training/absent", st, str(work))
    fs.pipe_file(f"s3://{s3_bucket}/cobalt/training/k1/MANIFEST.json", b"{}")
    with pytest.raises(ModelNameError, match=r"training/k1: holds no config\.json"):
        resolve_model(f"s3://{s3_bucket}/cobalt/training/k1", st, str(work))
    assert not (work / "models" / "k1").exists()
    # the same through a flow's command line, before any work
    argv = ["--model", f"s3://{s3_bucket}/cobalt/training/k1", "--storage", st.url]
    assert trajectories.main([*argv, "--endpoint-url", s3_endpoint]) == 2


def test_a_hub_snapshot_is_keyed_by_repo_and_commit_not_by_its_path(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
):
    keys = []
    for where in ("one", "two"):  # two machines' caches
        cache = tmp_path / where / "hub"
        lay_out(cache, REPO, {MAIN: tiny_model}, {"main": MAIN})
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
        params = TrajectoryParams.model_validate(
            {
                "problems": "samples/apps_sample.jsonl:taco",
                "engine": {"kind": "transformers", "model": REPO},
                "storage": {"url": str(tmp_path / where / "runs")},
            }
        )
        ready = trajectories_preflight(params)
        assert ready.engine.model.startswith(str(cache))
        spec = stage_specs(params, ready)["initial"]
        assert spec.engine["model"] == f"{REPO}@{MAIN}"
        keys.append(spec.key)
    assert keys[0] == keys[1]


def test_evaluation_is_the_pipelines_evaluation_of_the_model(hub: Path):
    model = "/models/policy"
    mine = trajectories.parse_params(["--evaluation", "--model", model, "--preset", "tiny"])
    pipelines = PipelineParams(reference=model, preset="tiny")
    theirs = pipelines.trajectories("latest", pipelines.eval_table, model, "eval")
    fields = {"problems", "table", "engine", "collect", "limit", "perturbed"}
    assert mine.model_dump(include=fields) == theirs.model_dump(include=fields)
    assert mine.table == "test" and mine.collect.turns == 2
    # flags still override; a real model gets the paper's protocol
    mine = trajectories.parse_params(["--evaluation", "--model", REPO, "--n", "3"])
    assert (mine.collect.turns, mine.collect.sampling.n, mine.collect.sampling.max_new_tokens) == (
        8,
        3,
        6144,
    )
    assert mine.collect.sampling.seed == theirs.collect.sampling.seed != 0  # the evaluation's
    with pytest.raises(SystemExit):
        trajectories.parse_params(["--preset", "tiny"])  # only with --evaluation


def test_the_pipeline_takes_a_hub_id(hub: Path, tmp_path: Path):
    params = pipeline.parse_params(["--model", REPO, "--storage", str(tmp_path / "runs")])
    assert params.preset == "paper" and params.reference == REPO
    snapshot = hub / f"models--{REPO.replace('/', '--')}" / "snapshots" / MAIN
    assert pipeline.preflight(params)[0] == str(snapshot)  # resolved once, before any work
    assert pipeline.preflight(pipeline.parse_params(["--storage", str(tmp_path)]))[0] is None


def _evaluation(out: str) -> str:
    return out.split("evaluation (for --compare, --trajectories): ")[1].split()[0]


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.timeout(600)
def test_a_hub_model_and_a_stored_policy_evaluated_and_compared(
    hub: Path, tiny_model: Path, tmp_path: Path, capsys
):
    runs = tmp_path / "runs"
    common = [*TINY_RUN, "--storage", str(runs)]
    assert trajectories.main([*common, "--model", REPO]) == 0
    out = capsys.readouterr().out
    assert f"model {REPO}@{MAIN};" in out
    first = _evaluation(out)
    # the training flow's default model is the one that collected them: a Hub name again
    ready = training_preflight(TrainingParams(trajectories=first, storage={"url": str(runs)}))
    assert stable_name(ready.model) == f"{REPO}@{MAIN}"
    # a policy in local storage, named by its directory (as a training summary prints it)
    policy = runs / "training" / "k0"
    shutil.copytree(tiny_model, policy)
    assert trajectories.main([*common, "--model", str(policy)]) == 0
    second = _evaluation(capsys.readouterr().out)
    assert trajectories.main(["--compare", first, second, "--storage", str(runs)]) == 0
    out = capsys.readouterr().out
    assert f"{REPO}@{MAIN} -> {policy}: turn 0 " in out and "(same protocol)" in out
    assert f"before: {first} ({REPO}@{MAIN})" in out and f"after:  {second} ({policy})" in out
    assert "| difficulty | turn | problems | before_pass@1 | after_pass@1 |" in out
    plot = out.split("plot: ")[1].split()[0]
    assert Path(plot.removeprefix("file://")).read_bytes()[:4] == b"\x89PNG"
    # another protocol: the difference is named, the turns they share compared
    assert trajectories.main([*common, "--model", str(policy), "--turns", "0"]) == 0
    third = _evaluation(capsys.readouterr().out)
    assert trajectories.main(["--compare", first, third, "--storage", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "(protocols differ: collect.turns: 1 vs 0)" in out and "| all | 1 |" not in out
    assert trajectories.main(["--compare", str(tmp_path), third, "--storage", str(runs)]) == 2
    assert "is not a finished evaluation stage" in capsys.readouterr().err
