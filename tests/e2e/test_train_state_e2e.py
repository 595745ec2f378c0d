"""What a training step leaves in the run's state (each test trains a tiny model for a few steps): the lambda
controller ignores forced-global steps, and a run in sparse_from_iter's exact steps records the mode it trains
towards without ever writing the model's config."""
import json

import pytest
import torch

import train
from helpers import CPU_FP32, train_configs
from model import GPTConfig
from nanoaha import checkpoint

TINY = {"block_size": 16, "window": 4, "n_layer": 1, "n_head": 2, "n_embd": 16, "batch_size": 2, "eval_iters": 1,
        "eval_interval": 100, "log_interval": 100, "warmup_iters": 1, "tensorboard": False, "progress_bar": False,
        **CPU_FP32}


def configs(out_dir, corpus, **overrides):
    values = {"data_dir": str(corpus), "out_dir": str(out_dir), **TINY, **overrides}
    return train_configs(values)


def router_lambdas(out_dir):
    with open(out_dir / "train_summary.json") as f:
        return json.load(f)["router_lambdas"]


def test_the_lambda_controller_ignores_forced_global_steps(tmp_path, tiny_corpus):
    """Every step forced global (p_dense=1): the routers' choice was overridden, so the lambdas must stay at
    router_lambda; the same run without forced steps moves them (all global at init, above the target)."""
    common = {"max_iters": 2, "router_target_global": 0.25, "router_lambda": 0.01, "router_lambda_ramp": 0}
    train.train(*configs(tmp_path / "forced", tiny_corpus, p_dense=1.0, **common))
    assert router_lambdas(tmp_path / "forced") == [pytest.approx(0.01)]
    assert checkpoint.load_checkpoint(str(tmp_path / "forced"), "cpu")["router_lambda_state"].tolist() == [1.0]
    train.train(*configs(tmp_path / "free", tiny_corpus, p_dense=0.0, **common))
    assert router_lambdas(tmp_path / "free")[0] > 0.01


def test_a_checkpoint_in_the_exact_steps_of_sparse_from_iter_records_sparse(tmp_path, tiny_corpus, monkeypatch):
    """Checkpoints at steps 0 and 2 of a run that trains exact until step 4, then sparse: they record the mode
    the run trains towards, and nothing writes the model's config meanwhile (it is the run's given config)."""
    tcfg, mcfg = configs(tmp_path, tiny_corpus, max_iters=2, routed_mode="sparse", sparse_from_iter=4,
                         eval_interval=2)

    def refuse(self, name, value):
        raise AssertionError(f"config.{name} written at run time")

    monkeypatch.setattr(GPTConfig, "__setattr__", refuse)
    train.train(tcfg, mcfg)
    for name in ("ckpt.pt", checkpoint.BEST_NAME):
        ckpt = checkpoint.load_checkpoint(str(tmp_path / name), "cpu")
        assert ckpt["model_config"]["routed_mode"] == "sparse" and ckpt["iter_num"] in (0, 2)


def test_a_run_resumed_under_auto_keeps_the_precision_it_trained_in(tmp_path, tiny_corpus, capsys):
    """auto picks per machine (never fp16): a checkpoint trained in fp16 and resumed with dtype=auto goes on in
    fp16, says so in its first line, and the checkpoint and summary record the precision; a dtype named on the
    command line is used as given."""
    train.train(*configs(tmp_path, tiny_corpus, max_iters=2, dtype="float16"))
    assert checkpoint.load_checkpoint(str(tmp_path), "cpu")["dtype"] == "float16"
    capsys.readouterr()
    train.train(*configs(tmp_path, tiny_corpus, max_iters=4, dtype="auto", init_from="resume"))
    out = capsys.readouterr().out
    assert "continues in float16, the precision it trained in (dtype=auto" in out
    assert "float16 (auto: the checkpoint's; this machine would pick" in out
    with open(tmp_path / "train_summary.json") as f:
        assert json.load(f)["dtype"] == "float16"
    assert checkpoint.load_checkpoint(str(tmp_path), "cpu")["dtype"] == "float16"
    train.train(*configs(tmp_path, tiny_corpus, max_iters=6, dtype="float32", init_from="resume"))
    assert "trained in float16 so far, continues in float32" in capsys.readouterr().out
    assert checkpoint.load_checkpoint(str(tmp_path), "cpu")["dtype"] == "float32"


def test_the_training_wall_time_adds_up_over_resumes_from_the_checkpoint(tmp_path, tiny_corpus):
    """train_wall_s is the checkpoint's plus this process's loop, so a process killed after its last checkpoint
    (the grid runner killed with it never records it) still counts; a checkpoint from before the field leaves
    it unknown (None), not this process's time alone."""
    train.train(*configs(tmp_path, tiny_corpus, max_iters=2, eval_interval=2))
    carried = checkpoint.load_checkpoint(str(tmp_path), "cpu")["train_wall_s"]
    assert carried > 0
    train.train(*configs(tmp_path, tiny_corpus, max_iters=4, eval_interval=2, init_from="resume"))
    with open(tmp_path / "train_summary.json") as f:
        summary = json.load(f)
    assert summary["train_wall_s"] == pytest.approx(carried + summary["wall_s"], abs=0.05)
    assert checkpoint.load_checkpoint(str(tmp_path), "cpu")["train_wall_s"] > carried

    old = checkpoint.load_checkpoint(str(tmp_path), "cpu")
    del old["train_wall_s"], old["format"]
    torch.save(old, str(tmp_path / "ckpt.pt"))  # as written before checkpoints kept their wall time
    train.train(*configs(tmp_path, tiny_corpus, max_iters=6, eval_interval=2, init_from="resume"))
    with open(tmp_path / "train_summary.json") as f:
        summary = json.load(f)
    assert summary["train_wall_s"] is None and summary["wall_s"] > 0
    assert checkpoint.load_checkpoint(str(tmp_path), "cpu")["train_wall_s"] is None


def test_routers_held_local_run_local_still_learn_and_the_penalty_waits(tmp_path, tiny_corpus, capsys):
    """router_local_iters=3: the first three steps and the step-0 evaluation run every routed decision local
    (the routers start all-global, p = 0.5), with no penalty and a still controller, while the routers learn by the
    straight-through gradient; from step 3 the routers decide and the controller moves."""
    common = {"schedule": "R", "router_target_global": 0.25, "router_lambda": 0.01, "router_lambda_ramp": 0,
              "router_local_iters": 3, "log_interval": 1}
    train.train(*configs(tmp_path / "held", tiny_corpus, max_iters=3, **common))
    lines = capsys.readouterr().out.splitlines()
    held = [line for line in lines if line.startswith("iter ")]
    assert len(held) == 3 and all("[held local]" in line and "global 0.0%" in line and "penalty 0;" in line
                                  for line in held)
    assert "global 0.0%" in next(line for line in lines if line.startswith("step 0:"))
    ckpt = checkpoint.load_checkpoint(str(tmp_path / "held"), "cpu")
    assert ckpt["router_lambda_state"].tolist() == [1.0]
    assert ckpt["model"]["blocks.0.attn.router.logits.weight"].abs().max() > 0  # zero at init: it learned

    train.train(*configs(tmp_path / "held", tiny_corpus, max_iters=5, init_from="resume", **common))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter ")]
    assert len(lines) == 2 and not any("[held local]" in line for line in lines)
    assert any("global 0.0%" not in line for line in lines)
    assert router_lambdas(tmp_path / "held")[0] != pytest.approx(0.01)


@pytest.mark.parametrize("overrides, message", [
    ({"schedule": "L"}, "router_local_iters holds learned routers local"),
    ({"routed_mode": "sparse"}, "which sparse mode does not compute for local tokens"),
    ({"router_explore": 0.1}, "set one of them to 0"),
])
def test_router_local_iters_refuses_what_it_cannot_hold(tmp_path, tiny_corpus, overrides, message):
    with pytest.raises(ValueError, match=message):
        train.train(*configs(tmp_path, tiny_corpus, max_iters=1, router_local_iters=2,
                             **{"schedule": "R", **overrides}))
