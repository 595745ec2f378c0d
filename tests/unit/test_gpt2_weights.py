"""GPT-2 import on a tiny GPT-2 that the test builds with transformers and saves locally (the path that
init_from='gpt2' takes with the real weights online)."""
import pytest
import torch

from helpers import GPT2_KEYS
from model import GPT, GPTConfig
from nanoaha import checkpoint
from nanoaha.gpt2_weights import gpt2_state_dict


def ours(schedule, **overrides):
    values = {"vocab_size": 256, "block_size": 48, "n_layer": 2, "n_head": 2, "n_embd": 32, "window": 8,
              "schedule": schedule, **GPT2_KEYS}
    return GPTConfig(**{**values, **overrides})


@pytest.mark.parametrize("schedule", ["G", "R"])
def test_imported_gpt2_gives_gpt2s_logits(tiny_gpt2, schedule):
    hf, init_from = tiny_gpt2
    config = ours(schedule)
    model = GPT(config).eval()
    checkpoint.load_model_state(model, gpt2_state_dict(init_from, config), init_from, allow_new_routers=True)
    idx = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(idx, -1, 1)
    with torch.no_grad():
        expected = hf(idx).logits
        got = model(idx, targets).logits  # routed: zero-initialised routers start all-global, i.e. dense
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()


def test_import_names_the_settings_a_gpt2_needs(tiny_gpt2):
    _, init_from = tiny_gpt2
    with pytest.raises(ValueError, match="needs --bias=True --position_embedding='learned'"):
        gpt2_state_dict(init_from, GPTConfig(vocab_size=256, block_size=48, n_layer=2, n_head=2, n_embd=32))
    with pytest.raises(ValueError, match="needs --n_layer=2"):
        gpt2_state_dict(init_from, ours("G", n_layer=3))
    with pytest.raises(ValueError, match="block_size=128 is longer than GPT-2's 64"):
        gpt2_state_dict(init_from, ours("G", block_size=128))
