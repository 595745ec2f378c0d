import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from nanoaha import checkpoint
from nanoaha import device
from nanoaha import routing_stats
import train
from nanoaha.configurator import ConfigError, parse_args
from model import GPT, GPTConfig
from nanoaha.routing_stats import warn_collapse
from nanoaha.train_config import TrainConfig
from nanoaha.training import LambdaController, lr_at


def configs(tmp_path, corpus, **overrides):
    values = {"data_dir": str(corpus), "out_dir": str(tmp_path / "out"), "block_size": 32, "n_layer": 2,
              "n_head": 2, "n_embd": 32, "window": 8, "batch_size": 4, "max_iters": 40, "eval_interval": 20,
              "eval_iters": 2, "log_interval": 10, "warmup_iters": 5, "learning_rate": 3e-3, "router_lambda": 0.01,
              "router_lambda_ramp": 10, "tensorboard": False, "device": "cpu", **overrides}
    return parse_args([f"--{k}={v!r}" if isinstance(v, str) else f"--{k}={v}" for k, v in values.items()],
                      TrainConfig, GPTConfig)


@pytest.mark.slow
def test_short_training_lowers_the_loss_at_the_scheduled_learning_rate(tmp_path, tiny_corpus, capsys, monkeypatch):
    stepped_at = []  # the learning rate of every optimizer step, in every parameter group
    step = torch.optim.AdamW.step

    def recording_step(self, *args, **kwargs):
        stepped_at.append([group["lr"] for group in self.param_groups])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    tcfg, mcfg = configs(tmp_path, tiny_corpus, p_dense=0.2, log_interval=1)
    result = train.train(tcfg, mcfg)
    losses = result["losses"]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert result["val_loss"] < losses[0]
    assert stepped_at == [pytest.approx([lr_at(it, tcfg)] * 2) for it in range(tcfg.max_iters)]
    logged = re.findall(r"^iter (\d+): .* lr ([0-9.e+-]+) \|", capsys.readouterr().out, re.M)
    assert len(logged) == tcfg.max_iters
    for it, lr in logged:  # the log shows the rate of the step it reports, to 3 digits
        assert float(lr) == pytest.approx(lr_at(int(it) - 1, tcfg), rel=5e-3)


@pytest.mark.slow
@pytest.mark.parametrize("p_dense", [0.0, 0.5, 1.0])
def test_forced_global_steps_happen_at_rate_p_dense(tmp_path, tiny_corpus, capsys, p_dense):
    train.train(*configs(tmp_path, tiny_corpus, max_iters=30, log_interval=1, eval_interval=100, p_dense=p_dense))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter ")]
    forced = sum("[forced global]" in line for line in lines)
    assert len(lines) == 30
    if p_dense in (0.0, 1.0):
        assert forced == 30 * p_dense
    else:
        assert 5 <= forced <= 25


def test_training_passes_lambda_and_budget_to_the_loss(tmp_path, tiny_corpus, monkeypatch):
    calls = []
    forward = GPT.forward

    def recording_forward(self, idx, targets=None, **kwargs):
        if self.training:
            calls.append(kwargs)
        return forward(self, idx, targets, **kwargs)

    monkeypatch.setattr(GPT, "forward", recording_forward)
    train.train(*configs(tmp_path, tiny_corpus, max_iters=4, router_lambda=0.5, router_lambda_ramp=2,
                         router_budget=0.25, eval_interval=100))
    assert [c["router_budget"] for c in calls] == [0.25] * 4
    assert [c["penalty_weight"] for c in calls] == [0.25, 0.5, 0.5, 0.5]


@pytest.mark.slow
def test_lambda_controller_raises_lambda_above_the_target_and_lowers_it_below_zero():
    tcfg, _ = parse_args(["--router_target_global=0.2", "--router_lambda=0.01", "--router_target_rate=0.5"],
                         TrainConfig, GPTConfig)
    shared = LambdaController(tcfg, 3)
    torch.testing.assert_close(shared.weights(3), torch.full((3,), 0.01))  # starts at router_lambda
    shared.update(torch.tensor([0.9, 0.1, 0.2]))  # mean 0.4: twice the target, error clipped to 1
    torch.testing.assert_close(shared.weights(3), torch.full((3,), 0.01 * math.sinh(1.5) / math.sinh(1.0)))
    tcfg.router_target_per_layer = True
    per_layer = LambdaController(tcfg, 3)
    for _ in range(4):  # layer 0 above its target, 1 below it, 2 on it
        per_layer.update(torch.tensor([0.9, 0.0, 0.2]))
    lam = per_layer.weights(3)
    assert lam[0] > 0.01 and lam[1] < 0 and lam[2] == pytest.approx(0.01)  # below zero: a reward for global
    for _ in range(100):
        per_layer.update(torch.tensor([1.0, 0.0, 0.2]))
    torch.testing.assert_close(per_layer.weights(3)[:2], torch.tensor([1.0, -1.0]))  # +- router_lambda_max


@pytest.mark.slow
def test_budget_targeted_training_adapts_lambda_and_writes_the_summary(tmp_path, tiny_corpus, capsys):
    """Routers start all global (bias 3): lambda grows, up to router_lambda_max, while the layers stay above
    the target; the summary file says so."""
    result = train.train(*configs(tmp_path, tiny_corpus, max_iters=60, router_target_global=0.25, router_lambda=0.01,
                                  router_target_rate=0.2, router_lambda_ramp=0, router_init_bias=3.0,
                                  router_target_per_layer=True, router_lambda_max=0.5))
    with open(tmp_path / "out" / "train_summary.json") as f:
        summary = json.load(f)
    assert summary["complete"] and summary["iter_num"] == 60 and summary["max_iters"] == 60
    assert [it for it, _ in summary["val_history"]] == [0, 20, 40, 60]
    assert summary["val_loss"] == pytest.approx(result["val_loss"]) and summary["tokens_per_s"] > 0
    assert summary["router_lambdas"] == [pytest.approx(0.5, rel=1e-5)] * 2  # pushed up from 0.01, capped
    assert len(summary["global_frac_per_layer"]) == 2


def test_sparse_from_iter_trains_exact_first_then_sparse(tmp_path, tiny_corpus, monkeypatch):
    modes = []
    forward = GPT.forward

    def recording_forward(self, idx, targets=None, **kwargs):
        out = forward(self, idx, targets, **kwargs)
        if self.training:
            modes.append(out.routed_mode)
        return out

    monkeypatch.setattr(GPT, "forward", recording_forward)
    train.train(*configs(tmp_path, tiny_corpus, max_iters=6, routed_mode="sparse", sparse_from_iter=4,
                         eval_interval=100))
    assert modes == ["exact"] * 4 + ["sparse"] * 2
    assert checkpoint.load_checkpoint(str(tmp_path / "out"), "cpu")["model_config"]["routed_mode"] == "sparse"
    with pytest.raises(ValueError, match="set routed_mode='sparse'"):
        train.train(*configs(tmp_path, tiny_corpus, max_iters=2, sparse_from_iter=1))
    with pytest.raises(ValueError, match="needs learned routers"):
        train.train(*configs(tmp_path, tiny_corpus, max_iters=2, schedule="G", router_target_global=0.1))


def test_resume_continues_with_identical_losses(tmp_path, tiny_corpus):
    common = {"lr_decay_iters": 12, "eval_interval": 100, "p_dense": 0.3, "routing": "random", "dropout": 0.1}
    straight = train.train(*configs(tmp_path / "a", tiny_corpus, max_iters=12, **common))["losses"]
    train.train(*configs(tmp_path / "b", tiny_corpus, max_iters=6, **common))
    resumed = train.train(*configs(tmp_path / "b", tiny_corpus, max_iters=12, init_from="resume", **common))["losses"]
    assert resumed == straight[6:]


@pytest.mark.slow
def test_resume_refuses_another_model_shape(tmp_path, tiny_corpus):
    train.train(*configs(tmp_path, tiny_corpus, max_iters=2))
    with pytest.raises(ValueError, match="model config differs"):
        train.train(*configs(tmp_path, tiny_corpus, max_iters=4, init_from="resume", n_embd=64))


@pytest.mark.slow
def test_finetune_dense_checkpoint_into_routed_model(tmp_path, tiny_corpus):
    train.train(*configs(tmp_path / "dense", tiny_corpus, max_iters=2, schedule="G"))
    result = train.train(*configs(tmp_path / "routed", tiny_corpus, max_iters=0, schedule="R",
                                  init_from=str(tmp_path / "dense" / "out")))
    assert result["routing"]["routed_global_frac"].item() == 1.0  # zero-initialised routers start all-global
    with pytest.raises(ValueError, match="another model shape"):
        train.train(*configs(tmp_path / "wide", tiny_corpus, max_iters=2, n_embd=64,
                             init_from=str(tmp_path / "dense" / "out")))


@pytest.mark.slow
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
    checkpoint.save_checkpoint(path, {"iter_num": 1})

    def crash(obj, f, *args, **kwargs):
        with open(f, "wb") as handle:
            handle.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(path, {"iter_num": 2})
    assert checkpoint.load_checkpoint(path, "cpu")["iter_num"] == 1
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_corrupt_checkpoint_and_missing_data_give_clear_errors(tmp_path, tiny_corpus):
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="corrupt"):
        checkpoint.load_checkpoint(str(tmp_path), "cpu")
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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


@pytest.mark.slow
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
    assert re.search(r"\[prefill 4 tokens, [0-9,]+ tok/s \| decode 9 tokens, [0-9,]+ tok/s \| KV cache [0-9.]+ MiB\]",
                     sampled.stdout)
    bad = run("train.py", "configs/quickstart.py", "--max_iter=3")
    assert bad.returncode != 0 and "did you mean max_iters" in bad.stderr


def test_collapse_is_reported(capsys):
    kinds = ["routed", "routed", "local"]
    stats = {"global_frac": torch.tensor([[0.0, 0.001], [0.3, 0.2], [0.0, 0.0]]),
             "mean_p": torch.tensor([[0.01, 0.02], [0.4, 0.3], [float("nan")] * 2])}
    assert warn_collapse(stats, kinds, 0.005, step=250) == [0]
    assert "router collapse in layer(s) 0 (0.05% global" in capsys.readouterr().out


@pytest.mark.slow
def test_compile_trains_like_eager_on_the_cpu(tmp_path, tiny_corpus):
    common = {"max_iters": 3, "eval_interval": 100, "n_layer": 1, "schedule": "G", "attention_backend": "torch"}
    eager = train.train(*configs(tmp_path / "eager", tiny_corpus, **common))
    compiled = train.train(*configs(tmp_path / "compiled", tiny_corpus, compile=True, **common))
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-4)
    assert compiled["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-4)


def test_training_flops_count_parameters_and_attention_as_computed():
    config = GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, window=8)
    attention_dense = 6 * 2 * 32 * 64  # 4 d FLOPs per query-key pair, x3 with the backward, T / 2 keys, 2 layers
    assert routing_stats.training_flops_per_token(config, 1000, 1.0) == 6 * 1000 + attention_dense
    assert routing_stats.training_flops_per_token(config, 1000, 0.25) == 6 * 1000 + attention_dense / 4
    learned = GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, window=8, position_embedding="learned")
    assert routing_stats.training_flops_per_token(learned, 1000 + 64 * 32, 0.0) == 6 * 1000
    assert device.peak_flops("cpu", torch.bfloat16) is None
