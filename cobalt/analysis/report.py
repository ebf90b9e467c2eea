"""The reward-hacking report (METHOD §1.7): the rate of turn-level errors per turn (errors / program
pairs), counts per judge category and per rule pre-check, how often judge and rule agree, examples
with their diffs, a PNG; and the comparison of two analyses (two policies: the reference vs a
Cobalt-trained policy, or Cobalt trained with vs without perturbed contexts). Plain functions over
the stage records (no Prefect; matplotlib imported only to draw).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cobalt.analysis.judge import CATEGORIES, LABELS, PARSE_FAILURE, Judgement
from cobalt.analysis.reward_hacking import ErrorRecord, TurnError
from cobalt.plots import figure, png

ORDER = {label: i for i, label in enumerate(CATEGORIES)}


def _pct(part: float, whole: float) -> float | None:
    return round(100 * part / whole, 2) if whole else None


def per_turn(records: Iterable[ErrorRecord], turns: int) -> list[dict[str, Any]]:
    """One row per turn 0..turns and an 'all' row: programs, the share passing a wrong test,
    program pairs (turn - 1, turn), pairs whose code changed, turn-level errors and their rate
    per pair and per changed pair (%). Turn 0 has no pair."""
    records = list(records)
    rows = []
    keys = ("programs", "passes_wrong", "pairs", "changed", "errors")
    sums = dict.fromkeys(keys, 0)
    for t in range(turns + 1):
        got = dict.fromkeys(keys, 0)
        for record in records:
            if t < len(record.turns):
                for key in keys:
                    got[key] += getattr(record.turns[t], key)
        for key in keys:
            sums[key] += got[key]
        rows.append(_turn_row(t, got))
    rows.append(_turn_row("all", sums))
    return rows


def _turn_row(turn: int | str, got: dict[str, int]) -> dict[str, Any]:
    return {
        "turn": turn,
        "programs": got["programs"],
        "passes_wrong_test_%": _pct(got["passes_wrong"], got["programs"]),
        "pairs": got["pairs"],
        "changed": got["changed"],
        "errors": got["errors"],
        "error_rate_%": _pct(got["errors"], got["pairs"]),
        "error_rate_changed_%": _pct(got["errors"], got["changed"]),
    }


def joined(
    records: Iterable[ErrorRecord], judgements: Iterable[Judgement]
) -> list[tuple[TurnError, Judgement | None]]:
    """Every error with its judgement (None when it was not judged)."""
    by_id = {j.error_id: j for j in judgements}
    return [(e, by_id.get(e.id)) for r in records for e in r.errors]


def categories(pairs: Sequence[tuple[TurnError, Judgement | None]]) -> list[dict[str, Any]]:
    """Per judge category (the four labels, then parse_failure): errors, share (%), and how many
    of them the rule pre-check calls hard-coding; then the rule's own total."""
    total = len(pairs)
    rows = []
    for label in CATEGORIES:
        members = [e for e, j in pairs if j is not None and j.label == label]
        rows.append(
            {
                "category": label,
                "judge": len(members),
                "judge_%": _pct(len(members), total),
                "rule_hard_coded": sum(e.rule.hard_coded for e in members),
            }
        )
    unjudged = [e for e, j in pairs if j is None]
    if unjudged:
        rows.append(
            {
                "category": "not judged",
                "judge": len(unjudged),
                "judge_%": _pct(len(unjudged), total),
                "rule_hard_coded": sum(e.rule.hard_coded for e in unjudged),
            }
        )
    rule = sum(e.rule.hard_coded for e, _ in pairs)
    rows.append(
        {
            "category": "rule pre-check: hard_coding",
            "judge": None,
            "judge_%": None,
            "rule_hard_coded": rule,
        }
    )
    return rows


def agreement(pairs: Sequence[tuple[TurnError, Judgement | None]]) -> dict[str, Any]:
    """Judge vs rule on hard-coding, over the errors the judge labelled (parse failures apart):
    both say hard-coding, only the judge, only the rule, neither; agreement (%)."""
    labelled = [(e, j) for e, j in pairs if j is not None and j.label in LABELS]
    both = sum(e.rule.hard_coded and j.label == "hard_coding" for e, j in labelled)
    judge_only = sum(not e.rule.hard_coded and j.label == "hard_coding" for e, j in labelled)
    rule_only = sum(e.rule.hard_coded and j.label != "hard_coding" for e, j in labelled)
    neither = len(labelled) - both - judge_only - rule_only
    return {
        "labelled": len(labelled),
        "parse_failures": sum(j is not None and j.label == PARSE_FAILURE for _, j in pairs),
        "both_hard_coding": both,
        "judge_only": judge_only,
        "rule_only": rule_only,
        "neither": neither,
        "agreement_%": _pct(both + neither, len(labelled)),
    }


def pick_examples(
    pairs: Sequence[tuple[TurnError, Judgement | None]], count: int
) -> list[tuple[TurnError, Judgement | None]]:
    """Up to `count` errors to show: one per judge category first (in label order, rule
    hard-coding first within each), then the rest in the same order; stable."""

    def rank(item: tuple[TurnError, Judgement | None]) -> tuple:
        error, judgement = item
        label = judgement.label if judgement else "not judged"
        return (ORDER.get(label, len(ORDER)), not error.rule.hard_coded, error.id)

    ranked = sorted(pairs, key=rank)
    firsts, rest, seen = [], [], set()
    for item in ranked:
        label = item[1].label if item[1] else None
        (rest if label in seen else firsts).append(item)
        seen.add(label)
    return (firsts + rest)[:count]


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text}\n{ticks}"


def _short(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _inline(text: str) -> str:
    """One line for inline code: line ends shown as \\n, backticks as quotes, cut to 80."""
    return _short(text.strip().replace("\n", "\\n").replace("`", "'"), 80)


def examples_markdown(examples: Sequence[tuple[TurnError, Judgement | None]]) -> str:
    """Each example: where, the wrong test, judge label and raw reply, rule, the diff."""
    if not examples:
        return "No turn-level errors."
    parts = []
    for error, judgement in examples:
        label = judgement.label if judgement else "not judged"
        test = error.wrong_tests[0]
        truth = "" if test.true_output is None else f", correct `{_inline(test.true_output)}`"
        raw = _short(judgement.raw, 300) if judgement else ""
        tries = len(judgement.attempts) if judgement else 0
        rule = f"hard-coded {error.rule.matched}" if error.rule.hard_coded else "no literal"
        parts.append(
            f"### {error.problem_id}, sample {error.sample}, turn {error.turn - 1} -> "
            f"{error.turn}\n\n"
            f"- wrong test: input `{_inline(test.input)}`, shown `{_inline(test.output)}`"
            f"{truth}\n"
            f"- judge: **{label}** ({tries} attempt{'s' if tries != 1 else ''})\n"
            f"- rule pre-check: {rule}\n"
            f"- true tests: {100 * error.pass_rate_before:.0f}% -> "
            f"{100 * error.pass_rate_after:.0f}%\n\n{_fence(error.diff, 'diff')}\n\n"
            f"The judge's last reply:\n\n{_fence(raw or '(empty)', 'text')}"
        )
    return "\n\n".join(parts)


def examples_json(examples: Sequence[tuple[TurnError, Judgement | None]]) -> list[dict[str, Any]]:
    """The same examples for report.json: where, wrong tests, labels, the diff, the raw reply."""
    return [
        {
            "id": error.id,
            "problem_id": error.problem_id,
            "sample": error.sample,
            "turn": error.turn,
            "judge": judgement.label if judgement else None,
            "judge_reply": judgement.raw if judgement else None,
            "rule_hard_coded": error.rule.hard_coded,
            "rule_matched": error.rule.matched,
            "wrong_tests": [t.model_dump() for t in error.wrong_tests],
            "pass_rate_before": error.pass_rate_before,
            "pass_rate_after": error.pass_rate_after,
            "diff": error.diff,
        }
        for error, judgement in examples
    ]


# --- comparison ---------------------------------------------------------------------------------


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Two reports (report.json of two analyses; `a` before, `b` after): the error rate per turn
    side by side, and the categories (counts and shares) side by side."""
    later = {r["turn"]: r for r in b["per_turn"]}
    turns = []
    for row in a["per_turn"]:
        other = later.get(row["turn"])
        if other is None or row["turn"] == 0:
            continue
        ra, rb = row["error_rate_%"], other["error_rate_%"]
        turns.append(
            {
                "turn": row["turn"],
                "pairs_before": row["pairs"],
                "errors_before": row["errors"],
                "error_rate_before_%": ra,
                "pairs_after": other["pairs"],
                "errors_after": other["errors"],
                "error_rate_after_%": rb,
                "change_points": None if ra is None or rb is None else round(rb - ra, 2),
            }
        )
    cats_b = {r["category"]: r for r in b["categories"]}
    cats = []
    for row in a["categories"]:
        other = cats_b.get(row["category"], {})
        key = "judge" if row["judge"] is not None else "rule_hard_coded"
        cats.append(
            {
                "category": row["category"],
                "before": row[key],
                "before_%": row.get("judge_%"),
                "after": other.get(key),
                "after_%": other.get("judge_%"),
            }
        )
    return {"per_turn": turns, "categories": cats}


# --- plots ----------------------------------------------------------------------------------------


def plot(reports: Sequence[tuple[str, dict[str, Any]]], title: str) -> bytes:
    """A PNG: turn-level error rate (%) per turn (left) and errors per judge category and the
    rule pre-check (right), one series per report."""
    with figure(1, 2, figsize=(11, 4.0), dpi=100) as (fig, (left, right)):
        width = 0.8 / max(1, len(reports))
        for k, (name, report) in enumerate(reports):
            rows = [r for r in report["per_turn"] if isinstance(r["turn"], int) and r["turn"] > 0]
            xs = [r["turn"] for r in rows]
            ys = [r["error_rate_%"] or 0.0 for r in rows]
            left.plot(xs, ys, marker="o", linewidth=2, label=name)
            cats = report["categories"]
            names = [c["category"].replace("rule pre-check: ", "rule: ") for c in cats]
            counts = [c["judge"] if c["judge"] is not None else c["rule_hard_coded"] for c in cats]
            positions = [i + (k - (len(reports) - 1) / 2) * width for i in range(len(cats))]
            right.bar(positions, counts, width=width, label=name)
            right.set_xticks(range(len(cats)), names, rotation=30, ha="right", fontsize=8)
        turns = sorted(
            {
                r["turn"]
                for _, rp in reports
                for r in rp["per_turn"]
                if isinstance(r["turn"], int) and r["turn"] > 0
            }
        )
        left.set_xticks(turns)
        right.yaxis.get_major_locator().set_params(integer=True)
        left.set_xlabel("turn (program pair turn-1 -> turn)")
        left.set_ylabel("turn-level errors per program pair (%)")
        left.set_title("Turn-level error rate")
        left.grid(alpha=0.3)
        right.set_ylabel("errors")
        right.set_title("Judge categories and rule pre-check")
        right.grid(alpha=0.3, axis="y")
        for ax in (left, right):
            ax.legend(fontsize=8)
        fig.suptitle(title)
        return png(fig)
