"""The learning check's split of the generated family (`cobalt.data.synthetic.ALL_KINDS`, 13
operations x 4 input formats = 52 kinds) into three groups: 12 *RL kinds* (held out of SFT;
GRPO prompts and the offline rows come only from them), 12 *never-seen kinds* (held out of SFT
and RL alike) and the 28 *SFT kinds*. Each format 3 times in each held-out group, no operation
twice in a group; the first 6 of each are the 30-kind split the check used before
(`synthetic.HELD_OUT` and its never-seen six). Every operation and every format is still seen by
SFT in at least two other kinds."""

from __future__ import annotations

from cobalt.data.synthetic import ALL_KINDS, HELD_OUT, seen_kinds

RL_KINDS: tuple[str, ...] = (
    *HELD_OUT,
    "odds/comma",
    "range/lines",
    "desc/count",
    "min/space",
    "product/space",
    "second/space",
)
UNSEEN_KINDS: tuple[str, ...] = (
    "sum/count",
    "min/count",
    "max/comma",
    "reversed/comma",
    "product/lines",
    "second/lines",
    "odds/lines",
    "range/count",
    "desc/comma",
    "sorted/space",
    "unique/space",
    "evens/space",
)
SFT_HELD_OUT: tuple[str, ...] = RL_KINDS + UNSEEN_KINDS
SFT_KINDS: tuple[str, ...] = tuple(seen_kinds(SFT_HELD_OUT, ALL_KINDS))
GROUPS = {"rl_kinds": "RL kinds", "unseen_kinds": "never-seen kinds", "sft_kinds": "SFT kinds"}
KIND_GROUPS = {"rl_kinds": RL_KINDS, "unseen_kinds": UNSEEN_KINDS, "sft_kinds": SFT_KINDS}
