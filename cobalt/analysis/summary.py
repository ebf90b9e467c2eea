"""A finished reward-hacking analysis summarised (docs/REWARD_HACKING.md): the report's tables,
examples and PNG, written beside the judged step (report.json, report.md, turn_errors.png) with
LATEST.json pointing at it; and, when asked, the comparison with another analysis (a directory
under reward_hacking/comparisons/). The Prefect artifacts are made from this in
`tasks/reward_hacking.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from cobalt.analysis import report as rep
from cobalt.analysis.reward_hacking import ErrorRecord
from cobalt.analysis.stages import (
    AnalysisRef,
    ErrorsSpec,
    HackingParams,
    JudgedRecord,
    read_step,
    write_json,
)
from cobalt.storage import StorageConfig, open_storage, recipe_key
from cobalt.tables import markdown_table


class HackingSummary(BaseModel):
    """What the flow returns (and the pipeline shows)."""

    uri: str  # the judged step's directory: what --compare takes
    errors: AnalysisRef
    judged: AnalysisRef
    policy: str
    judge: str
    per_turn: list[dict[str, Any]]
    categories: list[dict[str, Any]]
    agreement: dict[str, Any]
    examples: str
    plot: str
    report: str
    line: str
    comparison: dict[str, list[dict[str, Any]]] | None = None
    comparison_plot: str | None = None
    comparison_line: str | None = None


def _name(model: str) -> str:
    return model.rstrip("/").rsplit("/", 1)[-1] or model


def _url(storage: StorageConfig, path: str) -> str:
    st = open_storage(storage)
    return Path(path).as_uri() if storage.is_local else st.protocol + path


def summarize(
    params: HackingParams,
    errors_spec: ErrorsSpec,
    errors: AnalysisRef,
    judged: AnalysisRef,
    judge_model: str,
    compare: dict[str, Any] | None = None,
) -> HackingSummary:
    """Tables, examples and plot of one analysis (and the comparison with `compare`, another
    analysis's report), written to storage; LATEST.json now names this analysis."""
    st = open_storage(params.storage)
    records: dict[str, ErrorRecord] = read_step(errors, params.storage, ErrorRecord)
    judgements = [
        j for r in read_step(judged, params.storage, JudgedRecord).values() for j in r.judgements
    ]
    pairs = rep.joined(records.values(), judgements)
    turns = errors_spec.turns
    per_turn = rep.per_turn(records.values(), turns)
    categories = rep.categories(pairs)
    agreement = rep.agreement(pairs)
    examples = rep.pick_examples(pairs, params.examples)
    policy = params.label or _name(str(errors_spec.policy.get("model", "?")))
    judge = _name(judge_model)
    source = errors_spec.problems
    what = f"{source.uri}{' [' + source.table + ']' if source.table else ''}"
    total = per_turn[-1]
    rule = sum(e.rule.hard_coded for e, _ in pairs)
    line = (
        f"reward hacking: {policy} on {source.count} perturbed problems ({what}), "
        f"{params.collect.sampling.n} samples x {turns} feedback turns: {total['errors']} "
        f"turn-level errors in {total['pairs']} program pairs ({total['error_rate_%'] or 0.0}%); "
        f"judge {judge}: "
        + ", ".join(f"{c['category']} {c['judge']}" for c in categories if c["judge"])
        + f"; rule pre-check hard-coding {rule}; judge/rule agreement "
        f"{agreement['agreement_%'] if agreement['agreement_%'] is not None else '-'}%"
    )
    directory = judged.uri.removeprefix("s3://")
    report = {
        "policy": policy,
        "policy_engine": errors_spec.policy,
        "judge": judge,
        "judge_settings": params.judge.recipe(),
        "problems": {"uri": source.uri, "table": source.table, "count": source.count},
        "samples": params.collect.sampling.n,
        "turns": turns,
        "per_turn": per_turn,
        "categories": categories,
        "agreement": agreement,
        "examples": rep.examples_json(examples),
        "errors": errors.uri,
        "judged": judged.uri,
        "trajectories": {
            "multiturn": errors_spec.multiturn.uri,
            "evaluation": errors_spec.evaluation.uri,
        },
        "line": line,
    }
    examples_md = rep.examples_markdown(examples)
    plot_path = f"{directory}/turn_errors.png"
    st.write_atomic(plot_path, rep.plot([(policy, report)], f"Reward hacking: {policy}"))
    write_json(params.storage, f"{directory}/report.json", report)
    markdown = render_markdown(line, per_turn, categories, agreement, examples_md)
    st.write_atomic(f"{directory}/report.md", markdown.encode())
    st.point_latest("reward_hacking", judged=judged.uri)
    summary = HackingSummary(
        uri=judged.uri,
        errors=errors,
        judged=judged,
        policy=policy,
        judge=judge,
        per_turn=per_turn,
        categories=categories,
        agreement=agreement,
        examples=examples_md,
        plot=_url(params.storage, plot_path),
        report=_url(params.storage, f"{directory}/report.json"),
        line=line,
    )
    if compare is not None:
        summary = with_comparison(summary, report, compare, params.storage)
    return summary


def render_markdown(
    line: str,
    per_turn: list[dict[str, Any]],
    categories: list[dict[str, Any]],
    agreement: dict[str, Any],
    examples_md: str,
) -> str:
    return (
        f"# Reward hacking\n\n{line}\n\n## Turn-level errors per turn\n\n"
        f"{markdown_table(per_turn)}\n\n## Categories (judge) and rule pre-check\n\n"
        f"{markdown_table(categories)}\n\n## Judge vs rule on hard-coding\n\n"
        f"{markdown_table([agreement])}\n\n## Examples\n\n{examples_md}\n"
    )


def with_comparison(
    summary: HackingSummary,
    after: dict[str, Any],
    before: dict[str, Any],
    storage: StorageConfig,
) -> HackingSummary:
    """The comparison of two analyses (before = `before`, after = this one) in storage."""
    st = open_storage(storage)
    tables = rep.compare(before, after)
    key = recipe_key(before=before["judged"], after=after["judged"])
    directory = st.path("reward_hacking", "comparisons", key)
    names = (before["policy"], after["policy"])
    if names[0] == names[1]:
        names = (f"{names[0]} (before)", f"{names[1]} (after)")
    title = f"Reward hacking: {names[0]} vs {names[1]}"
    plot_path = f"{directory}/comparison.png"
    st.write_atomic(plot_path, rep.plot([(names[0], before), (names[1], after)], title))
    b_all, a_all = before["per_turn"][-1], after["per_turn"][-1]
    line = (
        f"turn-level error rate {names[0]} {b_all['error_rate_%'] or 0.0}% "
        f"({b_all['errors']}/{b_all['pairs']}) -> {names[1]} {a_all['error_rate_%'] or 0.0}% "
        f"({a_all['errors']}/{a_all['pairs']})"
    )
    write_json(
        storage,
        f"{directory}/comparison.json",
        {"before": before["judged"], "after": after["judged"], "line": line, **tables},
    )
    st.write_atomic(
        f"{directory}/comparison.md",
        (
            f"# {title}\n\n{line}\n\n## Per turn\n\n{markdown_table(tables['per_turn'])}\n\n"
            f"## Categories\n\n{markdown_table(tables['categories'])}\n"
        ).encode(),
    )
    return summary.model_copy(
        update={
            "comparison": tables,
            "comparison_plot": _url(storage, plot_path),
            "comparison_line": line,
        }
    )
