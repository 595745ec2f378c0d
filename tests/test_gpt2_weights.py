"""GPT-2 import on a tiny GPT-2 that the test builds with transformers and saves locally (the path that
init_from='gpt2' takes with the real weights online)."""
import pytest
import torch

from nanoaha import checkpoint
import train
from nanoaha.configurator import parse_args
from nanoaha.gpt2_weights import gpt2_state_dict
from model import GPT, GPTConfig
from nanoaha.train_config import TrainConfig

transformers = pytest.importorskip("transformers")

GPT2_KEYS = {"bias": True, "position_embedding": "learned", "gelu_approximate": "tanh"}


@pytest.fixture
def tiny_gpt2(tmp_path):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=256, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # biases and norms away from their 0 / 1 init, so a missed one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path / "tiny_gpt2"
    model.save_pretrained(path)
    return model, f"hf:{path}"


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


def test_train_fine_tunes_routers_onto_gpt2(tmp_path, tiny_gpt2, tiny_corpus):
    _, init_from = tiny_gpt2
    values = {"data_dir": str(tiny_corpus), "out_dir": str(tmp_path / "out"), "init_from": init_from,
              "vocab_size": 256, "block_size": 48, "n_layer": 2, "n_head": 2, "n_embd": 32, "window": 8,
              "max_iters": 3, "eval_interval": 3, "eval_iters": 1, "batch_size": 2, "tensorboard": False,
              "trainable": "router", "router_lambda_ramp": 0, "router_lambda": 0.1, "device": "cpu", **GPT2_KEYS}
    tcfg, mcfg = parse_args([f"--{k}={v!r}" if isinstance(v, str) else f"--{k}={v}" for k, v in values.items()],
                            TrainConfig, GPTConfig)
    train.train(tcfg, mcfg)
    tuned = checkpoint.load_checkpoint(str(tmp_path / "out"), "cpu")["model"]
    imported = gpt2_state_dict(init_from, mcfg)
    assert all(torch.equal(tuned[k], v) for k, v in imported.items())  # only the routers trained
    assert any(tuned[k].abs().sum() > 0 for k in tuned if ".router." in k)


def test_the_gpt2_finetune_config_runs_shrunk(tmp_path, tiny_gpt2, tiny_corpus):
    _, init_from = tiny_gpt2
    values = {"data_dir": str(tiny_corpus), "out_dir": str(tmp_path / "out"), "init_from": init_from,
              "vocab_size": 256, "block_size": 48, "n_layer": 2, "n_head": 2, "n_embd": 32, "window": 8,
              "batch_size": 2, "max_iters": 2, "eval_interval": 2, "eval_iters": 1, "dtype": "float32",
              "compile": False, "tensorboard": False, "device": "cpu"}
    tcfg, mcfg = parse_args(["configs/gpt2_finetune_routed.py",
                             *(f"--{k}={v!r}" if isinstance(v, str) else f"--{k}={v}" for k, v in values.items())],
                            TrainConfig, GPTConfig)
    assert (mcfg.position_embedding, mcfg.gelu_approximate, mcfg.bias, mcfg.schedule) == ("learned", "tanh", True, "R")
    assert len(train.train(tcfg, mcfg)["losses"]) == 2
