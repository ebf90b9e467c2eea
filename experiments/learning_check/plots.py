"""The learning check's plots (`report.write` draws them): Pass@1 per turn, the paired
differences, the reward curves and the gain per GPU second, each off-screen through
`cobalt.plots`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cobalt.plots import figure, png
from experiments.learning_check.aggregate import COMPARISONS


def model_label(model: str) -> str:
    return "SFT (before)" if model == "sft" else f"after {model}"


def index_by(rows: list[dict[str, Any]], *keys: str) -> dict[tuple, dict[str, Any]]:
    return {tuple(r[k] for k in keys): r for r in rows}


def plot_pass(s: dict[str, Any], path: Path) -> None:
    cells = index_by(s["cells"], "protocol", "group", "turn", "model")
    groups, turns = list(s["groups"]), range(s["turns"] + 1)
    with figure(
        2, len(groups), figsize=(4.2 * len(groups), 7.0), dpi=100, sharey=True, layout="constrained"
    ) as (fig, axes):
        for row, protocol in enumerate(("spec", "stop")):
            for col, group in enumerate(groups):
                ax = axes[row][col]
                for i, m in enumerate(s["models"]):
                    got = [(t, cells.get((protocol, group, t, m))) for t in turns]
                    got = [(t, c) for t, c in got if c]
                    if not got:
                        continue
                    xs = [t + 0.04 * (i - 2) for t, _ in got]
                    ys = [c["mean"] for _, c in got]
                    err = [
                        [c["mean"] - c["low"] for _, c in got],
                        [c["high"] - c["mean"] for _, c in got],
                    ]
                    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=model_label(m))
                name = "METHOD §1.2" if protocol == "spec" else "stop on pass"
                ax.set_title(f"{s['groups'][group]} ({name})")
                ax.set_xticks(list(turns))
                ax.set_xlabel("turn")
                ax.grid(alpha=0.3)
            axes[row][0].set_ylabel("Pass@1 (%)")
        axes[0][0].legend(fontsize=7)
        path.write_bytes(png(fig))


def plot_differences(s: dict[str, Any], path: Path) -> None:
    diffs = index_by(s["differences"], "a", "b", "protocol", "group", "turn")
    groups, turns = list(s["groups"]), range(s["turns"] + 1)
    with figure(1, len(groups), figsize=(4.2 * len(groups), 3.6), dpi=100, sharey=True) as (
        fig,
        axes,
    ):
        for ax, group in zip(axes, groups, strict=True):
            for i, (a, b) in enumerate(COMPARISONS):
                got = [(t, diffs.get((a, b, "spec", group, t))) for t in turns]
                got = [(t, d) for t, d in got if d]
                if not got:
                    continue
                xs = [t + 0.06 * (i - 1) for t, _ in got]
                err = [
                    [d["mean"] - d["low"] for _, d in got],
                    [d["high"] - d["mean"] for _, d in got],
                ]
                ax.errorbar(
                    xs,
                    [d["mean"] for _, d in got],
                    yerr=err,
                    marker="o",
                    capsize=3,
                    label=f"{a} − {b}",
                )
            ax.axhline(0, color="black", linewidth=0.8)
            ax.set_title(f"{s['groups'][group]} (METHOD §1.2)")
            ax.set_xticks(list(turns))
            ax.set_xlabel("turn")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("Δ Pass@1 (pp), 95% interval")
        axes[0].legend(fontsize=7)
        path.write_bytes(png(fig))


def plot_rewards(s: dict[str, Any], path: Path) -> None:
    with figure(figsize=(7.0, 4.0), dpi=100) as (fig, ax):
        for mode, t in s["training"].items():
            ys = t.get("curve_mean") or []
            if t.get("curve_key") == "loss" or not ys:
                continue
            ax.plot(
                range(1, len(ys) + 1),
                ys,
                marker=".",
                label=f"{mode} ({len(t['seeds_completed'])} seeds)",
            )
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("mean correctness reward (mean over seeds)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
        path.write_bytes(png(fig))


def plot_gain_per_cost(s: dict[str, Any], path: Path) -> None:
    """Gain over SFT on the RL kinds (95% interval) against each mode's training cost, turn 0
    and the last turn side by side."""
    rows = s.get("gain_per_cost", [])
    turns = sorted({r["turn"] for r in rows}) or [0]
    with figure(1, len(turns), figsize=(5.2 * len(turns), 4.0), dpi=100, sharey=True) as (
        fig,
        axes,
    ):
        axes = list(axes) if len(turns) > 1 else [axes]
        for ax, turn in zip(axes, turns, strict=True):
            for r in (r for r in rows if r["turn"] == turn):
                g, c = r["gain"], r["cost_s"]
                ax.errorbar(
                    [c["mean"]],
                    [g["mean"]],
                    yerr=[[g["mean"] - g["low"]], [g["high"] - g["mean"]]],
                    xerr=[[c["mean"] - c["min"]], [c["max"] - c["mean"]]],
                    marker="o",
                    capsize=3,
                    label=f"{r['mode']} ({r['seeds']} seeds)",
                )
            ax.axhline(0, color="black", linewidth=0.8)
            unit = rows[0]["cost_unit"] if rows else "GPU s"
            ax.set_xlabel(f"training cost ({unit}, mean [min, max] over seeds)")
            ax.set_title(f"RL kinds, turn {turn} (METHOD §1.2)")
            ax.grid(alpha=0.3)
            if ax.lines or ax.containers:
                ax.legend(fontsize=7)
        axes[0].set_ylabel("Pass@1 gain over SFT (pp), 95% interval")
        path.write_bytes(png(fig))
