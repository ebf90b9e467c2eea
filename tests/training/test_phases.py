"""A GRPO run's summary names the split of its GPUs that balances the phases it measured
(`cobalt.training.reporting.phases.split_phrase`): for a synchronous run with vLLM colocated on 2+
GPUs of
one node only, at the medians of its steps after the first."""

from __future__ import annotations

from cobalt.training.reporting.phases import split_phrase

# goal 1's synchronous run on 4x H200 (docs/SCALING.md): generation 8.3 s, optimisation 19.3 s
TIMING = {
    "step_s": [36.7, 29.9, 30.1],
    "generation_step_s": [12.0, 8.3, 8.3],
    "optimisation_step_s": [22.0, 19.3, 19.3],
}
PLAN = {
    "generation": "vllm_colocate",
    "processes": 4,
    "nodes": 1,
    "one_step_off": False,
    "server_gpus": 0,
}


def test_a_synchronous_colocated_run_names_its_balanced_split() -> None:
    assert split_phrase({"plan": PLAN, "timing": TIMING}) == (
        "phases balance at --gpus 3 --vllm-server-gpus 1 --async (generation ~33.2 s beside "
        "optimisation ~25.7 s a step at this run's rates, against 30.0 s); "
    )
    even = {**TIMING, "generation_step_s": [1.0, 19.3, 19.3]}
    assert "--gpus 2 --vllm-server-gpus 2 --async" in split_phrase({"plan": PLAN, "timing": even})


def test_no_split_is_named_where_none_applies() -> None:
    for plan in (
        {**PLAN, "processes": 1},  # one GPU
        {**PLAN, "one_step_off": True},  # already overlapped
        {**PLAN, "server_gpus": 1, "processes": 3},  # already split
        {**PLAN, "generation": "transformers"},  # no vLLM to put on GPUs of its own
        {**PLAN, "nodes": 2},  # the stage's server is for one node
    ):
        assert split_phrase({"plan": plan, "timing": TIMING}) == "", plan
    assert split_phrase({"plan": PLAN, "timing": {}}) == ""
    assert split_phrase({}) == ""
