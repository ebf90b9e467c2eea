"""How training spreads over several GPUs: the accelerate config the project ships for each
sharding (`infra/accelerate/`) and the launch's environment for hybrid sharding. Which sharding a
run uses, and whether its batch splits over the processes, is decided once in
`cobalt.training.decisions`; whether the machine can run it, by the plan.

| sharding | what each GPU holds of the trained model | accelerate config |
| --- | --- | --- |
| `ddp` | all of it: weights, gradients, Adam's moments (16 bytes a trained fp32 parameter) | `ddp.yaml` |
| `fsdp` | 1/N of it (FSDP2 full shard; a layer is gathered in bf16 for its compute) | `fsdp.yaml` |
| `zero3` | 1/N of it (DeepSpeed ZeRO stage 3; `pip install deepspeed`) | `zero3.yaml` |
| `hybrid` | 1/G of it, G the GPUs of a node (FSDP2 sharding within each node, the nodes each a replica: gradients all-reduced across nodes once a step; several nodes only) | `fsdp.yaml` + accelerate's parallelism config (`dp_replicate_size` nodes, `dp_shard_size` G) |

`auto` is `fsdp` for full fine-tuning on several GPUs and `ddp` otherwise: LoRA trains a few
adapters over a frozen bf16 base that every GPU holds anyway, one process shards nothing, and
CPU processes (gloo) cannot be sharded by accelerate (it runs an FSDP config on CPUs as plain
DDP). `training.accelerate_config` names a file of the user's instead (several machines,
offload): its own distribution is what the plan, the memory checks and the launch follow
(`file_sharding`). What can run on a machine is checked by the run's GPU plan
(`cobalt.training.machinery.plan`).
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[3] / "infra" / "accelerate"


def config_file(sharding: str) -> Path:
    """The accelerate config the project ships for a strategy (hybrid: FSDP's, its 2-D device
    mesh set by the launch: `hybrid_env`)."""
    return CONFIG_DIR / f"{'fsdp' if sharding == 'hybrid' else sharding}.yaml"


def hybrid_env(nodes: int, per_node: int) -> dict[str, str]:
    """accelerate's parallelism config for hybrid sharding, as its launcher hands it to the
    training processes (the environment: its CPU launcher passes no `--parallelism_config_*`
    flags on): the nodes replicate, each node's processes shard."""
    return {
        "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": str(nodes),
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": str(per_node),
    }
