"""A GRPO run's curves from its log history: the reward at the start and end (the stage's stats)
and a plot of the reward per optimizer step (offline runs: `cobalt.training.offline`)."""

from __future__ import annotations

from typing import Any

from cobalt.plots import figure, png


def reward_stats(history: list[dict[str, Any]]) -> dict[str, Any]:
    rewards = [h["reward"] for h in history if "reward" in h]
    if not rewards:
        return {"reward_first": None, "reward_last": None}
    k = max(1, len(rewards) // 4)
    return {
        "reward_first": round(rewards[0], 4),
        "reward_last": round(rewards[-1], 4),
        "reward_first_quarter": round(sum(rewards[:k]) / k, 4),
        "reward_last_quarter": round(sum(rewards[-k:]) / k, 4),
    }


def plot_rewards(history: list[dict[str, Any]], title: str) -> bytes:
    """A PNG of the mean reward (and each reward function's mean) against the optimizer step."""
    logged = [h for h in history if "reward" in h]
    names = sorted(
        {k for h in logged for k in h if k.startswith("rewards/") and k.endswith("/mean")}
    )
    with figure(figsize=(6.4, 4.0), dpi=100) as (fig, ax):
        steps = [h.get("step", i + 1) for i, h in enumerate(logged)]
        ax.plot(steps, [h["reward"] for h in logged], marker="o", linewidth=2.2, label="reward")
        for name in names:
            ax.plot(steps, [h.get(name) for h in logged], linewidth=1, label=name.split("/")[1])
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("mean reward")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        return png(fig)
