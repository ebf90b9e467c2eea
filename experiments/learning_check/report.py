"""The learning check's report: `aggregate.aggregate`'s summary as markdown tables
ready for docs/RESULTS.md (REPORT.md) and three plots; `write` puts them and the summary
(learning_check.json) in a directory. matplotlib is imported only to draw."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.learning_check.aggregate import COMPARISONS, aggregate
from experiments.learning_check.plots import (
    index_by,
    model_label,
    plot_differences,
    plot_gain_per_cost,
    plot_pass,
    plot_rewards,
)
from experiments.learning_check.runs import load_runs

PROTOCOL_NAMES = {
    "spec": "METHOD §1.2 protocol (feedback after every turn, also after all public tests pass)",
    "stop": "stop on public pass (a sample keeps its first program that passes every public test)",
}
FEEDBACK_NAMES = {"passed": "all public passed", "failed": "failure report", "no_code": "no code"}


def write(summary: dict[str, Any], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "learning_check.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = render(summary)
    (out / "REPORT.md").write_text(text)
    plot_pass(summary, out / "pass_at_1.png")
    plot_differences(summary, out / "differences.png")
    plot_rewards(summary, out / "reward_curves.png")
    plot_gain_per_cost(summary, out / "gain_vs_cost.png")
    return text


def aggregate_dirs(dirs: list[Path], out: Path) -> str:
    """Merge the seed results of `dirs` (in this order) into `out`; returns REPORT.md."""
    return write(aggregate(load_runs(dirs)), out)


def _ci(c: dict[str, Any] | None) -> str:
    if c is None:
        return "–"
    return f"{c['mean']:.1f} [{c['low']:.1f}, {c['high']:.1f}]"


def _signed(c: dict[str, Any] | None, digits: int = 1) -> str:
    if c is None:
        return "–"
    return f"{c['mean']:+.{digits}f} [{c['low']:+.{digits}f}, {c['high']:+.{digits}f}]"


def _f(x: Any, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def render(s: dict[str, Any]) -> str:
    m = s["machine"]
    primary = [r for r in s["runs"] if r["primary"]]
    repeats = [r for r in s["runs"] if not r["primary"] and not r.get("continues_primary")]
    continued = [r for r in s["runs"] if r.get("continues_primary")]
    lines = [
        "# Learning check",
        "",
        f"{len(s['seeds'])} seeds ({', '.join(map(str, s['seeds']))}) on {m.get('device')} "
        f"({m.get('cpus')} CPUs), torch {m.get('torch')}, transformers {m.get('transformers')}, "
        f"trl {m.get('trl')}; runs: "
        + ", ".join(f"{r['label']} ({r['status']}, {_f(r['wall_s'], 0)} s)" for r in primary)
        + (
            "; continued from the same SFT model (more modes): "
            + ", ".join(
                f"{r['label']} in {r['source']} ({', '.join(r['training'])})" for r in continued
            )
            if continued
            else ""
        )
        + (
            "; repeats (same-seed spread only): " + ", ".join(r["label"] for r in repeats)
            if repeats
            else ""
        )
        + ".",
        "",
        settings_line(s),
        "",
        "Cells: mean Pass@1 (%) over the seeds' problems, [95% interval] from a two-level "
        "bootstrap (seeds, then problems within each seed).",
        "",
    ]
    for protocol, title in PROTOCOL_NAMES.items():
        lines += [f"## Pass@1 (%), {title}", "", *pass_table(s, protocol), ""]
    lines += ["## Differences (percentage points, paired by seed and problem)", ""]
    lines += [*difference_table(s), ""]
    lines += ["## Gain over the SFT model (METHOD §1.2 protocol)", "", *gain_table(s), ""]
    lines += [*gain_cost_lines(s)]
    lines += ["## Per seed (Pass@1 %, METHOD §1.2, turn 0 / last turn)", "", *seed_table(s), ""]
    lines += ["## Per kind (Pass@1 %, METHOD §1.2, mean over seeds, turn 0 / last turn)", ""]
    lines += [*kind_table(s), ""]
    lines += [*repair_lines(s), *training_lines(s), *offline_lines(s), *spread_lines(s)]
    lines += [*phase_lines(s)]
    lines += ["![Pass@1](pass_at_1.png)", "", "![differences](differences.png)", ""]
    lines += ["![gain vs cost](gain_vs_cost.png)", ""]
    lines += ["![reward curves](reward_curves.png)", ""]
    return "\n".join(lines)


def settings_line(s: dict[str, Any]) -> str:
    st = {k: v for k, v in s["settings"].items() if v is not None}
    kinds = {g: len(k) for g, k in s["kinds"].items()}

    def g(key: str) -> Any:
        return st.get(key, "?")

    return (
        f"Each seed: SFT {g('sft_steps')} steps x {g('sft_batch')} on {g('sft_examples')} "
        f"conversations of {kinds.get('sft_kinds', '?')} kinds; reference trajectories "
        f"{g('rl_problems')} RL-kind problems x {g('n')} samples; GRPO {g('rl_steps')} steps x "
        f"{g('rl_prompts')} prompts x {g('rl_generations')} completions per mode; offline "
        f"({g('offline_objective')}) as many logged completions; evaluation "
        f"{g('eval_problems')} problems per held-out group ({kinds.get('rl_kinds', '?')} kinds "
        f"each) and {g('eval_sft_problems')} of the SFT kinds, {g('eval_n')} samples each, turns "
        f"0..{s['turns']} at temperature 0.6 / top-p 0.95."
    )


def pass_table(s: dict[str, Any], protocol: str) -> list[str]:
    cells = index_by(s["cells"], "protocol", "group", "turn", "model")
    models = s["models"]
    lines = [
        "| kinds | turn | " + " | ".join(model_label(m) for m in models) + " |",
        "|---|---|" + "---|" * len(models),
    ]
    for group, label in s["groups"].items():
        for t in range(s["turns"] + 1):
            row = [_ci(cells.get((protocol, group, t, m))) for m in models]
            lines.append(f"| {label} | {t} | " + " | ".join(row) + " |")
    return lines


def difference_table(s: dict[str, Any]) -> list[str]:
    diffs = index_by(s["differences"], "a", "b", "protocol", "group", "turn")
    lines = [
        "| comparison | kinds | turn | Δ METHOD §1.2 | verdict | Δ stop on public pass | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for a, b in s.get("comparisons", COMPARISONS):
        for group, label in s["groups"].items():
            for t in range(s["turns"] + 1):
                spec = diffs.get((a, b, "spec", group, t))
                stop = diffs.get((a, b, "stop", group, t))
                if spec is None and stop is None:
                    continue
                lines.append(
                    f"| {a} − {b} | {label} | {t} | {_signed(spec)} | "
                    f"{spec['verdict'] if spec else '–'} | {_signed(stop)} | "
                    f"{stop['verdict'] if stop else '–'} |"
                )
    return lines


def gain_table(s: dict[str, Any]) -> list[str]:
    diffs = index_by(s["differences"], "a", "b", "protocol", "group", "turn")
    modes = [m for m in s["models"] if m != "sft"]
    turns = sorted({0, s["turns"]})
    lines = [
        "| kinds | turn | " + " | ".join(f"{m} − SFT" for m in modes) + " |",
        "|---|---|" + "---|" * len(modes),
    ]
    for group, label in s["groups"].items():
        for t in turns:
            row = []
            for m in modes:
                d = diffs.get((m, "sft", "spec", group, t))
                row.append("–" if d is None else f"{_signed(d)} {_short(d['verdict'], m)}")
            lines.append(f"| {label} | {t} | " + " | ".join(row) + " |")
    return lines


def gain_cost_lines(s: dict[str, Any]) -> list[str]:
    """The gain over SFT (RL kinds) per 100 seconds of each mode's training cost."""
    rows = s.get("gain_per_cost", [])
    if not rows:
        return []
    units = sorted({r["cost_unit"] for r in rows})
    lines = [
        "## Gain per cost (RL kinds, METHOD §1.2)",
        "",
        "Pass@1 gain over the SFT model (percentage points, 95% interval paired over seeds and "
        f"problems) and the same per 100 {' / '.join(units)} of the mode's training (mean over "
        "its seeds [lowest, highest]; the shared SFT and reference trajectories not counted; "
        "offline_grpo: both phases). The cost is taken as fixed: the interval is the gain's.",
        "",
        "| mode | turn | seeds | gain (pp) | cost (s) | gain per 100 s (pp) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["cost_s"]
        lines.append(
            f"| {r['mode']} | {r['turn']} | {r['seeds']} | {_signed(r['gain'])} | "
            f"{c['mean']:.1f} [{c['min']:.1f}, {c['max']:.1f}] {r['cost_unit']} | "
            f"{_signed(r['per_100_s'], 2)} |"
        )
    return [*lines, ""]


def offline_lines(s: dict[str, Any]) -> list[str]:
    """Per offline mode: what it trained on and its logged diagnostics, first -> last step."""
    modes = {m: t for m, t in s["training"].items() if t.get("diagnostics")}
    if not modes:
        return []
    keys = list(dict.fromkeys(k for t in modes.values() for k in t["diagnostics"]))
    lines = [
        "## Offline modes: what they trained on and how the policy moved",
        "",
        "Mean over the seeds, first step -> last step (docs/LEARNING.md says which cause of a "
        "failure to learn each figure tests). zero-A dropped: share of the logged rows left out "
        "with advantage 0; passes: row visits per kept row.",
        "",
        "| mode | objective | zero-A dropped | passes | " + " | ".join(keys) + " |",
        "|---|---|---|---|" + "---|" * len(keys),
    ]
    for mode, t in modes.items():
        d = t["diagnostics"]
        cells = [
            "–" if k not in d else f"{_f(d[k]['first'], 3)} -> {_f(d[k]['last'], 3)}" for k in keys
        ]
        share = t.get("dropped_zero_advantage_share")
        lines.append(
            f"| {mode} | {t.get('objective') or '–'} | "
            f"{'–' if share is None else f'{100 * share:.0f}%'} | {_f(t.get('passes_over_rows'))} | "
            + " | ".join(cells)
            + " |"
        )
    return [*lines, ""]


def _short(text: str, model: str) -> str:
    return {"no difference": "(=)", f"{model} ahead": "(up)", "sft ahead": "(down)"}.get(text, "")


def seed_table(s: dict[str, Any]) -> list[str]:
    rows = index_by(s["per_seed"], "seed", "model", "group", "turn")
    models, last = s["models"], s["turns"]
    lines = [
        "| seed | kinds | " + " | ".join(model_label(m) for m in models) + " |",
        "|---|---|" + "---|" * len(models),
    ]
    for seed in s["seeds"]:
        for group, label in s["groups"].items():
            cells = []
            for m in models:
                a, b = rows.get((seed, m, group, 0)), rows.get((seed, m, group, last))
                cells.append("–" if a is None else f"{_f(a['spec'])} / {_f(b and b['spec'])}")
            lines.append(f"| {seed} | {label} | " + " | ".join(cells) + " |")
    return lines


def kind_table(s: dict[str, Any]) -> list[str]:
    rows = index_by(s["per_kind"], "kind", "model")
    models, last = s["models"], s["turns"]
    lines = [
        "| kind | group | " + " | ".join(model_label(m) for m in models) + " |",
        "|---|---|" + "---|" * len(models),
    ]
    for group in ("rl_kinds", "unseen_kinds"):
        for kind in s["kinds"].get(group, []):
            cells = []
            for m in models:
                r = rows.get((kind, m))
                cells.append("–" if r is None else f"{_f(r['mean'][0])} / {_f(r['mean'][last])}")
            lines.append(f"| {kind} | {s['groups'][group]} | " + " | ".join(cells) + " |")
    return lines


def repair_lines(s: dict[str, Any]) -> list[str]:
    lines = [
        "## What feedback turns do to programs",
        "",
        "Every step from turn t-1 to turn t of every evaluation sample (all primary seeds), by "
        "the feedback given after turn t-1: right programs kept or broken, wrong ones repaired; "
        "'rewritten': the program text changed; 'broken, pass public': the broken program still "
        "passes every public test (only the hidden tests catch it).",
        "",
        "| model | kinds | turn | feedback | steps | right before | broken % | right rewritten % "
        "| broken, pass public % | wrong before | repaired % |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in s["models"]:
        for r in s["transitions"].get(m, []):
            if r["group"] == "sft_kinds":
                continue
            lines.append(
                f"| {m} | {s['groups'].get(r['group'], r['group'])} | {r['turn']} | "
                f"{FEEDBACK_NAMES.get(r['feedback'], r['feedback'])} | {r['steps']} | "
                f"{r['right_before']} | {_f(r['broken_pct'])} | {_f(r['right_rewritten_pct'])} | "
                f"{_f(r['broken_passing_public_pct'])} | {r['wrong_before']} | "
                f"{_f(r['repaired_pct'])} |"
            )
    lines += ["", *repair_summary(s), ""]
    lines += ["What the broken programs (right -> wrong) were, all groups:", ""]
    for m, counts in s.get("new_programs", {}).items():
        if counts:
            total = sum(counts.values())
            parts = ", ".join(f"{k} {100 * n / total:.0f}%" for k, n in counts.items())
            lines.append(f"- {m} ({total}): {parts}")
    return [*lines, ""]


def repair_summary(s: dict[str, Any]) -> list[str]:
    """One sentence per model: where its held-out-kind programs break and get repaired."""
    out = []
    for m in s["models"]:
        rows = [r for r in s["transitions"].get(m, []) if r["group"] != "sft_kinds"]
        if not rows:
            continue

        def total(feedback: str, field: str, rows=rows) -> int:
            return sum(r[field] for r in rows if r["feedback"] == feedback)

        broken = {f: total(f, "broken") for f in ("passed", "failed", "no_code")}
        right = {f: total(f, "right_before") for f in ("passed", "failed", "no_code")}
        repaired, wrong = total("failed", "repaired"), total("failed", "wrong_before")
        all_broken = sum(broken.values())
        out.append(
            f"- {m} (held-out kinds): {all_broken} right programs broken, "
            f"{broken['passed']} of them after 'all public passed' "
            f"({_pct(broken['passed'], right['passed'])} of the right programs told so); "
            f"{repaired} of {wrong} wrong programs repaired after a failure report "
            f"({_pct(repaired, wrong)})."
        )
    return out


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "–"


def training_lines(s: dict[str, Any]) -> list[str]:
    lines = [
        "## Training and cost per mode (same SFT model, same data budget)",
        "",
        "Mean over the primary seeds [lowest, highest]. GPU s = wall x GPUs held; busy = NVML "
        "utilization integrated (the GPU is shared by the seed processes, so busy seconds "
        "include the others' work); step s: median optimizer step after the first two; curve "
        "std / jitter: the training curve's standard deviation across steps and its step-to-step "
        "noise (RMS of successive differences / √2), per seed (GRPO: the correctness reward; "
        "offline: the loss).",
        "",
        "| mode | outcomes | rows | steps | completions sampled / trained | wall s | GPU s "
        "| GPU busy s | peak GiB | step s | reward wait | curve std | curve jitter |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def sp(x: dict[str, float] | None, digits: int = 1) -> str:
        if not x:
            return "–"
        return f"{x['mean']:.{digits}f} [{x['min']:.{digits}f}, {x['max']:.{digits}f}]"

    for mode, t in s["training"].items():
        outcomes = ", ".join(f"{k} {n}" for k, n in sorted(t["outcomes"].items()))
        share = t.get("reward_share")
        lines.append(
            f"| {mode} | {outcomes} | {_f(t['rows'], 0)} | {_f(t['steps'], 0)} | "
            f"{_f(t['completions_sampled'], 0)} / {_f(t['completions_trained'], 0)} | "
            f"{sp(t['wall_s'])} | {sp(t['gpu_s'])} | {sp(t['gpu_busy_s'])} | "
            f"{sp(t['gpu_peak_memory_gib'], 2)} | {sp(t['step_s_median'], 3)} | "
            f"{'–' if share is None else f'{100 * share:.1f}%'} | "
            f"{sp(t.get('curve_std'), 3)} | {sp(t.get('curve_jitter'), 3)} |"
        )
    bf16, fp32 = s["training"].get("cobalt_bf16"), s["training"].get("cobalt")
    if bf16 and fp32 and bf16.get("step_s_median") and fp32.get("step_s_median"):
        ratio = bf16["step_s_median"]["mean"] / fp32["step_s_median"]["mean"]
        lines += ["", f"bf16 autocast / float32 cobalt step time: {ratio:.2f}."]
    for mode, t in s["training"].items():
        if t.get("overlap"):
            per_seed = ", ".join(
                f"seed {seed} {o['overlapped_batches']} of "
                f"{o['overlapped_batches'] + o['fresh_batches']}"
                for seed, o in t["overlap"].items()
            )
            lines += [
                "",
                f"{mode}: generation batches sampled while the step before trained (the rest "
                f"in place, from the current weights): {per_seed}.",
            ]
    for mode, t in s["training"].items():
        for seed, error in t.get("errors", {}).items():
            lines += ["", f"{mode}, seed {seed}: {str(error)[:400]}"]
    return [*lines, ""]


def spread_lines(s: dict[str, Any]) -> list[str]:
    """The same-seed repeat, in every report: identical or not, which cells differ, why."""
    lines = ["## Same seed, twice", ""]
    if not s["spread"]:
        hint = s.get("repeat_hint") or "no seed ran twice here (`--repeat SEED` runs one again)"
        return [*lines, hint[0].upper() + hint[1:] + ".", ""]
    lines += [
        "| seed | runs | identical | cells identical | max abs Δ (pp) | mean abs Δ (pp) "
        "| problems identical | fingerprints equal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in s["spread"]:
        prints = r["fingerprints_equal"]
        same = ", ".join(k for k, v in prints.items() if v) or "none"
        differ = [k for k, v in prints.items() if not v]
        lines.append(
            f"| {r['seed']} | {' / '.join(map(str, r['runs']))} | "
            f"{'yes' if r.get('identical') else 'no'} | {r['cells_identical']} of "
            f"{r['cells']} | {_f(r['max_abs_pp'], 2)} | {_f(r['mean_abs_pp'], 2)} | "
            f"{_f(r['problems_identical_pct'])}% | equal: {same}"
            + (f"; differ: {', '.join(differ)}" if differ else "")
            + " |"
        )
    lines.append("")
    for r in s["spread"]:
        runs = " and ".join(map(str, r["runs"]))
        if r.get("identical"):
            lines.append(
                f"- Seed {r['seed']} ({runs}): identical, every cell and every fingerprint."
            )
            continue
        cells = r.get("differing_cells", [])
        shown = "; ".join(
            f"{c['model']} {c['group']} turn {c['turn']} ({c['protocol']}) "
            f"{c['a']:.1f} vs {c['b']:.1f}"
            for c in cells[:8]
        )
        more = f" and {len(cells) - 8} more" if len(cells) > 8 else ""
        first = r.get("first_differing_fingerprint")
        lines.append(
            f"- Seed {r['seed']} ({runs}): not identical; {len(cells)} cells differ"
            + (f" ({shown}{more})" if cells else "")
            + (f"; first differing fingerprint: {first}" if first else "")
            + f". Likely cause: {r.get('cause') or 'not recorded'}."
        )
    return [*lines, ""]


def phase_lines(s: dict[str, Any]) -> list[str]:
    p = s["phases"]
    lines = ["## Phases (every run: mean [max] seconds, peak reserved GPU memory GiB)", ""]
    lines += ["| phase | seconds | GPU GiB |", "|---|---|---|"]
    for name, x in p["seconds"].items():
        mem = p["gpu_memory_gib"].get(name)
        lines.append(
            f"| {name} | {x['mean']:.1f} [{x['max']:.1f}] | "
            + ("–" if not mem else f"{mem['mean']:.2f} [{mem['max']:.2f}]")
            + " |"
        )
    if p.get("wall_s"):
        lines += ["", f"Run wall time: {p['wall_s']['mean']:.0f} s [max {p['wall_s']['max']:.0f}]."]
    return [*lines, ""]


# --- plots ---------------------------------------------------------------------------------------
