"""Test support: accelerate's FSDP path on CPU processes over gloo, so that CI measures FSDP
(tests/benchmarks/test_parity.py).

accelerate shards with FSDP only on accelerator devices: on CPU processes it sets the
distributed type to MULTI_CPU and wraps the model in DDP. With this directory on PYTHONPATH and
`COBALT_TEST_FSDP_ON_CPU=1`, every Python process started (the launcher's training processes,
the parity harness's killed run) switches that type to FSDP after accelerate decides it, in the
shared state that every `Accelerator` reads, and the training plan's refusal of FSDP without
GPUs (`cobalt.training.machinery.plan.check_fsdp_devices`) is lifted. Everything after the gate is
accelerate's and torch's own: FSDP2's `fully_shard` over gloo (the parameters become DTensor
shards), its mixed-precision policy, sharded checkpoints, the full state dict of the saved
policy. `COBALT_TEST_FSDP_ON_CPU=plan` lifts the plan's refusal only: accelerate then trains
as DDP what was planned as FSDP, which the trainers must refuse. Nothing in the product imports
this.
"""

import os


def lift_accelerate_gate() -> None:
    import accelerate.state as state_module
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    original = state_module.AcceleratorState.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.distributed_type != DistributedType.MULTI_CPU:
            return
        plugin = kwargs.get("fsdp_plugin") or getattr(self, "fsdp_plugin", None)
        plugin = plugin or FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* env
        if self.mixed_precision != "no":
            plugin.set_mixed_precision(self.mixed_precision)
        # every AcceleratorState() copies PartialState's shared state in: set both, before the
        # Accelerator checks its parallelism config (hybrid) against the type
        state_module.PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = plugin

    state_module.AcceleratorState.__init__ = init


def lift_plan_refusal() -> None:
    from cobalt.training.machinery import plan

    plan.check_fsdp_devices = lambda sharding, gpus: None


MODE = os.environ.get("COBALT_TEST_FSDP_ON_CPU")  # "1": both lifted; "plan": the plan's only
if MODE in ("1", "plan"):
    if MODE == "1" and os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        lift_accelerate_gate()  # a training process of an FSDP launch
    try:
        lift_plan_refusal()
    except ImportError:  # a process without the repository on its path plans nothing
        pass
