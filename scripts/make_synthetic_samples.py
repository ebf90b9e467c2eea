"""Write the bundled synthetic problem files the pipeline's embedded default starts from.

    python scripts/make_synthetic_samples.py     # rewrites samples/synthetic_{train,test}.jsonl

TACO-schema rows (`cobalt.data.synthetic.taco_row`), every one of the 30 kinds in turn; `difficulty`
says whether the kind is one the fitted tiny model saw (`seen`) or not (`held_out`). Train and
test draw their tests from different seeds. Deterministic: rerunning gives the same bytes
(tests/synthetic checks the committed files against it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cobalt.data import synthetic  # noqa: E402

FILES = {"synthetic_train.jsonl": (60, 101), "synthetic_test.jsonl": (60, 202)}


def render(count: int, seed: int) -> str:
    problems = synthetic.make_problems(synthetic.KINDS, count, seed=seed)
    return "".join(json.dumps(synthetic.taco_row(p)) + "\n" for p in problems)


def main() -> None:
    for name, (count, seed) in FILES.items():
        (ROOT / "samples" / name).write_text(render(count, seed))
        print(f"samples/{name}: {count} problems (seed {seed})")


if __name__ == "__main__":
    main()
