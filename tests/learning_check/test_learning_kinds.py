"""The learning check's kind split (`experiments.learning_check.kinds`): three disjoint groups
covering the generated family, balanced so that SFT still sees every operation and format."""

from __future__ import annotations

from cobalt.data import synthetic
from experiments.learning_check.kinds import (
    KIND_GROUPS,
    RL_KINDS,
    SFT_HELD_OUT,
    SFT_KINDS,
    UNSEEN_KINDS,
)


def test_learning_split_balances_formats_and_operations() -> None:
    rl, unseen, sft = RL_KINDS, UNSEEN_KINDS, SFT_KINDS
    assert len(rl) == len(unseen) == 12 and len(sft) == 28
    assert not set(rl) & set(unseen) and not (set(rl) | set(unseen)) & set(sft)
    assert set(rl) | set(unseen) | set(sft) == set(synthetic.ALL_KINDS)
    assert set(SFT_HELD_OUT) == set(rl) | set(unseen)
    assert {"rl_kinds": rl, "unseen_kinds": unseen, "sft_kinds": sft} == KIND_GROUPS
    assert rl[:6] == synthetic.HELD_OUT  # the check's earlier split comes first
    for group in (rl, unseen):
        formats = [k.split("/")[1] for k in group]
        assert all(formats.count(f) == 3 for f in set(formats))
        assert len(set(formats)) == 4
        assert len({k.split("/")[0] for k in group}) == 12  # no operation twice
    # every piece is still seen by SFT, in at least two kinds
    for piece, index in [(op, 0) for op in {k.split("/")[0] for k in synthetic.ALL_KINDS}] + [
        (fmt, 1) for fmt in {k.split("/")[1] for k in synthetic.ALL_KINDS}
    ]:
        assert sum(k.split("/")[index] == piece for k in sft) >= 2, piece
