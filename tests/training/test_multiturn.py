"""Multi-turn online GRPO: the rollout on the tiny model's real `GRPOTrainer` and a real sandbox
(namespace backend), and two optimizer steps of TRL's trainer with it (CPU).

Most checks sample from a script (the trainer's sampler replaced by one returning fixed texts'
tokens) so programs, feedback and token boundaries are known: the feedback is compared with what
the trajectory stage writes for the same programs (`collect_multiturn` with the same script),
and the sequence with the chat template's rendering of the whole conversation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from cobalt.bandit.rows import prepare_rows
from cobalt.problems import Problem, Provenance
from cobalt.training.machinery.trl_trainer import CobaltGRPOTrainer
from cobalt.training.method.dense_reward import dense_reward_func
from cobalt.training.method.multiturn_rollout import ProblemIndex, feedback_template, repair_rollout
from cobalt.training.method.sandbox_reward import CobaltRewards
from cobalt.training.settings import TrainingConfig
from cobalt.trajectories.collect import CollectConfig, collect_initial, collect_multiturn
from cobalt.trajectories.prompts import extract_code, first_messages
from engines import Completion, Conversation, Engine, EngineConfig, SamplingConfig, split_thinking
from sandbox import SandboxConfig
from sandbox import TestSuite as Suite

SANDBOX = SandboxConfig(backend="namespace", concurrency=2)
SYSTEM = "Solve the problem in Python."
G = 3  # conversations per problem


def make_problem(pid: str, instruction: str, public: list, hidden: list) -> Problem:
    def suite(pairs):
        return Suite(inputs=[i for i, _ in pairs], outputs=[o for _, o in pairs])

    return Problem(
        id=f"hand/{pid}",
        source="hand",
        difficulty="easy",
        statement=instruction,
        instruction=instruction,
        public_tests=suite(public),
        hidden_tests=suite(hidden),
        provenance=Provenance(dataset="hand", revision="sha256:0", row=0, kind="taco"),
    )


DOUBLE = make_problem(
    "double", "Read n, print 2n.", [("1\n", "2\n"), ("2\n", "4\n")], [("3\n", "6\n")]
)
SUM = make_problem(
    "sum", "Read a and b, print a + b.", [("1 2\n", "3\n"), ("5 7\n", "12\n")], [("0 0\n", "0\n")]
)
PROBLEMS = [DOUBLE, SUM]


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


WRONG = "n = int(input())\nprint(n + 2)"  # passes public test 2, fails test 1
FIXED = "n = int(input())\nprint(2 * n)"
ADD = "a, b = map(int, input().split())\nprint(a + b)"


class Cut(str):
    """A reply cut by the token limit (no end-of-turn token)."""


# SCRIPT[problem][sample][turn]: each turn-0 reply names its sample, for the scripted engine
SCRIPT: dict[str, list[list[str]]] = {
    DOUBLE.id: [
        [f"<think>add?</think>\nAttempt 0:\n{fenced(WRONG)}", f"Fixed.\n{fenced(FIXED)}", "Ok."],
        ["Attempt 1: no idea.", Cut(f"Let me try:\n```python\n{WRONG}"), fenced(WRONG)],
        [f"Attempt 2:\n{fenced(FIXED)}", fenced(FIXED), f"Same.\n{fenced(FIXED)}"],
    ],
    SUM.id: [
        [f"Attempt 0:\n{fenced('print(3)')}", fenced(ADD), fenced(ADD)],
        [f"Attempt 1:\n{fenced(ADD)}", fenced("print(3)"), fenced("print(")],
        ["Attempt 2: ```python\nprint(12)\n```", "", f"Now:\n{fenced(ADD)}"],
    ],
}
ORDER = [(p.id, s) for p in PROBLEMS for s in range(G)]  # the rows as TRL's sampler groups them


def row(problem: Problem) -> dict:
    return {
        "prompt": first_messages(SYSTEM, problem.instruction),
        "test_cases": problem.tests.model_dump(),
        "prev_best_pass_rate": 0.0,
        "difficulty": "easy",
        "example_id": problem.id,
    }


def grpo_args(out, **changes):
    from trl import GRPOConfig

    kwargs = TrainingConfig(preset="tiny", mode="cobalt").grpo_kwargs(out)
    kwargs |= {
        "num_generations": G,
        "per_device_train_batch_size": 2 * G,
        "max_completion_length": 16,
    }
    return GRPOConfig(**(kwargs | changes))


@pytest.fixture(scope="module")
def rewards():
    with CobaltRewards(SANDBOX) as r:
        yield r


def make_trainer(model_dir, out, rewards, rollout, funcs=None, **changes):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return CobaltGRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(model_dir)),
        reward_funcs=funcs or rewards.reward_funcs(),
        args=grpo_args(out, **changes),
        train_dataset=Dataset.from_list(prepare_rows([row(p) for p in PROBLEMS], "cobalt")),
        processing_class=tokenizer,
        rollout_func=rollout,
    )


class Scripted:
    """Stands in for `trainer._generate_single_turn`: the scripted replies' tokens, by turn and
    position among the contexts (every conversation is live in these tests)."""

    def __init__(self, tokenizer, eos: int, order=ORDER):
        self.tokenizer, self.eos, self.order = tokenizer, eos, order
        self.calls: list[int] = []

    def __call__(self, contexts, images, multimodal, num_generations):
        assert images is None and num_generations == 1
        turn = len(self.calls) % 3  # one rollout of 2 feedback turns after another
        self.calls.append(len(contexts))
        out = []
        for pid, sample in self.order[: len(contexts)]:
            text = SCRIPT[pid][sample][turn]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(ids if isinstance(text, Cut) else [*ids, self.eos])
        return out, None


class ScriptedEngine(Engine):
    """The same script for the trajectory stage: problem by instruction, sample by its turn-0
    reply's name, turn by the assistant turns so far."""

    kind = "scripted"

    def __init__(self):
        super().__init__(EngineConfig(kind="transformers", model="scripted"))

    def generate(self, conversations: Sequence[Conversation], sampling: SamplingConfig):
        by_instruction = {p.instruction: p.id for p in PROBLEMS}
        out = []
        for conversation in conversations:
            pid = by_instruction[conversation[1]["content"]]
            answers = [m["content"] for m in conversation if m["role"] == "assistant"]
            samples = range(sampling.n) if not answers else [int(answers[0].split()[1][0])]
            replies = [SCRIPT[pid][s][len(answers)] for s in samples]
            out.append(
                [
                    Completion(text=r, finish_reason="length" if isinstance(r, Cut) else "stop")
                    for r in replies
                ]
            )
        return out


@pytest.fixture(scope="module")
def scripted_run(tiny_model, tmp_path_factory, rewards):
    """One scripted rollout over the two problems (G conversations each), with its trainer."""
    rollout = repair_rollout(PROBLEMS, rewards.judge, turns=2)
    trainer = make_trainer(tiny_model, tmp_path_factory.mktemp("mt"), rewards, rollout)
    script = Scripted(trainer.processing_class, trainer.eos_token_ids[0])
    trainer._generate_single_turn = script
    prompts = [first_messages(SYSTEM, p.instruction) for p in PROBLEMS for _ in range(G)]
    return trainer, rollout(prompts, trainer), script


def test_rollout_programs_and_group_order(scripted_run) -> None:
    _, out, script = scripted_run
    assert script.calls == [2 * G] * 3  # 3 turns, every conversation each time
    assert out["logprobs"] is None  # transformers sampling reports none
    for i, (pid, sample) in enumerate(ORDER):
        expected = [extract_code(split_thinking(t)) for t in SCRIPT[pid][sample]]
        assert out["programs"][i] == expected, (pid, sample)
        assert out["program"][i] == expected[-1]  # the last turn's program is rewarded
        assert out["response"][i] == SCRIPT[pid][sample][-1]
    assert out["program"][1] == WRONG and out["programs"][1][1] is None  # cut turn: no code


def test_feedback_is_the_trajectory_stages(scripted_run, rewards, tmp_path) -> None:
    """The same programs through `collect_multiturn` give the same feedback turns."""
    _, out, _ = scripted_run
    config = CollectConfig(sampling=SamplingConfig(n=G, seed=0), turns=2, system_prompt=SYSTEM)
    engine = ScriptedEngine()
    initial, _ = collect_initial(PROBLEMS, engine, config, tmp_path / "initial.jsonl")
    records, _ = collect_multiturn(
        PROBLEMS, initial, engine, rewards.judge, config, tmp_path / "multiturn.jsonl"
    )
    for i, (pid, sample) in enumerate(ORDER):
        turns = records[pid].samples[sample].turns
        assert [t.code for t in turns] == out["programs"][i]
        assert out["feedback"][i] == [t.feedback for t in turns[:2]]
    # spot checks of the feedback itself
    double_0 = out["feedback"][0]
    assert "failed test 1 of 2" in double_0[0] and "passed all 2 public tests" in double_0[1]
    assert "no fenced code block" in out["feedback"][1][0]  # prose only
    assert "no fenced code block" in out["feedback"][1][1]  # cut before the closing fence
    assert "failed test 2 of 2" in out["feedback"][3][0]  # SUM's print(3): its own tests


def test_sequence_is_the_templates_rendering_and_masks_feedback(scripted_run) -> None:
    trainer, out, _ = scripted_run
    tokenizer = trainer.processing_class
    for i, (pid, sample) in enumerate(ORDER):
        replies, feedback = SCRIPT[pid][sample], out["feedback"][i]
        messages = first_messages(SYSTEM, PROBLEMS[i // G].instruction)
        for t, reply in enumerate(replies):
            messages.append({"role": "assistant", "content": reply})
            if t < len(feedback):
                messages.append({"role": "user", "content": feedback[t]})
        rendered = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
        sequence = out["prompt_ids"][i] + out["completion_ids"][i]
        assert rendered[: len(sequence)] == sequence, (pid, sample)
        assert tokenizer.decode(rendered[len(sequence) :]) == "\n"  # the template's last newline
        # env_mask: 1 on each reply's tokens and its end-of-turn token, 0 on the feedback turns
        # (and on the closing token given to a cut reply: it was not sampled)
        expected = []
        for t, reply in enumerate(replies):
            n = len(tokenizer(reply, add_special_tokens=False)["input_ids"])
            expected += [1] * (n if isinstance(reply, Cut) else n + 1)
            if t < len(feedback):
                _, suffix = feedback_template(trainer, feedback[t])
                expected += [0] * (int(isinstance(reply, Cut)) + len(suffix))
        mask, ids = out["env_mask"][i], out["completion_ids"][i]
        assert mask == expected, (pid, sample)
        masked = tokenizer.decode([x for x, m in zip(ids, mask, strict=True) if not m])
        assert all(f in masked for f in feedback)
        assert masked.count("<|im_start|>user") == len(feedback)


def test_rewards_of_the_rollout_rows(scripted_run, rewards) -> None:
    """`correctness` and `dense` judge the rollout's `program`, not the decoded completion
    (which holds the feedback text and its own code fences)."""
    _, out, _ = scripted_run
    tests = [p.tests.model_dump_json() for p in PROBLEMS for _ in range(G)]
    completions = [[{"role": "assistant", "content": "```python\nprint(2)\n```"}]] * (2 * G)
    (correctness,) = rewards.reward_funcs()
    got = correctness(
        completions=completions,
        test_cases=tests,
        prev_best_pass_rate=[0.0] * (2 * G),
        program=out["program"],
    )
    # DOUBLE: none (-1: "Ok." has no code), WRONG passes 1 of 3 (0.0), FIXED (1.0);
    # SUM: ADD (1.0), "print(" fails all (-0.1), ADD (1.0)
    assert got == [-1.0, 0.0, 1.0, 1.0, -0.1, 1.0]
    dense = dense_reward_func(rewards, num_generations=G, scale=1.0)
    # DOUBLE: s = none, [F,T,F], [T,T,T] -> rho = 1/3, 2/3, 1/3 -> w = 2/5, 1/5, 2/5: WRONG 1/5
    assert dense(completions=completions, test_cases=tests, program=out["program"]) == (
        pytest.approx([0.0, 0.2, 0.0, 0.0, 0.0, 0.0])
    )


def test_a_long_conversation_stops_and_every_turn_samples(scripted_run, rewards) -> None:
    trainer, first, _ = scripted_run
    limit = min(len(p) for p in first["prompt_ids"]) + 4  # no feedback turn fits
    short = repair_rollout(PROBLEMS, rewards.judge, turns=2, max_context_tokens=limit)
    script = Scripted(trainer.processing_class, trainer.eos_token_ids[0])
    trainer._generate_single_turn = script
    prompts = [first_messages(SYSTEM, p.instruction) for p in PROBLEMS for _ in range(G)]
    out = short(prompts, trainer)
    # turns 1 and 2 still sample once each (a placeholder, dropped): every process samples
    # every turn, so vLLM's and sharded models' collectives stay matched
    assert script.calls == [2 * G, 1, 1]
    assert [len(p) for p in out["programs"]] == [1] * (2 * G)
    assert out["feedback"] == [[]] * (2 * G)
    assert all(set(m) == {1} for m in out["env_mask"])
    assert out["program"] == [p[0] for p in out["programs"]]


def test_rows_templates_and_problems_that_cannot_be_used(scripted_run, rewards) -> None:
    trainer, _, _ = scripted_run
    rollout = repair_rollout([DOUBLE], rewards.judge)
    later = [*first_messages(SYSTEM, DOUBLE.instruction), {"role": "assistant", "content": "x"}]
    with pytest.raises(ValueError, match="multi_turn rows must be turn-0 contexts"):
        rollout([later], trainer)
    with pytest.raises(KeyError, match="no problem has the instruction 'Read a and b"):
        rollout([first_messages(SYSTEM, SUM.instruction)], trainer)
    twin = DOUBLE.model_copy(update={"id": "hand/twin"})
    assert ProblemIndex([DOUBLE, twin]).find(first_messages(SYSTEM, DOUBLE.instruction)) is DOUBLE
    other = twin.model_copy(update={"public_tests": SUM.public_tests})
    index = ProblemIndex([DOUBLE, other])  # fine until a prompt needs the instruction alone
    assert index.find(first_messages(SYSTEM, DOUBLE.instruction), "hand/twin") is other
    with pytest.raises(ValueError, match="hand/double and hand/twin have the same instruction"):
        index.find(first_messages(SYSTEM, DOUBLE.instruction))
    # a template that ends an assistant turn with no end-of-sequence token cannot be continued
    plain = SimpleNamespace(
        processing_class=trainer.processing_class,
        chat_template="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
        chat_template_kwargs={},
        eos_token_ids=trainer.eos_token_ids,
    )
    with pytest.raises(ValueError, match="closed with one of the model's end-of-sequence"):
        feedback_template(plain, "Your program failed.")


def test_problems_sharing_a_statement_get_feedback_from_their_own_tests(
    scripted_run, rewards
) -> None:
    """Two problems with one statement and other public tests (the synthetic kinds, duplicated
    TACO statements): the rows' example ids, which CobaltGRPOTrainer hands the rollout, decide
    whose tests give feedback."""
    trainer, _, _ = scripted_run
    twin = DOUBLE.model_copy(
        update={
            "id": "hand/twin",
            "public_tests": Suite(inputs=["5\n", "6\n"], outputs=["10\n", "13\n"]),
        }
    )
    rollout = repair_rollout([DOUBLE, twin], rewards.judge, turns=1)
    order = [(DOUBLE.id, s) for s in range(G)] * 2  # the same replies for both problems
    trainer._generate_single_turn = Scripted(
        trainer.processing_class, trainer.eos_token_ids[0], order
    )
    prompts = [first_messages(SYSTEM, DOUBLE.instruction)] * (2 * G)
    trainer.batch_example_ids = [DOUBLE.id] * G + [twin.id] * G
    try:
        out = rollout(prompts, trainer)
    finally:
        trainer.batch_example_ids = None
    # sample 2 writes 2n first: it passes DOUBLE's public tests, and fails the twin's 6 -> 13
    assert "passed" in out["feedback"][2][0] and "13" not in out["feedback"][2][0]
    assert "13" in out["feedback"][G + 2][0]


@pytest.mark.timeout(300)
def test_grpo_two_steps_with_the_rollout(tiny_model, tmp_path, rewards) -> None:
    """TRL's GRPOTrainer trains 2 optimizer steps with the rollout, sampling from the tiny model
    itself (transformers here; vLLM colocated where a GPU and vLLM are); TRL reads the env_mask
    (its completion lengths count only the model's tokens)."""
    inner = repair_rollout(PROBLEMS, rewards.judge, turns=2)
    seen: list[dict] = []

    def rollout(prompts, trainer):
        out = inner(prompts, trainer)
        seen.append({"prompts": prompts, "ids": trainer.batch_example_ids, **out})
        return out

    funcs = [*rewards.reward_funcs(), dense_reward_func(rewards, num_generations=G)]
    trainer = make_trainer(tiny_model, tmp_path, rewards, rollout, funcs)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        assert not math.isnan(h["loss"]) and -1.0 <= h["rewards/correctness/mean"] <= 1.0
        assert "rewards/dense/mean" in h
    assert len(seen) == 2
    tokenizer = trainer.processing_class
    for batch, step in zip(seen, steps, strict=True):
        # one group = G consecutive rows of one prompt
        firsts = batch["prompts"][::G]
        assert all(batch["prompts"][k] == firsts[k // G] for k in range(len(batch["prompts"])))
        # CobaltGRPOTrainer names each prompt's problem, in the prompts' order
        by_id = {p.id: p.instruction for p in PROBLEMS}
        assert [by_id[i] for i in batch["ids"]] == [p[-1]["content"] for p in batch["prompts"]]
        model_tokens = [sum(m) for m in batch["env_mask"]]
        assert step["completions/mean_length"] == pytest.approx(
            sum(model_tokens) / len(model_tokens)
        )
        # vLLM (colocated, on a GPU) reports each sampled token's logprob; transformers none
        assert (batch["logprobs"] is not None) == trainer.use_vllm
        for k, ids in enumerate(batch["completion_ids"]):
            assert len(batch["programs"][k]) == 3 and len(batch["feedback"][k]) == 2
            if trainer.use_vllm:
                logprobs, mask = batch["logprobs"][k], batch["env_mask"][k]
                assert len(logprobs) == len(ids)
                assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
                assert all(lp <= 0.0 for lp in logprobs) and any(lp < 0 for lp in logprobs)
            masked = tokenizer.decode(
                [x for x, m in zip(ids, batch["env_mask"][k], strict=True) if not m]
            )
            assert all(f in masked for f in batch["feedback"][k])


@pytest.mark.timeout(300)
def test_scripted_conversations_move_the_weights(tiny_model, tmp_path, rewards) -> None:
    """With the scripted replies a group's rewards differ, so the advantages are not zero: the
    two steps have a gradient and change the weights (the tiny model's own samples hold no
    program, every reward is -1 and GRPO has nothing to learn from)."""
    import torch

    trainer = make_trainer(tiny_model, tmp_path, rewards, repair_rollout(PROBLEMS, rewards.judge))
    trainer._generate_single_turn = Scripted(trainer.processing_class, trainer.eos_token_ids[0])
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in steps] == [1, 2]
    assert all(h["grad_norm"] > 0 and h["reward_std"] > 0 for h in steps)
    after = list(trainer.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
