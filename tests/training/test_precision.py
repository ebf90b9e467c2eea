"""Numerics of training (cobalt.training.machinery.precision): a bf16 checkpoint trains with fp32
master weights, so every Adam update at the paper's learning rate lands; pure bf16 (only when
asked) loses most of them; the saved model keeps the checkpoint's dtype. Real trainers, CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from cobalt.training.decisions import checkpoint_dtype, decide
from cobalt.training.settings import OfflineSettings, TrainingConfig

LR = 1e-6  # METHOD §1.6
PROMPT = [{"role": "user", "content": "Print the sum of two integers."}]


def offline_rows() -> list[dict]:
    common = {"prompt": PROMPT, "stopped": True, "turn": 0, "example_id": "p"}
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    return [
        {**common, "completion": good, "reward": 1.0, "advantage": 1.0, "sample": 0},
        {**common, "completion": "I think it is 3.", "reward": -1.0, "advantage": -1.0},
    ]


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory) -> Path:
    """The tiny model saved as the paper's models ship: bfloat16 weights, config dtype bf16."""
    from transformers import AutoModelForCausalLM

    from engines.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("bf16") / "model", seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16)
    model.save_pretrained(str(path))
    assert checkpoint_dtype(path) == "bfloat16"
    return path


class Moves(TrainerCallback):
    """Per optimizer step: the trainable parameters' dtypes, and how far each weight with a
    nonzero gradient moved (read before and after the optimizer's update)."""

    def __init__(self) -> None:
        self.dtypes: set[str] = set()
        self.before: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.moved: list[torch.Tensor] = []  # |delta| of weights whose gradient was nonzero
        self.grads: list[torch.Tensor] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        for name, p in model.named_parameters():
            if p.requires_grad:
                self.dtypes.add(str(p.dtype).removeprefix("torch."))
                if p.grad is not None:
                    self.before[name] = (
                        p.detach().float().clone(),
                        p.grad.detach().float().clone(),
                    )

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        for name, p in model.named_parameters():
            if name in self.before:
                old, grad = self.before.pop(name)
                nonzero = grad != 0
                self.moved.append((p.detach().float() - old)[nonzero].abs())
                self.grads.append(grad[nonzero].abs())


def offline_config(precision: str) -> TrainingConfig:
    return TrainingConfig(
        mode="offline",
        precision=precision,
        max_steps=1,
        report_to=[],
        offline=OfflineSettings(objective="awr", batch_size=2, learning_rate=LR),
    )


def test_master_weights_keep_fp32_and_every_update_lands(bf16_checkpoint, tmp_path) -> None:
    """One AdamW step at lr 1e-6 from a bf16 checkpoint: the trainable weights are fp32 master
    copies, and every weight whose gradient is not tiny moves by lr (Adam's first step is
    lr * g / (|g| + eps)); the saved model is bf16 again."""
    from safetensors.torch import load_file

    from cobalt.training.offline import train_offline

    moves = Moves()
    run = train_offline(offline_config("auto"), offline_rows(), bf16_checkpoint, tmp_path, [moves])
    assert moves.dtypes == {"float32"}
    assert run.numerics["trainable"] == "float32" and run.numerics["saved"] == "bfloat16"
    moved, grads = torch.cat(moves.moved), torch.cat(moves.grads)
    clear = grads > 1e-5  # Adam's eps (1e-8) is negligible beside these
    assert clear.sum() > 10_000
    # each by lr, up to fp32's spacing at the weight (about 1e-7 at 1.0: the norm weights)
    assert ((moved[clear] > 0.5 * LR) & (moved[clear] < 1.5 * LR)).all()
    assert moved[clear].median().item() == pytest.approx(LR, rel=0.01)
    assert (moved > 0).float().mean() > 0.99  # practically every weight with a gradient moved
    assert checkpoint_dtype(tmp_path) == "bfloat16"
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert {t.dtype for t in weights.values() if t.is_floating_point()} == {torch.bfloat16}


def test_pure_bf16_loses_most_updates_at_the_papers_learning_rate(bf16_checkpoint, tmp_path):
    """What fp32 master weights prevent: in pure bf16 (asked for explicitly) most updates of
    1e-6 are below a weight's resolution and vanish."""
    from cobalt.training.offline import train_offline

    moves = Moves()
    run = train_offline(offline_config("bf16"), offline_rows(), bf16_checkpoint, tmp_path, [moves])
    assert moves.dtypes == {"bfloat16"} and run.numerics["precision"] == "bf16"
    moved = torch.cat(moves.moved)
    assert (moved > 0).float().mean() < 0.2


def test_grpo_trains_fp32_master_weights_and_saves_the_checkpoints_dtype(
    bf16_checkpoint, tmp_path
) -> None:
    """TRL's GRPOTrainer gets the same numerics: fp32 trainable weights from a bf16 checkpoint,
    the run's stats say so, the saved model is bf16."""
    from cobalt.training.grpo import train
    from sandbox import SandboxConfig, TestSuite

    moves = Moves()
    rows = [
        {
            "prompt": PROMPT,
            "test_cases": TestSuite(inputs=["1 2\n"], outputs=["3\n"]).model_dump(),
            "prev_best_pass_rate": 0.0,
        }
    ]
    config = TrainingConfig(
        mode="single_turn",
        max_steps=1,
        report_to=[],
        sandbox=SandboxConfig(backend="namespace", concurrency=2),
        overrides={"learning_rate": LR},
    )
    run = train(config, rows, bf16_checkpoint, tmp_path, callbacks=[moves])
    assert moves.dtypes == {"float32"}
    assert run.numerics == {
        "precision": "fp32",
        "trainable": "float32",
        "compute": "float32",
        "frozen": "float32",
        "saved": "bfloat16",
        "checkpoint": "bfloat16",
        "reduce": "float32",
        "reduce_in_use": "float32",
        "gather_in_use": None,  # not sharded
        "wrapped_as": "none",  # one process: no wrapper
        "gradient_sync": "step",  # accelerate's default: no_sync until a step's last micro-batch
    }
    assert checkpoint_dtype(tmp_path) == "bfloat16"


def test_the_numerics_table() -> None:
    """auto: mixed on a GPU with the paper preset (fp32 master, bf16 autocast, frozen base in the
    checkpoint's dtype), fp32 otherwise (mixed on a CPU only when asked); bf16 only when asked."""
    mixed = decide("auto", "bfloat16", gpu=True, mixed=True)
    assert (mixed.precision, mixed.trainable, mixed.compute, mixed.frozen, mixed.saved) == (
        "mixed",
        "float32",
        "bf16 autocast",
        "bfloat16",
        "bfloat16",
    )
    assert mixed.trainer_kwargs() == {"bf16": True, "fp16": False}
    assert decide("auto", "bfloat16", gpu=True, mixed=False).precision == "fp32"
    assert decide("auto", "float32", gpu=False, mixed=True).trainable == "float32"
    assert decide("mixed", "float32", gpu=True, mixed=False).frozen == "bfloat16"
    pure = decide("bf16", "float32", gpu=True, mixed=True)
    assert (pure.trainable, pure.saved, pure.trainer_kwargs()["bf16"]) == (
        "bfloat16",
        "float32",
        False,
    )
    on_cpu = decide("mixed", "bfloat16", gpu=False, mixed=True)  # asked for: CPU autocast
    assert (on_cpu.trainable, on_cpu.compute) == ("float32", "bf16 autocast")


def test_trainer_precision_is_owned_by_one_setting() -> None:
    with pytest.raises(ValueError, match=r"overrides bf16: set training.precision"):
        TrainingConfig(overrides={"bf16": True})
    kwargs = TrainingConfig(preset="paper").grpo_kwargs("out")
    assert kwargs["bf16"] is torch.cuda.is_available() and kwargs["fp16"] is False


def test_fsdp_gathers_the_master_weights_and_reduces_in_float32_under_mixed_precision() -> None:
    """accelerate's FSDP policy for --mixed_precision bf16 gathers the layers in bf16 and
    reduce-scatters the gradients in bf16; `set_distributed_numerics` gathers the float32 master
    weights (autocast computes in bf16, as in one process) and reduces in float32 (pure bf16
    stays bf16)."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    from cobalt.training.decisions import decide
    from cobalt.training.machinery.precision import set_distributed_numerics

    mixed = decide("mixed", "bfloat16", gpu=True, mixed=True)
    assert mixed.reduce == "float32" and "gradients reduced in float32" in mixed.describe()
    assert decide("bf16", "bfloat16", gpu=True, mixed=True).reduce == "bfloat16"
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision("bf16")  # what accelerate builds from the launch's flag
    assert plugin.mixed_precision_policy.reduce_dtype == torch.bfloat16
    assert plugin.mixed_precision_policy.param_dtype == torch.bfloat16
    accelerator = SimpleNamespace(
        distributed_type=DistributedType.FSDP, state=SimpleNamespace(fsdp_plugin=plugin)
    )
    set_distributed_numerics(accelerator, mixed)
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (None, torch.float32)
    assert accelerator.autocast_handler.cache_enabled is False  # no bf16 copy of every layer
    set_distributed_numerics(accelerator, mixed, "bfloat16")  # --fsdp-gather bfloat16: verl's
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    config = {"bf16": {"enabled": True}}
    deepspeed = SimpleNamespace(
        distributed_type=DistributedType.DEEPSPEED,
        state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=config)),
    )
    set_distributed_numerics(deepspeed, mixed)
    assert config["communication_data_type"] == "fp32"


def _fsdp_reduce_dtype(rank: int, port: int, results) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from cobalt.training.machinery.precision import gather_dtype_in_use, reduce_dtype_in_use

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for gather, reduce in ((torch.bfloat16, torch.bfloat16), (None, torch.float32)):
            model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
            policy = MixedPrecisionPolicy(param_dtype=gather, reduce_dtype=reduce)
            fully_shard(model[0], mesh=mesh, mp_policy=policy)
            fully_shard(model, mesh=mesh, mp_policy=policy)
            results[str(reduce)] = (gather_dtype_in_use(model), reduce_dtype_in_use(model))
        plain = torch.nn.Linear(2, 2)
        results["ddp"] = (gather_dtype_in_use(plain), reduce_dtype_in_use(plain))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_the_gather_and_reduce_dtypes_in_use_are_read_from_the_wrapped_model() -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_fsdp_reduce_dtype, args=(port, results), nprocs=1, join=True)
    assert dict(results) == {
        "torch.bfloat16": ("bfloat16", "bfloat16"),  # accelerate's own policy for bf16
        "torch.float32": ("float32", "float32"),  # the trainers': the master weights gathered
        "ddp": (None, "float32"),
    }


def _two_micro_batches(rank: int, port: int, cases: list[tuple[str, str]], results) -> None:
    """One FSDP2 process of two, for each (arch, gather) case in turn: a tiny model of `arch`
    (qwen2: biases on q, k, v; qwen3: norms of q and k inside the attention, the 8B default's
    shape) wrapped as the trainers wrap it (the policy of `gather`, then accelerate's FSDP2
    preparation), two micro-batches under CPU bf16 autocast with gradients synchronised on the
    second; rank 0 reports, under (arch, gather), the losses, the full gradients, the gather read
    back and the dtypes the head's and a linear layer's weights reach their forward in. Each case
    starts from the same seeds, so a case computes what it computes in a process of its own."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        for arch, gather in cases:
            results_of_case = _one_case(rank, arch, gather)
            if rank == 0:
                results[(arch, gather)] = results_of_case
            dist.barrier()  # both leave together, as the trainers' processes do
    finally:
        dist.destroy_process_group()


def _one_case(rank: int, arch: str, gather: str) -> tuple:
    """One case of `_two_micro_batches` on this process: what rank 0 reports."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from transformers import AutoModelForCausalLM

    from cobalt.training.machinery.precision import gather_dtype_in_use, set_distributed_numerics
    from engines.tiny import tiny_config

    torch.manual_seed(0)
    config = tiny_config(1024, 64, 2, 4, 2, 128)
    if arch == "qwen3":
        from transformers import Qwen3Config

        config = Qwen3Config(**{**config.to_dict(), "model_type": "qwen3", "head_dim": 16})
    model = AutoModelForCausalLM.from_config(config)
    model.gradient_checkpointing_enable({"use_reentrant": False})
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=True
    )
    plugin.set_mixed_precision("bf16")
    accelerator = SimpleNamespace(
        distributed_type=DistributedType.FSDP, state=SimpleNamespace(fsdp_plugin=plugin),
        torch_device_mesh=None, mixed_precision="bf16", is_main_process=rank == 0,
        device=torch.device("cpu"),
    )  # fmt: skip
    numerics = decide("mixed", "float32", gpu=True, mixed=True)
    set_distributed_numerics(accelerator, numerics, gather, model)
    seen = {}

    def note_weight_dtype(module, args) -> None:
        seen[names[module]] = str(module.weight.dtype)

    names = {model.get_submodule(n): n for n in ("lm_head", "model.layers.0.self_attn.q_proj")}
    for module in names:
        module.register_forward_pre_hook(note_weight_dtype)
    model = fsdp2_prepare_model(accelerator, model.train())
    generator = torch.Generator().manual_seed(1 + rank)
    losses = []
    for i in range(2):
        ids = torch.randint(0, 1024, (2, 16), generator=generator)
        model.set_requires_gradient_sync(i == 1)
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
    return losses, grads, gather_dtype_in_use(model), seen


CASES = [("qwen2", "float32"), ("qwen2", "bf16-linear"), ("qwen2", "bfloat16")]
CASES += [("qwen3", "float32"), ("qwen3", "bf16-linear")]


@pytest.fixture(scope="module")
def gathers() -> dict:
    """`_two_micro_batches` for every case on one pair of fresh processes: rank 0's report by
    (arch, gather). A pair killed by a signal runs once more, with a warning: torch's gloo
    backend crashed here once in CI (SIGSEGV in its network thread's malloc, cause not found in
    about 150 runs since). A Python error or a second crash fails the tests."""
    import socket
    import warnings

    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    for attempt in (1, 2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            mp.spawn(_two_micro_batches, args=(port, CASES, results), nprocs=2)
            break
        except mp.ProcessExitedException as exc:
            if exc.signal_name is None or attempt == 2:
                raise  # an exit code, not a signal, or a second crash: the tests fail
            warnings.warn(f"{exc}; run once more (gloo on CPU)", stacklevel=2)
    return dict(results)


@pytest.mark.xdist_group("precision-gathers")
def test_bf16_linear_gather_computes_what_the_float32_gather_computes(gathers) -> None:
    """`--fsdp-gather bf16-linear` casts the linear layers' float32 weights to bf16 before FSDP
    gathers them (autocast makes that cast after the gather otherwise: the same bits) and keeps
    the embeddings, norms and head in float32: the same losses and the same gradients to the
    last bit, where accelerate's bf16 gather is ~1e-2 of the largest gradient away. (Units cut at
    the norms instead regroup the residual stream's gradient sum: on an AMD EPYC CPU that moved one
    q_proj gradient element by 1.2e-3 of the largest.)"""
    results = {
        gather: gathers[("qwen2", gather)] for gather in ("float32", "bf16-linear", "bfloat16")
    }
    (
        (exact, grads, read, _),
        (split, split_grads, split_read, seen),
        (bf16, bf16_grads, bf16_read, _),
    ) = (results[g] for g in ("float32", "bf16-linear", "bfloat16"))
    assert (read, split_read, bf16_read) == (
        "float32",
        "bfloat16 linear, float32 others",
        "bfloat16",
    )
    assert split == exact and bf16 != exact
    # the trainers' fused log-probabilities read the head's weight directly: it stays float32
    assert seen == {"lm_head": "torch.float32", "model.layers.0.self_attn.q_proj": "torch.bfloat16"}

    def apart(other: dict) -> float:
        return max(float((other[k] - g).abs().max() / g.abs().max()) for k, g in grads.items())

    assert apart(split_grads) == 0.0 and apart(bf16_grads) > 1e-5


@pytest.mark.xdist_group("precision-gathers")
def test_bf16_linear_computes_the_float32_gathers_gradients_with_norms_inside_the_attention(
    gathers,
) -> None:
    """Qwen3's q and k norms sit between a linear layer and the attention, inside the decoder
    layer's float32 unit: bf16-linear still computes the float32 gather's losses and gradients
    to the bit."""
    results = {gather: gathers[("qwen3", gather)] for gather in ("float32", "bf16-linear")}
    (exact, grads, _, _), (split, split_grads, read, _) = (
        results[g] for g in ("float32", "bf16-linear")
    )
    assert read == "bfloat16 linear, float32 others"
    assert any("q_norm" in name for name in grads)
    assert split == exact
    assert all(torch.equal(split_grads[name], g) for name, g in grads.items())


def test_bf16_linear_gathers_float32_where_it_cannot_split_and_says_so(caplog) -> None:
    """A model with frozen weights (LoRA's base) is not split into float32 and bf16 units: the
    policy stays the float32 gather and the log names the setting."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from transformers import AutoModelForCausalLM

    from cobalt.training.machinery.precision import set_distributed_numerics
    from engines.tiny import tiny_config

    model = AutoModelForCausalLM.from_config(tiny_config(256, 32, 1, 2, 1, 64))
    model.get_input_embeddings().weight.requires_grad_(False)
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision("bf16")
    accelerator = SimpleNamespace(
        distributed_type=DistributedType.FSDP, state=SimpleNamespace(fsdp_plugin=plugin)
    )
    numerics = decide("mixed", "float32", gpu=True, mixed=True)
    set_distributed_numerics(accelerator, numerics, "bf16-linear", model)
    assert plugin.mixed_precision_policy.param_dtype is None  # the float32 gather
    assert "training.fsdp_gather bf16-linear needs a full fine-tuning in float32" in caplog.text


def test_autocast_runs_without_its_weight_cache_and_computes_the_same() -> None:
    """bf16 autocast keeps its cast of every trainable float32 weight until the forward ends (a
    bf16 copy of every layer; of the whole gathered model under FSDP): the trainers turn that
    cache off in every layout. No number changes: the same loss and gradients, to the bit, with
    it on and off (a cast of the same weight is the same bits), gradient checkpointing on."""
    from types import SimpleNamespace

    import torch
    from accelerate.utils import DistributedType
    from transformers import AutoModelForCausalLM, Qwen3Config

    from cobalt.training.decisions import decide
    from cobalt.training.machinery.precision import set_distributed_numerics

    config = Qwen3Config(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         intermediate_size=64)  # fmt: skip
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    runs = []
    for cache in (True, False):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.gradient_checkpointing_enable({"use_reentrant": False})
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        runs.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_on, grads_on), (loss_off, grads_off) = runs
    assert torch.equal(loss_on, loss_off)
    assert all(torch.equal(a, b) for a, b in zip(grads_on, grads_off, strict=True))
    mixed = decide("mixed", "bfloat16", gpu=True, mixed=True)
    for kind in (DistributedType.NO, DistributedType.MULTI_GPU):
        accelerator = SimpleNamespace(distributed_type=kind, autocast_handler=None)
        set_distributed_numerics(accelerator, mixed)
        assert accelerator.autocast_handler.to_kwargs() == {"cache_enabled": False}
    fp32 = SimpleNamespace(distributed_type=DistributedType.NO, autocast_handler=None)
    set_distributed_numerics(fp32, decide("fp32", "bfloat16", gpu=True, mixed=False))
    assert fp32.autocast_handler is None  # no autocast, nothing to cache
