"""vLLM colocated the way TRL's GRPOTrainer starts it (`distributed_executor_backend=
"external_launcher"`, one engine a process, RANK / LOCAL_RANK / WORLD_SIZE set from the
launcher), over a torch world that spans several launchers ("nodes"): does every process start
its engine and generate? Each process writes its outcome (or its traceback) to
`<out>/rank<R>.txt`, so a process that dies is seen from its own words, not only as a peer's
"Connection closed by peer".

    torchrun --nnodes 2 --node-rank R --nproc-per-node 2 --master-addr 127.0.0.1 \\
        --master-port 29511 scripts/gpu/vllm_nodes_check.py MODEL --out DIR
"""

from __future__ import annotations

import argparse
import os
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--out", required=True)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"rank {rank} local_rank {os.environ['LOCAL_RANK']} world {os.environ['WORLD_SIZE']}"
             f" CUDA_VISIBLE_DEVICES {os.environ.get('CUDA_VISIBLE_DEVICES')}"]  # fmt: skip
    try:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        from vllm import LLM, SamplingParams

        llm = LLM(
            model=args.model,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=512,
            enable_sleep_mode=True,
            distributed_executor_backend="external_launcher",
            seed=rank,
            max_num_batched_tokens=4096,
            logprobs_mode="processed_logprobs",
        )
        lines.append("engine started")
        outputs = llm.generate(["def add(a, b):"] * 4, SamplingParams(max_tokens=16))
        lines.append(f"generated {sum(len(o.outputs[0].token_ids) for o in outputs)} tokens")
        llm.sleep(level=2)
        llm.wake_up()
        lines.append("slept and woke")
        dist.barrier()
        lines.append("ok")
    except BaseException:  # noqa: BLE001 - the point is to write down whatever killed it
        lines.append(traceback.format_exc())
        raise
    finally:
        (out / f"rank{rank}.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
