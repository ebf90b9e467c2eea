"""Problems whose statements make prompts of a given length (the paper-recipe GPU runs): the first
rows of the bundled synthetic set (a TACO-style JSONL the data flow reads as `:taco`), each
statement lengthened with a background section to about --tokens tokens in the tiny tokenizer
(the tokenizer of the 8B-shaped random models, engines/tiny.py), so the training stage's turn-0
prompts are as long as the paper's (10,240-token limit) or as short as verl's GSM8K run.

    python scripts/gpu/long_problems.py --tokens 9600 --count 4 --out /root/long.jsonl
    python scripts/gpu/long_problems.py --tokens 100 --count 256 --out /root/short.jsonl

More problems than the source holds are its rows again, each a numbered case of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PIECE = (
    "Background: the judges prepared this task from a log of measurements taken over many days; "
    "each line of the log was checked twice and the values were rounded to whole numbers. "
)


def lengthen(question: str, tokens: int, count) -> str:
    """`question` after a background section, about `tokens` tokens in all (`count` counts)."""
    if tokens <= count(question):
        return question
    per_piece = max(1, count(PIECE * 8) // 8)
    pieces = max(0, (tokens - count(question)) // per_piece)
    while pieces and count(PIECE * pieces + "\n\n" + question) > tokens:
        pieces -= 1
    return (PIECE * pieces + "\n\n" + question) if pieces else question


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, required=True, help="statement length (tokens)")
    parser.add_argument("--count", type=int, default=4, help="problems")
    parser.add_argument("--source", type=Path, default=ROOT / "samples/synthetic_train.jsonl")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from engines.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = AutoTokenizer.from_pretrained(
            str(build_tiny_model(Path(tmp), save_weights=False))
        )

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    source = [json.loads(line) for line in args.source.read_text().splitlines()]
    rows = []
    for i in range(args.count):
        row = dict(source[i % len(source)])
        case = f"Case {i // len(source) + 1}. " if i >= len(source) else ""
        row["question"] = lengthen(case + row["question"], args.tokens, count)
        row["id"] = f"{row['id']}-{i}-len{args.tokens}"
        rows.append(row)
    with args.out.open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    print(f"{len(rows)} problems of about {args.tokens} tokens in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
