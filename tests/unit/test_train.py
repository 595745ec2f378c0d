import os
import re

import pytest
import torch

import train
from helpers import ROOT, tiny_train_configs
from model import GPTConfig
from nanoaha import checkpoint, device, routing_stats
from nanoaha.configurator import ConfigError, parse_args
from nanoaha.routing_stats import warn_collapse
from nanoaha.train_config import TrainConfig
from nanoaha.training import lr_at


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    checkpoint.save_checkpoint(path, {"model": {}, "model_config": {}, "iter_num": 1})

    def crash(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(path, {"model": {}, "model_config": {}, "iter_num": 2})
    assert checkpoint.load_checkpoint(path, "cpu")["iter_num"] == 1
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_corrupt_checkpoint_and_missing_data_give_clear_errors(tmp_path, tiny_corpus):
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="corrupt"):
        checkpoint.load_checkpoint(str(tmp_path), "cpu")
    with pytest.raises(FileNotFoundError, match="prepare"):
        train.train(*tiny_train_configs(tmp_path, tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="vocab_size"):
        train.train(*tiny_train_configs(tmp_path, tiny_corpus, vocab_size=100))
    with pytest.raises(ValueError, match="block_size"):
        train.train(*tiny_train_configs(tmp_path, tiny_corpus, block_size=4096, window=8))


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="did you mean learning_rate"):
        parse_args(["--learning_rat=0.1"], TrainConfig, GPTConfig)
    with pytest.raises(ConfigError, match="'max_iters' expects int"):
        parse_args(["--max_iters=1.5"], TrainConfig, GPTConfig)
    with pytest.raises(ConfigError, match="'router_target_global' expects float, got the string 'high'"):
        parse_args(["--router_target_global=high"], TrainConfig, GPTConfig)
    with pytest.raises(ConfigError, match="'random_global_q' expects float or list, got the string 'high'"):
        parse_args(["--random_global_q=high"], TrainConfig, GPTConfig)
    config_file = tmp_path / "bad.py"
    config_file.write_text("import math\nwindw = 4\n")
    with pytest.raises(ConfigError, match="unknown config key 'windw'; did you mean window"):
        parse_args([str(config_file)], TrainConfig, GPTConfig)
    with pytest.raises(ConfigError, match="window=64 must be between 1 and block_size=32"):
        parse_args(["--window=64", "--block_size=32"], TrainConfig, GPTConfig)
    tcfg, mcfg = parse_args(["configs/quickstart.py", "--schedule=LG", "--progress_bar"], TrainConfig, GPTConfig)
    assert mcfg.schedule == "LG" and mcfg.window == 32 and tcfg.progress_bar is True


def test_every_config_file_runs_alone_or_names_the_file_to_put_first():
    root = ROOT
    names = sorted(n for n in os.listdir(os.path.join(root, "configs")) if n.endswith(".py"))  # grids/: compare.py
    assert "recall_finetune.py" in names
    overlays = 0
    for name in names:
        path = os.path.join(root, "configs", name)
        try:
            tcfg, mcfg = parse_args([path], TrainConfig, GPTConfig)
        except ConfigError as e:
            base = re.search(r"is an overlay on (\S+): put that file first", str(e))
            assert base, f"{name}: {e}"
            tcfg, mcfg = parse_args([os.path.join(root, base.group(1)), path], TrainConfig, GPTConfig)
            overlays += 1
        assert tcfg.max_iters > 0 and mcfg.window <= mcfg.block_size
    assert overlays >= 3  # recall_local, recall_routed, recall_finetune
    tcfg, mcfg = parse_args([os.path.join(root, "configs", f) for f in ("recall.py", "recall_routed.py")],
                            TrainConfig, GPTConfig)
    assert tcfg.dataset == "recall" and mcfg.schedule == "R" and tcfg.p_dense == 0.1


def test_learning_rate_warms_up_then_decays_between_its_bounds():
    tcfg, _ = parse_args(["--learning_rate=1e-3", "--min_lr=1e-4", "--warmup_iters=10", "--max_iters=100"],
                         TrainConfig, GPTConfig)
    lrs = [lr_at(it, tcfg) for it in range(120)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)  # linear warm-up to the peak ...
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # ... then it only decays
    assert lrs[55] == pytest.approx(5.5e-4)  # half way through the cosine: the mean of the bounds
    assert max(lrs) <= 1e-3 + 1e-12 and min(lrs) >= 1e-4 - 1e-12
    assert lrs[100] == lrs[119] == pytest.approx(1e-4)


def test_collapse_is_reported(capsys):
    kinds = ["routed", "routed", "local"]
    stats = {"global_frac": torch.tensor([[0.0, 0.001], [0.3, 0.2], [0.0, 0.0]]),
             "mean_p": torch.tensor([[0.01, 0.02], [0.4, 0.3], [float("nan")] * 2])}
    assert warn_collapse(stats, kinds, 0.005, step=250) == [0]
    assert "router collapse in layer(s) 0 (0.05% global" in capsys.readouterr().out


def test_training_flops_count_parameters_and_attention_as_computed():
    config = GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, window=8)
    attention_dense = 6 * 2 * 32 * 64  # 4 d FLOPs per query-key pair, x3 with the backward, T / 2 keys, 2 layers
    assert routing_stats.training_flops_per_token(config, 1000, 1.0) == 6 * 1000 + attention_dense
    assert routing_stats.training_flops_per_token(config, 1000, 0.25) == 6 * 1000 + attention_dense / 4
    learned = GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, window=8, position_embedding="learned")
    assert routing_stats.training_flops_per_token(learned, 1000 + 64 * 32, 0.0) == 6 * 1000
    assert device.peak_flops("cpu", torch.bfloat16) is None
