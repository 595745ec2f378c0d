import os
import socket
import subprocess
import sys

import pytest
import torch

import train
from configurator import ConfigError, parse_args
from model import GPTConfig
from train import TrainConfig


def configs(tmp_path, corpus, **overrides):
    values = {"data_dir": str(corpus), "out_dir": str(tmp_path / "out"), "block_size": 32, "n_layer": 2,
              "n_head": 2, "n_embd": 32, "window": 8, "batch_size": 4, "max_iters": 40, "eval_interval": 20,
              "eval_iters": 2, "log_interval": 10, "warmup_iters": 5, "learning_rate": 3e-3, "router_lambda": 0.01,
              "router_lambda_ramp": 10, "tensorboard": False, "device": "cpu", **overrides}
    return parse_args([f"--{k}={v!r}" if isinstance(v, str) else f"--{k}={v}" for k, v in values.items()],
                      TrainConfig, GPTConfig)


def test_short_training_lowers_the_loss(tmp_path, tiny_corpus):
    result = train.train(*configs(tmp_path, tiny_corpus, p_dense=0.2))
    losses = result["losses"]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert result["val_loss"] < losses[0]


def test_resume_continues_with_identical_losses(tmp_path, tiny_corpus):
    common = {"lr_decay_iters": 12, "eval_interval": 100, "p_dense": 0.3, "routing": "random", "dropout": 0.1}
    straight = train.train(*configs(tmp_path / "a", tiny_corpus, max_iters=12, **common))["losses"]
    train.train(*configs(tmp_path / "b", tiny_corpus, max_iters=6, **common))
    resumed = train.train(*configs(tmp_path / "b", tiny_corpus, max_iters=12, init_from="resume", **common))["losses"]
    assert resumed == straight[6:]


def test_resume_refuses_another_model_shape(tmp_path, tiny_corpus):
    train.train(*configs(tmp_path, tiny_corpus, max_iters=2))
    with pytest.raises(ValueError, match="model config differs"):
        train.train(*configs(tmp_path, tiny_corpus, max_iters=4, init_from="resume", n_embd=64))


def test_finetune_dense_checkpoint_into_routed_model(tmp_path, tiny_corpus):
    train.train(*configs(tmp_path / "dense", tiny_corpus, max_iters=2, schedule="G"))
    result = train.train(*configs(tmp_path / "routed", tiny_corpus, max_iters=0, schedule="R",
                                  init_from=str(tmp_path / "dense" / "out")))
    assert result["routing"]["routed_global_frac"].item() == 1.0  # zero-initialised routers start all-global
    with pytest.raises(ValueError, match="another model shape"):
        train.train(*configs(tmp_path / "wide", tiny_corpus, max_iters=2, n_embd=64,
                             init_from=str(tmp_path / "dense" / "out")))


def test_router_only_finetune_leaves_the_rest_frozen(tmp_path, tiny_corpus):
    train.train(*configs(tmp_path / "dense", tiny_corpus, max_iters=2, schedule="G"))
    dense = torch.load(tmp_path / "dense" / "out" / "ckpt.pt", weights_only=False)["model"]
    train.train(*configs(tmp_path / "ft", tiny_corpus, max_iters=5, schedule="R", trainable="router",
                         router_lambda_ramp=0, init_from=str(tmp_path / "dense" / "out")))
    tuned = torch.load(tmp_path / "ft" / "out" / "ckpt.pt", weights_only=False)["model"]
    routers = [name for name in tuned if ".router." in name]
    assert routers and all(torch.equal(tuned[name], dense[name]) for name in dense)
    assert any(not torch.equal(tuned[name], torch.zeros_like(tuned[name])) for name in routers)
    with pytest.raises(ValueError, match="needs learned routers"):
        train.train(*configs(tmp_path / "g", tiny_corpus, max_iters=1, schedule="G", trainable="router"))


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.pt")
    train.save_checkpoint(path, {"iter_num": 1})

    def crash(obj, f, *args, **kwargs):
        with open(f, "wb") as handle:
            handle.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        train.save_checkpoint(path, {"iter_num": 2})
    assert train.load_checkpoint(path, "cpu")["iter_num"] == 1
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_corrupt_checkpoint_and_missing_data_give_clear_errors(tmp_path, tiny_corpus):
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="corrupt"):
        train.load_checkpoint(str(tmp_path), "cpu")
    with pytest.raises(FileNotFoundError, match="prepare"):
        train.train(*configs(tmp_path, tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="vocab_size"):
        train.train(*configs(tmp_path, tiny_corpus, vocab_size=100))
    with pytest.raises(ValueError, match="block_size"):
        train.train(*configs(tmp_path, tiny_corpus, block_size=4096, window=8))


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="did you mean learning_rate"):
        parse_args(["--learning_rat=0.1"], TrainConfig, GPTConfig)
    with pytest.raises(ConfigError, match="'max_iters' expects int"):
        parse_args(["--max_iters=1.5"], TrainConfig, GPTConfig)
    config_file = tmp_path / "bad.py"
    config_file.write_text("import math\nwindw = 4\n")
    with pytest.raises(ConfigError, match="unknown config key 'windw'; did you mean window"):
        parse_args([str(config_file)], TrainConfig, GPTConfig)
    with pytest.raises(ConfigError, match="window=64 must be between 1 and block_size=32"):
        parse_args(["--window=64", "--block_size=32"], TrainConfig, GPTConfig)
    tcfg, mcfg = parse_args(["configs/quickstart.py", "--schedule=LG", "--progress_bar"], TrainConfig, GPTConfig)
    assert mcfg.schedule == "LG" and mcfg.window == 32 and tcfg.progress_bar is True


def test_every_config_file_parses():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = sorted(os.listdir(os.path.join(root, "configs")))
    assert "recall_finetune.py" in names
    for name in names:  # recall_*.py are overlays on recall.py
        files = ["configs/recall.py"] * name.startswith("recall_") + [f"configs/{name}"]
        tcfg, mcfg = parse_args([os.path.join(root, f) for f in files], TrainConfig, GPTConfig)
        assert tcfg.max_iters > 0 and mcfg.window <= mcfg.block_size


def test_train_and_sample_command_lines(tmp_path, tiny_corpus):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "out"
    run = lambda *args: subprocess.run([sys.executable, *args], cwd=root, capture_output=True, text=True)
    trained = run("train.py", "configs/quickstart.py", f"--data_dir={tiny_corpus}", f"--out_dir={out}",
                  "--max_iters=3", "--eval_iters=1", "--block_size=32", "--window=8", "--n_layer=1",
                  "--log_interval=1", "--device=cpu")
    assert trained.returncode == 0, trained.stderr
    assert "iter 3: loss" in trained.stdout and "tok/s" in trained.stdout
    sampled = run("sample.py", f"--out_dir={out}", "--start=def ", "--max_new_tokens=10", "--show_routing",
                  "--device=cpu")
    assert sampled.returncode == 0, sampled.stderr
    assert "heads that went global" in sampled.stdout and "\x1b[48;5;" in sampled.stdout
    bad = run("train.py", "configs/quickstart.py", "--max_iter=3")
    assert bad.returncode != 0 and "did you mean max_iters" in bad.stderr


def test_ddp_two_processes_on_cpu(tmp_path, tiny_corpus):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with socket.socket() as s:  # a free loopback port for the rendezvous, on the loopback interface only
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
                             "--master_addr=127.0.0.1", f"--master_port={port}",
                             "train.py", "configs/quickstart.py", f"--data_dir={tiny_corpus}",
                             f"--out_dir={tmp_path}", "--max_iters=2", "--eval_iters=1", "--block_size=32",
                             "--window=8", "--n_layer=1", "--log_interval=1", "--tensorboard=False"],
                            cwd=root, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    assert result.returncode == 0, result.stdout[-1000:] + result.stderr[-3000:]
    assert "2 process(es)" in result.stdout and "iter 2: loss" in result.stdout
    assert train.load_checkpoint(str(tmp_path), "cpu")["iter_num"] == 2


def test_collapse_is_reported(capsys):
    kinds = ["routed", "routed", "local"]
    stats = {"global_frac": torch.tensor([[0.0, 0.001], [0.3, 0.2], [0.0, 0.0]]),
             "mean_p": torch.tensor([[0.01, 0.02], [0.4, 0.3], [float("nan")] * 2])}
    assert train.warn_collapse(stats, kinds, 0.005, step=250) == [0]
    assert "router collapse in layer(s) 0 (0.05% global" in capsys.readouterr().out
