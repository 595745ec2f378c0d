import pytest
import torch

from helpers import small_config
from model import GPT


def tokens(B=2, T=40, vocab=64, seed=0):
    return torch.randint(vocab, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("schedule, n_sink, batch", [("R", 0, 1), ("LR", 2, 1), ("G", 0, 1), ("L", 3, 1),
                                                     ("RLGR", 2, 3)])
def test_generate_with_and_without_kv_cache_gives_same_tokens(schedule, n_sink, batch):
    torch.manual_seed(0)
    cfg = small_config(schedule=schedule, n_sink=n_sink, router_init_std=2.0, block_size=32, n_layer=len(schedule))
    model = GPT(cfg).eval()
    for p in model.parameters():  # larger weights: confident, far-from-tied predictions
        p.data.mul_(8.0)
    prompt = tokens(B=batch, T=5)
    # 60 new tokens run past block_size=32 twice, so the context restarts and the cache is refilled
    cached = model.generate(prompt, 60, temperature=0, use_kv_cache=True)
    uncached = model.generate(prompt, 60, temperature=0, use_kv_cache=False)
    assert torch.equal(cached, uncached)
    assert all(len(set(row.tolist())) > 3 for row in cached)  # not a degenerate repetition
