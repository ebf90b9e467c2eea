"""Helpers of the trajectory tests: problems, a scripted LLM, a free port.

Imported as `trajectory_helpers` (pytest puts tests/trajectories on sys.path), like the data
tests' `data_helpers`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from cobalt.data.schemas import LoadConfig, normalise
from cobalt.data.source_spec import SourceSpec
from cobalt.problems import Problem, Provenance
from engines import Completion, Conversation, Engine, EngineConfig, SamplingConfig
from sandbox import TestSuite

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples"


def sample_problems(
    name: str = "apps_sample.jsonl:taco", limit: int | None = None
) -> list[Problem]:
    """Problems of a bundled sample, parsed by the data stage's normaliser (no `datasets`)."""
    spec = SourceSpec.parse(f"samples/{name}")
    path = REPO / "samples" / name.split(":")[0]
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    problems = [normalise(spec, row, i, "sha256:test", LoadConfig()) for i, row in enumerate(rows)]
    return problems[:limit] if limit else problems


def problem(
    pid: str,
    public: list[tuple[str, str]],
    hidden: list[tuple[str, str]],
    difficulty: str = "easy",
    statement: str = "Read n, print 2n.",
    perturbed: list[tuple[str, str]] | None = None,
    modified: list[tuple[str, str]] | None = None,
) -> Problem:
    def suite(pairs):
        return TestSuite(inputs=[i for i, _ in pairs], outputs=[o for _, o in pairs])

    return Problem(
        id=f"hand/{pid}",
        source="hand",
        difficulty=difficulty,
        statement=statement,
        instruction=f"[{pid}] {statement}",
        public_tests=suite(public),
        hidden_tests=suite(hidden),
        perturbed_public_tests=suite(perturbed) if perturbed else None,
        modified_tests=suite(modified) if modified else None,
        provenance=Provenance(dataset="hand", revision="sha256:0", row=0, kind="taco"),
    )


def doubling(pid: str = "double", difficulty: str = "easy") -> Problem:
    """n -> 2n; `print(n + 2)` passes public test 2 (n=2) but fails test 1 (n=1)."""
    return problem(
        pid,
        public=[("1\n", "2\n"), ("2\n", "4\n")],
        hidden=[("3\n", "6\n"), ("10\n", "20\n"), ("-4\n", "-8\n")],
        difficulty=difficulty,
    )


def block(code: str, tag: str = "python") -> str:
    return f"```{tag}\n{code}\n```"


WRONG = "n = int(input())\nprint(n + 2)"
FIXED = "n = int(input())\nprint(2 * n)"


def turn_of(conversation: Conversation) -> int:
    return sum(m["role"] == "assistant" for m in conversation)


class ScriptedEngine(Engine):
    """A test double for the LLM only: `script(conversation, sample_index)` gives the text (or a
    Completion) of each sample. Every call's conversations are kept in `calls`."""

    kind = "scripted"

    def __init__(self, script: Callable[[Conversation, int], str | Completion]):
        super().__init__(EngineConfig(kind="transformers", model="scripted"))
        self.script = script
        self.calls: list[list[Conversation]] = []
        self.samplings: list[SamplingConfig] = []

    def generate(
        self, conversations: Sequence[Conversation], sampling: SamplingConfig
    ) -> list[list[Completion]]:
        self.calls.append([list(c) for c in conversations])
        self.samplings.append(sampling)
        out = []
        for conversation in conversations:
            row = []
            for i in range(sampling.n):
                reply = self.script(conversation, i)
                if isinstance(reply, str):
                    reply = Completion(
                        text=reply,
                        finish_reason="stop",
                        prompt_tokens=10,
                        completion_tokens=len(reply.split()),
                        seconds=0.01,
                    )
                row.append(reply)
            out.append(row)
        return out


def repairing_script(conversation: Conversation, sample: int) -> str:
    """Turn 0: a wrong program (with reasoning); later turns: the fixed one."""
    if turn_of(conversation) == 0:
        return f"<think>add two?</think>\nDouble it:\n{block(WRONG)}\nOutput:\n```\n3\n```"
    return f"<think>the output must be 2n</think>\nLine 2 adds instead of doubling.\n{block(FIXED)}"
