"""Keyed sampling: each row's tokens follow from its own key, with the distribution do_sample has."""

import math

import pytest
import torch

from engines import EngineConfig, SamplingConfig, make_engine
from engines.keyed_sampling import KeyedSampler, gumbel_noise, row_keys

CONVERSATIONS = [
    [{"role": "user", "content": "Write a program that prints the sum of two numbers."}],
    [{"role": "user", "content": "Read n and print n squared."}],
    [{"role": "user", "content": "Print the largest of the numbers on the first line."}],
]


def sample(logits: torch.Tensor, keys: list[int], temperature=1.0, top_p=1.0) -> torch.Tensor:
    """One decoding step of every row: the token the engine would pick."""
    sampler = KeyedSampler(keys, prompt_width=3, temperature=temperature, top_p=top_p)
    ids = torch.zeros((len(keys), 5), dtype=torch.int64)  # step 2 of a 3-token prompt
    return sampler(ids, logits.expand(len(keys), -1).clone()).argmax(dim=-1)


def test_tokens_follow_softmax_at_the_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    keys = [k for row in row_keys(0, [[i] for i in range(20_000)], 1) for k in row]
    for temperature in (0.6, 1.0):
        picks = sample(logits, keys, temperature)
        observed = torch.bincount(picks, minlength=5).float() / len(keys)
        expected = (logits[0] / temperature).softmax(-1)
        assert torch.allclose(observed, expected, atol=0.012), (temperature, observed, expected)


def test_top_p_keeps_the_nucleus_only():
    logits = torch.tensor([[3.0, 2.0, 0.0, -1.0, -2.0]])  # p = 0.69, 0.25, 0.03, ...
    keys = [k for row in row_keys(1, [[i] for i in range(5_000)], 1) for k in row]
    picks = sample(logits, keys, 1.0, top_p=0.9)
    assert set(picks.tolist()) == {0, 1}  # the smallest set reaching 0.9
    share = (picks == 0).float().mean().item()
    assert abs(share - 0.69 / 0.94) < 0.03


def test_noise_is_gumbel_and_depends_on_key_and_step():
    keys = torch.tensor([k for row in row_keys(7, [[1, 2]], 64) for k in row])
    noise = gumbel_noise(keys, 0, torch.arange(4096))
    assert abs(noise.mean().item() - 0.5772) < 0.01  # Euler's constant
    assert abs(noise.std().item() - math.pi / math.sqrt(6)) < 0.01
    assert torch.equal(noise, gumbel_noise(keys, 0, torch.arange(4096)))
    assert not torch.equal(noise[:, :100], gumbel_noise(keys, 1, torch.arange(100)))


def test_row_keys_per_seed_prompt_occurrence_and_sample():
    keys = row_keys(3, [[5, 6], [5, 6], [7]], 2)
    flat = [k for row in keys for k in row]
    assert len(set(flat)) == 6  # a repeated prompt samples independently of its first copy
    assert row_keys(3, [[7], [5, 6]], 2) == [keys[2], keys[0]]  # order does not matter
    assert row_keys(4, [[5, 6]], 2)[0] != keys[0]
    assert row_keys(None, [[5, 6]], 1) != row_keys(None, [[5, 6]], 1)  # no seed: random


def test_models_that_agree_share_their_tokens():
    """Common random numbers: nearby logits under one key pick the same token far more often
    than under independent keys."""
    torch.manual_seed(0)
    logits = torch.randn(1, 50)
    nearby = logits + 0.1 * torch.randn(1, 50)
    keys = [k for row in row_keys(0, [[i] for i in range(2_000)], 1) for k in row]
    other = [k for row in row_keys(1, [[i] for i in range(2_000)], 1) for k in row]
    same_key = (sample(logits, keys) == sample(nearby, keys)).float().mean().item()
    other_key = (sample(logits, keys) == sample(nearby, other)).float().mean().item()
    assert same_key > 0.85 and other_key < 0.2, (same_key, other_key)


@pytest.fixture(scope="module")
def tiny_engine_factory(tiny_model_dir):
    engines = []

    def make(**updates):
        config = EngineConfig(kind="transformers", model=str(tiny_model_dir), device="cpu")
        engine = make_engine(config.model_copy(update=updates))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def texts(results):
    return [[c.text for c in row] for row in results]


def test_texts_do_not_depend_on_batching_or_order(tiny_engine_factory):
    sampling = SamplingConfig(n=3, max_new_tokens=12, seed=9)
    whole = tiny_engine_factory(batch_size=8).generate(CONVERSATIONS, sampling)
    alone = tiny_engine_factory(batch_size=1).generate(CONVERSATIONS, sampling)
    assert texts(alone) == texts(whole)
    reverse = tiny_engine_factory(batch_size=2).generate(CONVERSATIONS[::-1], sampling)
    assert texts(reverse[::-1]) == texts(whole)
    assert len({c for row in texts(whole) for c in row}) > 3  # it still samples


def test_the_sampler_is_part_of_a_stage_key(tiny_model_dir):
    """Trajectories sampled by an older sampler (or seeding) are not read back as this one's."""
    from cobalt.storage import code_version
    from cobalt.trajectories.stages import engine_identity

    local = engine_identity(EngineConfig(kind="transformers", model=str(tiny_model_dir)))
    assert local["sampler"] == code_version("engines.keyed_sampling")
    from engines.keyed_sampling import SEEDING

    # a server through LiteLLM and vLLM: how their requests are seeded (per conversation)
    served = engine_identity(EngineConfig(kind="litellm", model="served", api_base="http://x"))
    assert served["sampler"] == SEEDING
    gpu = engine_identity(EngineConfig(kind="vllm", model=str(tiny_model_dir)))
    assert gpu["sampler"] == SEEDING


def test_noise_on_the_nucleus_alone_draws_what_noise_on_every_token_draws():
    """The sampler hashes noise for the nucleus' tokens only; with transformers' top-p mask and
    noise on the whole vocabulary the draws are the same tokens."""
    torch.manual_seed(1)
    logits = torch.randn(300, 64) * 3
    keys = [k for row in row_keys(5, [[i] for i in range(300)], 1) for k in row]
    ids = torch.zeros((300, 7), dtype=torch.int64)
    drawn = KeyedSampler(keys, 4, 0.6, 0.9)(ids, logits.clone()).argmax(dim=-1)
    scaled = logits / 0.6
    ascending, order = torch.sort(scaled, descending=False)  # transformers' TopPLogitsWarper
    drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - 0.9
    drop[:, -1] = False
    masked = scaled.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    noise = gumbel_noise(torch.tensor(keys), 3, torch.arange(64))
    assert torch.equal(drawn, (masked + noise).argmax(dim=-1))


def test_a_batch_with_other_rows_than_keys_is_refused():
    """A generate call whose rows are not the keyed ones (beam search, a caller's bug) raises
    instead of sampling some rows with another row's noise."""
    sampler = KeyedSampler(row_keys(0, [[1]], 2)[0], prompt_width=1, temperature=1.0, top_p=1.0)
    with pytest.raises(ValueError, match="3 rows but 2 keys"):
        sampler(torch.zeros((3, 2), dtype=torch.int64), torch.zeros((3, 8)))
