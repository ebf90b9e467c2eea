"""The record written beside every result of scripts/gpu/recipe.sh (STEM.recipe.json): the recipe and
its arguments, the commit that ran it (git's, else $RECIPE_COMMIT: a device call's copy of the
tree has no .git), whether the tree differed from it, a digest of the source that ran, the machine,
when it started and ended, its exit code and its result files.

    python scripts/gpu/recipe_record.py start RUN/recipe.json --stem STEM -- RECIPE ARGS...
    python scripts/gpu/recipe_record.py stem RUN/recipe.json
    python scripts/gpu/recipe_record.py finish RUN/recipe.json OUT/STEM.recipe.json --exit 0 --files F...
    python scripts/gpu/recipe_record.py digest      # this checkout's, to compare with a record's
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ["benchmarks", "cobalt", "engines", "experiments", "flows", "infra", "sandbox", "scripts",
          "tasks"]  # fmt: skip
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".txt", ".json", ".cfg"}
TOP = ["pyproject.toml", "prefect.yaml", "Makefile"]


def digest() -> str:
    """sha256 over the source's paths and bytes (results and caches left out): the files git does
    not ignore where git is, else every file (a device call's copy holds no ignored ones)."""
    listed = output("git", "ls-files", "--cached", "--others", "--exclude-standard", *SOURCE, *TOP)
    if listed:
        candidates = [ROOT / line for line in listed.splitlines()]
    else:
        candidates = [ROOT / name for name in TOP]
        candidates += [path for top in SOURCE for path in (ROOT / top).rglob("*")]
    files = set()
    for path in candidates:
        parts = path.relative_to(ROOT).parts
        if "__pycache__" in parts or parts[:2] == ("benchmarks", "results"):
            continue
        if path.suffix in SUFFIXES and path.is_file():
            files.add(path)
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def output(*command: str) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def start(path: Path, stem: str, recipe: str, args: list[str]) -> None:
    commit = output("git", "rev-parse", "HEAD")
    given = os.environ.get("RECIPE_COMMIT") or None
    record = {
        "recipe": recipe,
        "args": args,
        "command": shlex.join(["bash", "scripts/gpu/recipe.sh", recipe, *args]),
        "commit": commit or given,
        "commit_from": "git" if commit else ("RECIPE_COMMIT" if given else None),
        "tree_changed": bool(output("git", "status", "--porcelain", "--untracked-files=no"))
        if commit
        else None,
        "source_sha256": digest(),
        "stem": stem,
        "machine": {
            "gpus": output(
                "nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"
            ).splitlines(),
            "cores": os.cpu_count(),
            "host_memory_gib": round(
                os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
            ),
            "host": platform.node(),
        },
        "started": now(),
    }
    path.write_text(json.dumps(record, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("start")
    p.add_argument("record", type=Path)
    p.add_argument("--stem", required=True)
    p.add_argument("recipe")
    p.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("stem").add_argument("record", type=Path)
    p = sub.add_parser("finish")
    p.add_argument("record", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--exit", type=int, required=True)
    p.add_argument("--files", nargs="*", default=[])
    sub.add_parser("digest")
    args = parser.parse_args()
    if args.what == "start":
        start(args.record, args.stem, args.recipe, [a for a in args.args if a != "--"])
    elif args.what == "stem":
        print(json.loads(args.record.read_text())["stem"])
    elif args.what == "finish":
        record = json.loads(args.record.read_text())
        record.update(ended=now(), exit=args.exit, files=args.files)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    else:
        print(digest())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
