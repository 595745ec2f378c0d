"""GPT-2 import on a tiny GPT-2 that the test builds with transformers and saves locally (the path that
init_from='gpt2' takes with the real weights online)."""
import torch

import train
from helpers import CPU_FP32, GPT2_KEYS, train_configs
from nanoaha import checkpoint
from nanoaha.gpt2_weights import gpt2_state_dict


def test_train_fine_tunes_routers_onto_gpt2(tmp_path, tiny_gpt2, tiny_corpus):
    _, init_from = tiny_gpt2
    values = {"data_dir": str(tiny_corpus), "out_dir": str(tmp_path / "out"), "init_from": init_from,
              "vocab_size": 256, "block_size": 48, "n_layer": 2, "n_head": 2, "n_embd": 32, "window": 8,
              "max_iters": 3, "eval_interval": 3, "eval_iters": 1, "batch_size": 2, "tensorboard": False,
              "trainable": "router", "router_lambda_ramp": 0, "router_lambda": 0.1, **CPU_FP32, **GPT2_KEYS}
    tcfg, mcfg = train_configs(values)
    train.train(tcfg, mcfg)
    tuned = checkpoint.load_checkpoint(str(tmp_path / "out"), "cpu")["model"]
    imported = gpt2_state_dict(init_from, mcfg)
    assert all(torch.equal(tuned[k], v) for k, v in imported.items())  # only the routers trained
    assert any(tuned[k].abs().sum() > 0 for k in tuned if ".router." in k)


def test_the_gpt2_finetune_config_runs_shrunk(tmp_path, tiny_gpt2, tiny_corpus):
    _, init_from = tiny_gpt2
    values = {"data_dir": str(tiny_corpus), "out_dir": str(tmp_path / "out"), "init_from": init_from,
              "vocab_size": 256, "block_size": 48, "n_layer": 2, "n_head": 2, "n_embd": 32, "window": 8,
              "batch_size": 2, "max_iters": 2, "eval_interval": 2, "eval_iters": 1, "compile": False,
              "tensorboard": False, **CPU_FP32}
    tcfg, mcfg = train_configs(values, "configs/gpt2_finetune_routed.py")
    assert (mcfg.position_embedding, mcfg.gelu_approximate, mcfg.bias, mcfg.schedule) == ("learned", "tanh", True, "R")
    assert len(train.train(tcfg, mcfg)["losses"]) == 2
    # it started from GPT-2's weights and trained all of them: two AdamW steps move a weight by about
    # 2 * learning_rate at most, where another init would differ by the init's scale (std 0.02)
    tuned = checkpoint.load_checkpoint(str(tmp_path / "out"), "cpu")["model"]
    moved = {k: float((tuned[k] - v).abs().max()) for k, v in gpt2_state_dict(init_from, mcfg).items()}
    assert max(moved.values()) <= 3 * tcfg.learning_rate and sum(m > 0 for m in moved.values()) > len(moved) / 2
    assert any(".router." in k for k in tuned)
