"""The numerics of training applied to a model, for every trainer (GRPO, offline, SFT): the dtype
of the trainable weights, of the compute, of frozen weights and of the saved model, as
`cobalt.training.decisions.decide` chose them once for the run.

The paper's recipe (verl with FSDP) keeps fp32 master weights and computes in bf16. A bf16
checkpoint (Qwen3-8B, R1-Distill-8B) loaded as it is would train in pure bf16: at learning rate
1e-6 most Adam updates are below bf16's resolution (8 bits of mantissa: a weight of 0.02 moves only
by steps of ~1e-4) and vanish (one step moved 1.7% of the weights,
tests/training/test_precision.py). So, whatever the checkpoint's dtype:

| precision | trainable weights (optimizer's master copy) | compute | frozen base (LoRA) | gradients reduced | saved |
| --- | --- | --- | --- | --- | --- |
| `mixed` | float32 | bf16 autocast | the checkpoint's dtype | float32 | the checkpoint's dtype |
| `fp32` | float32 | float32 | float32 | float32 | the checkpoint's dtype |
| `bf16` | bfloat16 (pure: small updates vanish) | bfloat16 | bfloat16 | bfloat16 | the checkpoint's dtype |

Several processes compute what one computes under `mixed`. FSDP2 left to accelerate
(`--mixed_precision bf16`) would gather every layer's weights in bf16, run the whole forward in
bf16 (the residual stream and the norms' inputs included, where one process's autocast keeps them
in fp32) and reduce-scatter the gradients in bf16: a systematic difference from one process (on
CPU, 2.8x the difference that regrouping a step's rows makes; docs/RESULTS.md, parity).
`set_distributed_numerics` gives its policy no parameter dtype (the layers are gathered as their
float32 master weights and the same bf16 autocast as one process's computes with them) and a
float32 reduce dtype, as verl reduces. DDP's gradients are the fp32 weights' own. ZeRO-3
communicates and sums a step's micro-batches in float32 (`communication_data_type`,
`grad_accum_dtype`); DeepSpeed's bf16 mode holds the module's weights in bf16 and builds its
float32 master copy from them: an fp32 checkpoint starts rounded to bf16 under ZeRO-3 (a bf16
checkpoint, as released 7-8B models are, loses nothing), and its forward runs in bf16 weights
(the difference FSDP no longer has); the saved policy is the float32 master copy where the
checkpoint is float32 (`cobalt.training.machinery.weights.save_policy`). `reduce_dtype_in_use` and
`gather_dtype_in_use` read back what the wrapped model does.

`auto` (the default) is `mixed` on a GPU with the `paper` preset and `fp32` otherwise: the `tiny`
preset's models are small enough for float32, and bf16 autocast with the tiny preset's learning
rate produced non-finite gradients on a GPU (docs/TRAINING.md). `bf16` is only used when a setting
asks for it. The run's log and the training stats say which (`Numerics.describe`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cobalt.training.decisions import Numerics

log = logging.getLogger(__name__)


def load_dtype(numerics: Numerics, lora: bool) -> Any:
    """The dtype to load the policy in: the frozen dtype under LoRA (the adapters get the
    trainable dtype, `cast_trainable`), the trainable dtype otherwise."""
    import torch

    return getattr(torch, numerics.frozen if lora else numerics.trainable)


def cast_trainable(model: Any, numerics: Numerics) -> int:
    """Give every trainable parameter the trainable dtype (LoRA adapters created over a bf16
    base, or a model loaded in another dtype); returns how many tensors were cast. Call it before
    the optimizer is created (before `train()`)."""
    import torch

    dtype = getattr(torch, numerics.trainable)
    cast = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype != dtype:
            param.data = param.data.to(dtype)
            cast += 1
    return cast


def trainable_dtypes(model: Any) -> set[str]:
    """The dtypes of the trainable parameters (what a test or the log checks)."""
    return {str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.requires_grad}


def cast_saved(output_dir: str | Path, numerics: Numerics) -> None:
    """Rewrite a saved model's weights (`*.safetensors`) and config in the checkpoint's dtype, so
    the engines load what the user's checkpoint was (an 8B bf16 checkpoint stays 16 GB, not 32).
    Works on files, after any trainer saved them (sharded states included); a no-op when they
    already are in that dtype."""
    import torch
    from safetensors.torch import load_file, save_file

    dtype = getattr(torch, numerics.saved)
    directory = Path(output_dir)
    for path in sorted(directory.glob("*.safetensors")):
        tensors = load_file(str(path))
        if all(not t.is_floating_point() or t.dtype == dtype for t in tensors.values()):
            continue
        cast = {k: t.to(dtype) if t.is_floating_point() else t for k, t in tensors.items()}
        tmp = path.with_suffix(".tmp")
        save_file(cast, str(tmp), metadata={"format": "pt"})
        tmp.replace(path)
    write_saved_dtype(directory, numerics)


def write_saved_dtype(output_dir: str | Path, numerics: Numerics) -> None:
    """Declare the saved weights' dtype in the model's config.json."""
    config_path = Path(output_dir) / "config.json"
    if config_path.exists():
        config = json.loads(config_path.read_text())
        config["dtype"] = numerics.saved
        config.pop("torch_dtype", None)
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def set_distributed_numerics(
    accelerator: Any, numerics: Numerics, gather: str = "float32", model: Any = None
) -> None:
    """Before the trainer wraps the model: bf16 autocast without its weight cache (every
    layout), and the numerics of one process on several: under FSDP
    and `mixed`, every weight reaches the compute as one process's bf16 autocast gives it, and
    the gradients are reduced in `numerics.reduce`: `gather` float32 gathers the float32 master
    weights whole; bf16-linear with `model` (a full fine-tuning in float32 under FSDP2) makes
    the units of `shard_as_one_process` (about half the bytes, the same numbers); bfloat16 is
    accelerate's own policy (every layer gathered and computed in bf16, as verl does). Under
    DeepSpeed,
    `communication_data_type` and `grad_accum_dtype`. DDP needs nothing: it reduces the
    gradients of the weights, in their own (float32) dtype."""
    import torch
    from accelerate.utils import AutocastKwargs, DistributedType

    kind = accelerator.distributed_type
    if numerics.autocast:
        # autocast caches the bf16 cast of every weight that is a leaf requiring grad until the
        # forward ends: a bf16 copy of every trainable layer (FSDP's gathered layers too: the
        # whole model on every GPU), 2 bytes a parameter the memory plan would have to hold;
        # off, each cast goes with its layer, the same numbers (a cast of the same weight is
        # the same bits: tests/training/test_precision.py; the 0.7B parity run on 2 GPUs was
        # bit-identical with it on and off)
        accelerator.autocast_handler = AutocastKwargs(cache_enabled=False)
    if kind == DistributedType.FSDP and numerics.autocast:
        layers = torch.bfloat16 if gather == "bfloat16" else None
        reduce = getattr(torch, numerics.reduce)
        plugin = accelerator.state.fsdp_plugin
        if plugin.fsdp_version == 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            plugin.mixed_precision_policy = MixedPrecisionPolicy(
                param_dtype=layers, reduce_dtype=reduce
            )
            split = gather == "bf16-linear" and model is not None
            if split and not shard_as_one_process(model, accelerator, reduce):
                log.warning(
                    "training.fsdp_gather bf16-linear needs a full fine-tuning in float32 with "
                    "linear layers of their own weights: gathering float32 "
                    "instead (numerics.gather_in_use says which)"
                )
        else:
            from torch.distributed.fsdp import MixedPrecision

            plugin.mixed_precision_policy = MixedPrecision(param_dtype=layers, reduce_dtype=reduce)
    elif kind == DistributedType.DEEPSPEED:
        names = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
        config = accelerator.state.deepspeed_plugin.deepspeed_config
        config["communication_data_type"] = names[numerics.reduce]
        # DeepSpeed's bf16 mode would also sum a step's micro-batches in bf16 (its
        # grad_accum_dtype defaults to the module's dtype); one process sums them in float32
        config.setdefault("data_types", {})["grad_accum_dtype"] = names[numerics.reduce]


def _casts_to_bf16(module: Any) -> bool:
    """Whether bf16 autocast casts every use of the module's own weights to bf16 (a plain
    `torch.nn.Linear`: `linear` is on autocast's lower-precision list, its weight and bias cast
    with its input); subclasses and every other module (embeddings, norms) are not assumed to."""
    import torch

    return type(module) is torch.nn.Linear


def shard_as_one_process(model: Any, accelerator: Any, reduce: Any) -> int:
    """FSDP2 units for a float32 model under bf16 autocast that compute what one process
    computes, bit for bit, with about half the gathered bytes: each plain linear layer but the
    head (the trainers' fused log-probabilities read its weight directly) becomes its own unit
    whose weights are cast to bf16 before they are gathered (the cast autocast makes after the
    gather in one process: the same bits), its float32 input left uncast; every other weight
    (embeddings, norms, the head) stays in the units accelerate makes next (the decoder layers,
    the root), gathered in float32 by the plugin's policy as one process uses it. The units are
    cut at the linear layers only: FSDP passes a unit's inputs through an autograd function, and
    at a norm's input that regroups the residual stream's gradient sum (float32 rounding, which
    the backward's bf16 casts turn into one-ulp differences of single gradient elements), while
    at a linear layer's input the gradients of its branches reach the shared tensor in the order
    one process adds them. Done before accelerate wraps the model. Returns the units made; 0, the
    plugin's policy then gathering everything in float32, where the model is not all trainable
    float32 weights, is already sharded, shares a linear layer's weights with another module,
    or the plugin loads weights on one process only (`cpu_ram_efficient_loading`)."""
    import torch
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    plugin = accelerator.state.fsdp_plugin
    parameters = list(model.parameters())
    if (
        getattr(plugin, "cpu_ram_efficient_loading", False)
        or not parameters
        or any(not p.requires_grad or p.dtype != torch.float32 for p in parameters)
        or any(isinstance(m, FSDPModule) for m in model.modules())
    ):
        return 0
    head = getattr(model, "get_output_embeddings", lambda: None)()
    linears = [m for m in model.modules() if _casts_to_bf16(m) and m is not head]
    owners: dict[int, int] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    if not linears or any(owners[id(p)] > 1 for m in linears for p in m.parameters()):
        return 0
    mesh = getattr(accelerator, "torch_device_mesh", None)
    if mesh is not None:
        mesh = mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)]
    in_bf16 = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=reduce, cast_forward_inputs=False
    )
    for module in linears:
        fully_shard(
            module, mesh=mesh, mp_policy=in_bf16, reshard_after_forward=plugin.reshard_after_forward
        )
    return len(linears)


def _fsdp_policy(model: Any) -> Any:
    """The mixed-precision policy of an FSDP2-wrapped model (its first sharded module's), or
    None."""
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        if state is not None:
            return state()._mp_policy
    return None


def _trainable_dtype(model: Any) -> str:
    trainable = [p for p in model.parameters() if p.requires_grad]
    return str(trainable[0].dtype).removeprefix("torch.") if trainable else "none"


def reduce_dtype_in_use(model: Any) -> str:
    """The dtype the wrapped model's gradients are reduced in across processes, read from it:
    FSDP2's policy (its layers' own, else the gradients follow the parameters), DeepSpeed's
    communication dtype, else (DDP, one process) the trainable parameters' dtype."""
    import torch

    policy = _fsdp_policy(model)
    if policy is not None and (policy.reduce_dtype or policy.param_dtype) is not None:
        return str(policy.reduce_dtype or policy.param_dtype).removeprefix("torch.")
    engine_dtype = getattr(model, "communication_data_type", None)
    if isinstance(engine_dtype, torch.dtype):
        return str(engine_dtype).removeprefix("torch.")
    return _trainable_dtype(model)


def gather_dtype_in_use(model: Any) -> str | None:
    """The dtype FSDP gathers the wrapped model's weights in for the forward, or None for a
    model FSDP does not shard: one dtype when every unit gathers alike (a policy's parameter
    dtype, else the weights' own), `bfloat16 linear, float32 others` for the units
    `shard_as_one_process` makes."""
    dtypes = set()
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        if state is None:
            continue
        dtype = state()._mp_policy.param_dtype
        params = [p for p in module.parameters() if p.dtype.is_floating_point]
        if dtype is None and params:
            dtype = params[0].dtype
        if dtype is not None:
            dtypes.add(str(dtype).removeprefix("torch."))
    if not dtypes:
        return None if _fsdp_policy(model) is None else _trainable_dtype(model)
    if dtypes == {"bfloat16", "float32"}:
        return "bfloat16 linear, float32 others"
    return dtypes.pop() if len(dtypes) == 1 else ", ".join(sorted(dtypes))


def wrapping_in_use(wrapped: Any, model: Any) -> str:
    """How the trainer distributed the model, read from it (not from the plan): fsdp (FSDP2's
    sharded modules; hybrid: on a 2-D mesh, replicas x shards), zero<stage> (DeepSpeed's
    engine), ddp, or none (one process). accelerate runs an FSDP config on CPU processes as
    ddp: this says which one trained."""
    stage = getattr(wrapped, "zero_optimization_stage", None)
    if callable(stage):
        return f"zero{stage()}"
    if model is not None and any(hasattr(m, "_get_fsdp_state") for m in model.modules()):
        mesh = getattr(next(model.parameters(), None), "device_mesh", None)
        return "hybrid" if mesh is not None and mesh.ndim == 2 else "fsdp"
    if type(wrapped).__name__ == "DistributedDataParallel":
        return "ddp"
    return "none"


def reduce_probe(sharding: str | None = None) -> Any:
    """A TrainerCallback whose `.seen` is the reduce dtype of the wrapped model at the start of
    training, `.gathered` FSDP's gather dtype (`gather_dtype_in_use`) and `.wrapped` how it is
    distributed (`wrapping_in_use`; None before); set its
    `.trainer` to read DeepSpeed's engine and DDP's wrapper, which the callbacks' `model` (the
    module inside them) does not show. With `sharding` fsdp, zero3 or hybrid (the plan's, on
    several processes), a model wrapped otherwise stops the run before its first step
    (ShardingError):
    an unsharded run under a sharded label is a silent difference in memory and numerics."""
    from transformers import TrainerCallback

    from cobalt.training.decisions import SHARDED, ShardingError

    class Probe(TrainerCallback):
        seen: str | None = None
        gathered: str | None = None
        wrapped: str | None = None
        trainer: Any = None

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            engine = getattr(self.trainer, "model_wrapped", None)
            self.wrapped = wrapping_in_use(engine, model)
            if sharding in SHARDED and self.wrapped != sharding:  # hybrid: a 2-D FSDP mesh
                raise ShardingError(
                    f"training.sharding {sharding} was planned, but accelerate wrapped the model "
                    f"as {self.wrapped}: check the launch's accelerate config and devices, or "
                    "pass --sharding ddp"
                )
            if hasattr(engine, "communication_data_type"):
                model = engine
            if model is not None:
                self.seen = reduce_dtype_in_use(model)
                self.gathered = gather_dtype_in_use(model)

    return Probe()
