"""Per-conversation seeds on vLLM (checking the change of 28f4491): identical conversations of one
`generate` call sample differently, and the same call repeated gives the same texts.

The project's vLLM engine (`engines.vllm_engine.VLLMEngine`) gets a call of two identical
conversations and a third one, n samples each, one run seed. Checked: the 2n samples of the
identical pair are pairwise distinct; a second identical call returns the same texts
(reproducible); and, as the control that shows the check can fail, vLLM given one seed for the
whole call (the scheme before 28f4491) returns the identical pair's samples equal. Prints a JSON
summary; exit 1 when a check fails.

    python scripts/gpu/seed_check.py /root/tiny-random --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engines.config import EngineConfig, SamplingConfig  # noqa: E402
from engines.vllm_engine import VLLMEngine  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    engine = VLLMEngine(
        EngineConfig(
            kind="vllm", model=args.model, gpu_memory_utilization=args.gpu_memory_utilization
        )
    )
    same = [{"role": "user", "content": "Write a program that prints the sum of two numbers."}]
    other = [{"role": "user", "content": "Write a program that reverses a string."}]
    sampling = SamplingConfig(n=args.n, temperature=1.0, max_new_tokens=48, seed=args.seed)
    first = engine.generate([same, same, other], sampling)
    again = engine.generate([same, same, other], sampling)
    pair = [c.text for c in first[0] + first[1]]
    # the control: one seed for the whole call, as before the per-conversation seeds
    from vllm import SamplingParams

    shared = SamplingParams(n=args.n, temperature=1.0, max_tokens=48, seed=args.seed)
    control = engine.llm.chat([same, same], sampling_params=[shared, shared], use_tqdm=False)
    engine.close()
    control_texts = [[s.text for s in out.outputs] for out in control]
    result = {
        "model": args.model,
        "n": args.n,
        "identical_pair_distinct_samples": len(set(pair)),
        "identical_pair_samples": len(pair),
        "reproducible": [[c.text for c in row] for row in first]
        == [[c.text for c in row] for row in again],
        "control_one_seed_pair_equal": control_texts[0] == control_texts[1],
        "example": pair[:2],
    }
    result["passed"] = (
        result["identical_pair_distinct_samples"] == len(pair)
        and result["reproducible"]
        and result["control_one_seed_pair_equal"]
    )
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
