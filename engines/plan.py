"""Where a generating stage runs: the engine kind `auto` picks for its model, how many GPUs it
generates on and the Python clients that needs, decided before any work (`plan_engine`) and
followed by the engine the stage makes. A client that is missing fails here, in one line, not
after N vLLM engines have loaded (`--gpus 4` serves vLLM and reaches it through LiteLLM).

| kind | GPUs | clients |
| --- | --- | --- |
| transformers | 1 (this process; a tiny model: vLLM's start-up costs more than it saves) | none |
| vllm, 1 engine | tensor_parallel_size | vllm |
| vllm, N engines | N x tensor_parallel_size (`vllm serve --data-parallel-size N`) | vllm, litellm |
| litellm | none here (a served model) | litellm |
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from .config import EngineConfig

INSTALL = {
    "vllm": "install the GPU extra (pip install -e '.[gpu]') on a CUDA machine, use the "
    "transformers engine (or auto), or serve the model elsewhere (vllm serve) and use the "
    "litellm engine with its api_base",
    "litellm": "pip install litellm (the GPU extra has it)",
}
NAMES = {"vllm": "vLLM", "litellm": "LiteLLM"}


class MissingClientError(RuntimeError):
    """A client the engine needs is not importable; the message names the setting and the fix."""


@dataclass(frozen=True)
class EnginePlan:
    kind: str  # transformers, vllm or litellm (auto decided)
    gpus: int  # GPUs the stage generates on
    engines: int  # vLLM engines (data parallel); 1 for the others
    clients: tuple[str, ...]
    reason: str = ""  # why auto picked the kind

    def describe(self) -> str:
        if self.kind == "litellm":
            where = "a served model"
        elif self.kind == "transformers":
            where = "1 GPU" if self.gpus else "the CPU"
        elif self.engines > 1:
            where = f"{self.gpus} GPUs (vllm serve --data-parallel-size {self.engines})"
        else:
            where = f"{self.gpus} GPU{'s' if self.gpus > 1 else ''}"
        clients = f"; needs {', '.join(self.clients)}" if self.clients else ""
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.kind}{why} on {where}{clients}"


def plan_engine(config: EngineConfig, *, gpus: int, parameters: int | None = None) -> EnginePlan:
    """The plan of `config` on a machine with `gpus` visible GPUs; `parameters` stands for a
    model not built yet (auto's choice). Raises GPUCountError for more vLLM engines than GPUs."""
    from . import choose, resolve_data_parallel

    reason = ""
    kind = config.kind
    if kind == "auto":
        choice = choose(config.model, parameters=parameters, gpu=gpus > 0)
        kind, reason = choice.kind, choice.reason
    if kind == "vllm":
        engines = resolve_data_parallel(config.model_copy(update={"kind": kind}), gpus=gpus)
        clients = ("vllm", "litellm") if engines > 1 else ("vllm",)
        return EnginePlan(kind, engines * config.tensor_parallel_size, engines, clients, reason)
    if kind == "litellm":
        return EnginePlan(kind, 0, 1, ("litellm",), reason)
    on_gpu = (gpus > 0 and config.device == "auto") or config.device.startswith("cuda")
    return EnginePlan(kind, int(on_gpu), 1, (), reason)


def installed(module: str) -> bool:
    """`module` importable here (without importing it)."""
    return importlib.util.find_spec(module) is not None


def check_clients(plan: EnginePlan, setting: str = "engine") -> None:
    """Every client of `plan` importable here, else MissingClientError naming what to do."""
    for client in plan.clients:
        if installed(client):
            continue
        name = NAMES.get(client, client)
        if client == "litellm" and plan.kind == "vllm":
            raise MissingClientError(
                f"{setting} vllm on {plan.gpus} GPUs is served (vllm serve --data-parallel-size "
                f"{plan.engines}) and reached through LiteLLM, which is not installed here: "
                f"{INSTALL[client]}, or generate on one GPU (--gpus 1)"
            )
        raise MissingClientError(
            f"{setting} {plan.kind}: {name} is not installed here: {INSTALL[client]}"
        )
