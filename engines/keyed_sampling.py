"""Sampling whose randomness belongs to each row, not to the batch (the transformers engine's).

`torch.multinomial` inside `generate` draws every row's token from one random stream, so a
row's text depends on which rows share its batch, in which order, and on how long the rows before
it ran. Here each row has a key (`row_keys`: the seed, the conversation's prompt tokens, its
occurrence among identical prompts of the call and the row's index among its `n` samples) and
each token is drawn by the Gumbel-max trick: `argmax(logits / T + G)` over the top-p nucleus, with
`G` a Gumbel variable computed from a hash of (key, step, token). That is exactly a sample from
the nucleus of `softmax(logits / T)`, and it depends on nothing but the row's key and its logits:

- the same prompt sampled with the same seed gives the same texts in any batch size, batch order,
  memory plan or out-of-memory split;
- two models sampled with the same seed share their noise (common random numbers): where their
  distributions agree they write the same tokens, so the difference of their Pass@1 measures
  what differs between the models more than the luck of two independent draws (docs/ENGINES.md).

The hash works on 31-bit integers held in int64 (every product stays below 2**63), so it is the
same on CPU and GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import torch

_M31 = 0x7FFFFFFF
# odd multipliers (bijective mod 2**31), from the lowbias32 / splitmix families
_MULTIPLIERS = (0x7FEB352D, 0x846CA68B, 0x2C1B3C6D, 0x297A2D39)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A bijection of [0, 2**31) that scatters nearby inputs (xorshift-multiply rounds)."""
    for m in _MULTIPLIERS:
        x = x ^ (x >> 16)
        x = (x * m) & _M31
    return x ^ (x >> 15)


def row_keys(seed: int | None, prompts: Sequence[Sequence[int]], rows: int) -> list[list[int]]:
    """One 62-bit key per row: `rows` rows for each prompt (its `n` samples). A prompt seen
    again in the same call gets other keys (its occurrence is in the hash), so identical
    conversations still sample independently. Without a seed the keys are random."""
    seen: dict[tuple[int, ...], int] = {}
    keys = []
    for prompt in prompts:
        ids = tuple(prompt)
        occurrence = seen.get(ids, 0)
        seen[ids] = occurrence + 1
        base = hashlib.blake2b(digest_size=16)
        base.update(f"{seed}:{occurrence}:".encode() if seed is not None else os.urandom(16))
        base.update(b",".join(str(t).encode() for t in ids))
        row = []
        for j in range(rows):
            h = base.copy()
            h.update(f":{j}".encode())
            row.append(int.from_bytes(h.digest()[:8], "little") >> 2)
        keys.append(row)
    return keys


# how the engines that send seeds to vLLM (in process, served, a server through LiteLLM) seed a
# call's requests: part of their stages' cache keys (a call used to share one seed; trajectories
# seeded that way are not read back as this scheme's)
SEEDING = "per-conversation seeds from row_keys"


def conversation_seeds(
    seed: int | None, conversations: Sequence[Sequence[dict]]
) -> list[int | None]:
    """One request seed per conversation, from the run's seed, the conversation and its
    occurrence among identical conversations of the call (`row_keys`, the transformers engine's
    keys): with one seed for the whole call, two identical conversations (two samples that wrote
    the same program and got the same feedback) would get identical completions, every
    conversation would share the others' noise, and runs of seeds s and s + 1 would share all
    but one of their samples' seeds (vLLM gives sample i of a request the seed + i)."""
    if seed is None:
        return [None] * len(conversations)
    encoded = [tuple(json.dumps(list(c), sort_keys=True).encode()) for c in conversations]
    return [keys[0] for keys in row_keys(seed, encoded, 1)]


def gumbel_noise(keys: torch.Tensor, step: int, tokens: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise for decoding step `step`, one value per (row, token): `tokens` holds
    token ids, (vocab,) for every row or (rows, k) per row. A function of (key, step, token id)
    alone, so a token gets the same noise whatever its rank or the batch."""
    low, high = keys & _M31, (keys >> 31) & _M31
    per_row = _mix(_mix(low ^ _mix(torch.full_like(low, step & _M31))) ^ high)
    tokens = tokens.to(torch.int64).expand(len(keys), -1)
    bits = _mix(_mix(per_row[:, None] ^ tokens) ^ low[:, None])
    uniform = (bits.to(torch.float64) + 0.5) / 2**31
    return (-torch.log(-torch.log(uniform))).to(torch.float32)


class KeyedSampler:
    """A `generate` logits processor that turns greedy decoding into sampling at `temperature`
    within the `top_p` nucleus (what `do_sample=True` does, as transformers' warpers order it:
    temperature, then top-p), with each row's noise from its key. Use with `do_sample=False`.

    Noise is computed for the nucleus' tokens alone (a few per row, not the vocabulary: on an
    H200 with Qwen's 151,936 tokens that is what keeps a step near transformers' own sampler);
    the returned scores are 0 for the drawn token and -inf elsewhere."""

    def __init__(self, keys: Sequence[int], prompt_width: int, temperature: float, top_p: float):
        self.keys = torch.tensor(list(keys), dtype=torch.int64)
        self.prompt_width = prompt_width
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[0] != len(self.keys):
            raise ValueError(f"{input_ids.shape[0]} rows but {len(self.keys)} keys")
        scores = scores.float() / self.temperature
        step = input_ids.shape[1] - self.prompt_width
        keys = self.keys.to(scores.device)
        if self.top_p >= 1.0:
            vocab = torch.arange(scores.shape[-1], device=scores.device)
            return scores + gumbel_noise(keys, step, vocab)
        # the nucleus: the most likely tokens while the mass before each is below top_p (the
        # set transformers' top-p warper keeps; at least the most likely token)
        ordered, order = torch.sort(scores, descending=True)
        probs = ordered.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs
        kept = before < self.top_p
        kept[:, 0] = True
        width = int(kept.sum(dim=-1).max())
        tokens, kept = order[:, :width], kept[:, :width]
        perturbed = ordered[:, :width] + gumbel_noise(keys, step, tokens)
        best = perturbed.masked_fill(~kept, float("-inf")).argmax(dim=-1, keepdim=True)
        drawn = tokens.gather(1, best)
        return torch.full_like(scores, float("-inf")).scatter_(1, drawn, 0.0)
