import math
import os
import re
import time
from types import SimpleNamespace

import pytest
import torch

import train
from helpers import ROOT, tiny_train_configs
from model import GPTConfig
from nanoaha import checkpoint, device, routing_stats
from nanoaha.configurator import ConfigError, parse_args
from nanoaha.routing_stats import warn_collapse
from nanoaha.train_config import TrainConfig
from nanoaha.training import HeadCommitter, LambdaController, commit_start, lr_at


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
    kinds = ["routed", "routed", "local", "routed"]  # the last: random routing at rate 0 (no p), no collapse
    stats = {"global_frac": torch.tensor([[0.0, 0.001], [0.3, 0.2], [0.0, 0.0], [0.0, 0.0]]),
             "mean_p": torch.tensor([[0.01, 0.02], [0.4, 0.3], [float("nan")] * 2, [float("nan")] * 2])}
    assert warn_collapse(stats, kinds, 0.005, step=250) == [0]
    assert "router collapse in layer(s) 0 (0.05% global" in capsys.readouterr().out
    # a layer whose heads all committed local decided it: no warning
    assert warn_collapse(stats, kinds, 0.005, step=250, decided=[0]) == []
    assert "router collapse" not in capsys.readouterr().out


def test_training_flops_count_parameters_and_attention_as_computed():
    config = GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, window=8)
    attention_dense = 6 * 2 * 32 * 64  # 4 d FLOPs per query-key pair, x3 with the backward, T / 2 keys, 2 layers
    assert routing_stats.training_flops_per_token(config, 1000, 1.0) == 6 * 1000 + attention_dense
    assert routing_stats.training_flops_per_token(config, 1000, 0.25) == 6 * 1000 + attention_dense / 4
    learned = GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, window=8, position_embedding="learned")
    assert routing_stats.training_flops_per_token(learned, 1000 + 64 * 32, 0.0) == 6 * 1000
    assert device.peak_flops("cpu", torch.bfloat16) is None


def test_lambda_controller_raises_lambda_above_the_target_and_lowers_it_below_zero():
    tcfg, _ = parse_args(["--router_target_global=0.2", "--router_lambda=0.01", "--router_target_rate=0.5"],
                         TrainConfig, GPTConfig)
    shared = LambdaController(tcfg, 3)
    torch.testing.assert_close(shared.weights(3), torch.full((3,), 0.01))  # starts at router_lambda
    shared.update(torch.tensor([0.9, 0.1, 0.2]))  # mean 0.4: twice the target, relative error 1
    torch.testing.assert_close(shared.weights(3), torch.full((3,), 0.01 * math.sinh(1.5) / math.sinh(1.0)))
    far_above = LambdaController(tcfg, 3)
    far_above.update(torch.tensor([0.9, 0.9, 0.9]))  # relative error 3.5, clipped to 1: u = 1 + 0.5 (not 2.75)
    assert far_above.u.tolist() == [pytest.approx(1.5)]
    far_below = LambdaController(tcfg, 3)
    far_below.update(torch.tensor([0.0, 0.0, 0.0]))  # relative error -1
    assert far_below.u.tolist() == [pytest.approx(0.5)]
    tcfg.router_target_per_layer = True
    per_layer = LambdaController(tcfg, 3)
    for _ in range(4):  # layer 0 above its target, 1 below it, 2 on it
        per_layer.update(torch.tensor([0.9, 0.0, 0.2]))
    assert per_layer.u.tolist() == pytest.approx([3.0, -1.0, 1.0])  # each layer by its own error, clipped
    lam = per_layer.weights(3)
    assert lam[0] > 0.01 and lam[1] < 0 and lam[2] == pytest.approx(0.01)  # below zero: a reward for global
    for _ in range(100):
        per_layer.update(torch.tensor([1.0, 0.0, 0.2]))
    torch.testing.assert_close(per_layer.weights(3)[:2], torch.tensor([1.0, -1.0]))  # +- router_lambda_max
    tcfg.router_lambda_max = 0.1
    capped = LambdaController(tcfg, 1)
    for _ in range(100):
        capped.update(torch.tensor([1.0]))
    torch.testing.assert_close(capped.weights(1), torch.tensor([0.1]))


def controlled_run(*args, iter_num=10):
    tcfg, mcfg = parse_args(["--router_target_global=0.5", "--router_lambda=0.01", "--router_target_rate=0.5",
                             *args], TrainConfig, GPTConfig)
    return SimpleNamespace(controller=LambdaController(tcfg, 1), tcfg=tcfg, mcfg=mcfg, iter_num=iter_num, ddp=False)


def test_the_controller_counts_the_routers_decisions_not_the_explored_ones():
    """router_explore's extra global decisions are training's only: the controller sees p >= threshold."""
    run = controlled_run("--router_explore=0.5")
    p = torch.tensor([[[0.9, 0.9, 0.1, 0.1]]])  # the routers' own decisions: half global, on the target
    explored = torch.ones_like(p)  # what the step ran: every decision global after exploration
    train.update_controller(run, SimpleNamespace(gates=[explored], probs=[p]), force_global=False)
    torch.testing.assert_close(run.controller.weights(1), torch.full((1,), 0.01))  # on target: unchanged
    train.update_controller(run, SimpleNamespace(gates=[explored], probs=[p * 0 + 0.9]), force_global=False)
    assert run.controller.weights(1)[0] > 0.01  # all global by its own choice: lambda rises


def test_under_a_head_budget_the_controller_counts_the_decisions_the_budget_left():
    """router_global_heads: an unchosen head is local whatever its p, so the controller counts the gates: here
    half global (on the target) although every p is above the threshold."""
    run = controlled_run("--router_global_heads=1", "--schedule=R")
    p = torch.full((1, 2, 4), 0.9)
    gates = torch.tensor([[[True] * 4, [False] * 4]])  # head 0 chosen (its tokens global), head 1 not
    train.update_controller(run, SimpleNamespace(gates=[gates], probs=[p]), force_global=False)
    torch.testing.assert_close(run.controller.weights(1), torch.full((1,), 0.01))  # on target: unchanged


@pytest.mark.parametrize("args, iter_num, force_global, moves", [
    ((), 10, False, True),
    ((), 10, True, False),                               # a forced-global step: not the routers' choice
    (("--router_lambda_start=11",), 10, False, False),   # before the penalty starts
    (("--router_lambda_start=10",), 10, False, True),
    (("--router_local_iters=11",), 10, False, False),    # routers held local: no penalty yet
])
def test_the_controller_moves_only_on_the_routers_own_steps_after_the_penalty_starts(args, iter_num, force_global,
                                                                                     moves):
    run = controlled_run(*args, iter_num=iter_num)
    all_global = torch.full((1, 1, 4), 0.9)
    train.update_controller(run, SimpleNamespace(gates=[all_global > 0.5], probs=[all_global, None]), force_global)
    assert run.controller.u.tolist() == [pytest.approx(1.5 if moves else 1.0)]


def test_a_float16_run_resumed_under_auto_keeps_its_gradient_scaler_and_its_controller(tmp_path, tiny_corpus,
                                                                                      capsys):
    """A checkpoint written by an fp16 run holds its GradScaler's state and the controller's u; resumed with
    dtype=auto (which never picks fp16) the run goes on in fp16 with a live scaler at the saved scale, and its
    next checkpoint holds them again. An fp32 run's checkpoint holds no scaler. (setup builds the run without a
    step; checkpoint_state is what save writes.)"""
    overrides = {"router_target_global": 0.2, "max_iters": 4}
    run = train.setup(*tiny_train_configs(tmp_path, tiny_corpus, dtype="float16", **overrides), False, 0, 1, "cpu")
    assert run.scaler.is_enabled()
    run.scaler.scale(torch.ones(()))
    run.scaler.update(1024.0)  # as if its steps had scaled the loss down
    run.controller.u = torch.tensor([1.25])
    run.iter_num = 2
    state = train.checkpoint_state(run)
    assert state["dtype"] == "float16" and state["scaler"]["scale"] == 1024.0
    checkpoint.save_checkpoint(run.ckpt_path, state)
    capsys.readouterr()

    resumed = train.setup(*tiny_train_configs(tmp_path, tiny_corpus, dtype="auto", init_from="resume", **overrides),
                          False, 0, 1, "cpu")
    assert "continues in float16, the precision it trained in" in capsys.readouterr().out
    assert resumed.dtype == torch.float16 and resumed.iter_num == 2
    assert resumed.scaler.is_enabled() and resumed.scaler.get_scale() == 1024.0
    assert resumed.controller.u.tolist() == [1.25]
    again = train.checkpoint_state(resumed)
    assert again["scaler"] is not None and again["scaler"]["scale"] == 1024.0 and again["dtype"] == "float16"
    assert again["router_lambda_state"].tolist() == [1.25]

    fp32 = train.setup(*tiny_train_configs(tmp_path / "fp32", tiny_corpus, **overrides), False, 0, 1, "cpu")
    assert not fp32.scaler.is_enabled() and train.checkpoint_state(fp32)["scaler"] is None


def test_a_run_ends_with_a_line_that_says_where_its_checkpoint_is_its_best_val_loss_and_its_time(tmp_path):
    tcfg, _ = parse_args([f"--out_dir={tmp_path}"], TrainConfig, GPTConfig)
    run = SimpleNamespace(tcfg=tcfg, val_batches=[(torch.zeros(4, 8), None)] * 3, best_val=1.83251, iter_num=750,
                          val_history=[[0, 5.5], [250, 1.83251], [500, 1.9]], ckpt_path=str(tmp_path / "ckpt.pt"),
                          best_path=str(tmp_path / "ckpt_best.pt"), wall_before=0.0, started=time.time() - 300)
    assert train.closing_line(run, 300.0) == (
        f"done: 750 steps in 5.0 min; best val loss 1.8325 (step 250; training's evaluation on its 12 val windows); "
        f"checkpoint {tmp_path / 'ckpt.pt'}, best {tmp_path / 'ckpt_best.pt'}")
    run.wall_before = 600.0  # resumed from a checkpoint of 10 minutes' training
    assert "750 steps in 5.0 min (15.0 min with the steps it resumed); best" in train.closing_line(run, 300.0)
    run.tcfg.save_checkpoint, run.best_val, run.started = False, math.inf, time.time() - 42
    assert train.closing_line(run, 42.0).endswith("in 42 s (10.7 min with the steps it resumed); no finite val "
                                                   "loss; no checkpoint written (save_checkpoint=False)")


def test_per_head_routers_flips_are_counted_step_by_step():
    """A per-head router decides from its bias: each step's decisions against the step before's, per head."""
    from model import GPT
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8, window=2, schedule="R",
                          router_per_token=False))
    run = SimpleNamespace(raw_model=model, mcfg=model.config, head_decisions=None, head_flips=None, flip_steps=0)
    bias = model.blocks[0].attn.router.bias
    for values in ([0.1, -0.1], [-0.1, -0.1], [0.1, -0.1], [0.2, -0.2]):  # head 0 flips twice in three steps
        with torch.no_grad():
            bias.copy_(torch.tensor(values))
        train.count_head_flips(run)
    assert run.flip_steps == 3 and run.head_flips.tolist() == [[2.0, 0.0]]


def committer_model(n_layer=2, **cfg):
    from model import GPT
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=n_layer, n_head=2, n_embd=8, window=2, schedule="R",
                         **cfg))


def test_a_head_commits_after_k_steps_in_a_row_all_local_or_all_global_from_the_penalty_at_full_weight():
    """router_commit_after=3: streaks count from commit_start (penalty start + ramp); a step in between (a mixed
    share, above the tolerance) resets a head's streak; the commit is the router's (its paths)."""
    model = committer_model()
    tcfg = TrainConfig(router_commit_after=3, router_commit_tol=0.05, router_lambda_start=2, router_lambda_ramp=3)
    assert commit_start(tcfg) == 5
    committer = HeadCommitter(tcfg, model.routers())
    shares = torch.tensor([[0.0, 1.0], [0.5, 0.97]])  # layer 0: head 0 all local, head 1 all global; layer 1 mixed
    assert committer.update(4, shares) == [] and committer.streak.abs().sum() == 0  # before commit_start
    assert committer.update(5, shares) == [] and committer.update(6, shares) == []
    assert committer.streak.tolist() == [[-2, 2], [0, 2]]
    assert committer.update(7, torch.tensor([[0.0, 1.0], [0.5, 0.5]])) == [(0, 0, 0), (0, 1, 1)]
    assert committer.streak.tolist() == [[-3, 3], [0, 0]]
    assert [r.paths for r in model.routers()] == [(0, 1), (-1, -1)]
    for it in range(8, 11):  # a committed head does not commit again
        made = committer.update(it, torch.tensor([[1.0, 0.0], [0.01, 0.5]]))
    assert made == [(1, 0, 0)] and [r.paths for r in model.routers()] == [(0, 1), (0, -1)]


def test_no_more_heads_commit_global_than_the_budget_leaves_room_for():
    """router_target_global=0.25 of 4 heads: one head may commit global; a second, all global as long, waits."""
    model = committer_model()
    committer = HeadCommitter(TrainConfig(router_commit_after=2, router_target_global=0.25, router_lambda_ramp=0),
                              model.routers())
    for it in range(2):
        made = committer.update(it, torch.tensor([[1.0, 1.0], [0.0, 0.4]]))
    assert made == [(0, 0, 1), (1, 0, 0)]
    assert [r.paths for r in model.routers()] == [(1, -1), (0, -1)]
    committer.update(2, torch.tensor([[1.0, 1.0], [0.0, 0.4]]))
    assert model.routers()[0].paths == (1, -1) and committer.streak[0, 1] == 3


def test_at_the_deadline_every_undecided_head_commits_to_the_path_it_took_most_of_late():
    """router_commit_by_iter=6 with a budget of one head: two heads swap the budget's place (head 0 on 3 steps in
    4, head 1 on the other), so neither holds it router_commit_after=4 steps in a row; the two heads always local
    commit local on their own; at step 6 head 0, the more global of late, commits global and head 1 local."""
    model = committer_model(router_per_token=False, router_global_heads=1)
    tcfg = TrainConfig(router_commit_after=4, router_commit_by_iter=6, router_lambda_ramp=0)
    committer = HeadCommitter(tcfg, model.routers(), global_heads=1)
    made = []
    for it in range(6):
        first = it % 4 != 3
        made += committer.update(it, torch.tensor([[float(first), float(not first)], [0.0, 0.0]]))
    assert made == [(1, 0, 0), (1, 1, 0)]  # the always-local heads, at step 3
    assert committer.recent[0, 0] > committer.recent[0, 1]
    assert committer.update(6, torch.tensor([[0.0, 1.0], [0.0, 0.0]])) == [(0, 0, 1), (0, 1, 0)]  # the last step
    assert [r.paths for r in model.routers()] == [(1, 0), (0, 0)]  # does not outweigh the recent past
    # without a budget, each head commits to the path of most of its recent steps
    model = committer_model(router_per_token=False)
    committer = HeadCommitter(TrainConfig(router_commit_after=4, router_commit_by_iter=3, router_lambda_ramp=0),
                              model.routers())
    for it in range(4):
        made = committer.update(it, torch.tensor([[1.0, 0.0], [float(it % 2), float(it > 0)]]))
    # layer 1: head 0 global on 2 of the 4 steps (recent share 0.39 from a start at zero), head 1 on 3 (0.58)
    assert [r.paths for r in model.routers()] == [(1, 0), (0, 1)]


def test_release_puts_the_heads_committed_global_back_to_routing_and_ends_the_deadline():
    """router_release_global: the per-head phase's decisions count from the ramp (not from the tokens' phase);
    at the deadline the budget's two places go to the most global heads; release (router_token_from_iter) makes
    them route again with their streaks from zero, the heads committed local stay local, and the deadline, past,
    does not commit the released heads again."""
    model = committer_model(router_global_heads=2)
    tcfg = TrainConfig(router_commit_after=2, router_commit_by_iter=4, router_lambda_ramp=1, router_lambda_start=6,
                       router_token_from_iter=6, router_release_global=True)
    assert commit_start(tcfg) == 1
    committer = HeadCommitter(tcfg, model.routers(), global_heads=2)
    made = []
    for it in range(5):  # layer 0 head 0 and layer 1 head 1 swap one place, layer 0 head 1 holds the other
        swap = float(it % 2)
        made += committer.update(it, torch.tensor([[1.0 - swap, 1.0], [0.0, swap]]))
    assert [r.paths for r in model.routers()] == [(1, 1), (0, 0)]
    assert made[-2:] == [(0, 0, 1), (1, 1, 0)]  # the deadline, step 4: head 0 was global on more recent steps
    assert committer.release() == [(0, 0), (0, 1)]
    assert [r.paths for r in model.routers()] == [(-1, -1), (0, 0)] and committer.streak[0].tolist() == [0, 0]
    assert committer.update(6, torch.tensor([[0.5, 1.0], [0.0, 0.0]])) == []  # routing its tokens: no deadline
    assert committer.update(7, torch.tensor([[0.5, 1.0], [0.0, 0.0]])) == [(0, 1, 1)]  # all global 2 steps


def test_commit_settings_are_checked():
    with pytest.raises(ValueError, match="router_commit_tol"):
        TrainConfig(router_commit_tol=1.5)
    with pytest.raises(ValueError, match="router_commit_after"):
        TrainConfig(router_commit_after=-1)
    from nanoaha.train_config import check_config
    with pytest.raises(ValueError, match="router_commit_after commits learned routers"):
        check_config(TrainConfig(router_commit_after=10), GPTConfig(schedule="L"))
    with pytest.raises(ValueError, match="router_commit_by_iter commits per-head routers"):
        check_config(TrainConfig(router_commit_by_iter=100), GPTConfig(schedule="R", router_per_token=False))
    with pytest.raises(ValueError, match="router_commit_by_iter commits per-head routers"):
        check_config(TrainConfig(router_commit_after=10, router_commit_by_iter=100), GPTConfig(schedule="R"))
    with pytest.raises(ValueError, match="set it to at least 510"):  # the ramp's 500 steps, then 10 counted
        check_config(TrainConfig(router_commit_after=10, router_commit_by_iter=100, router_lambda_ramp=500),
                     GPTConfig(schedule="R", router_per_token=False))
    check_config(TrainConfig(router_commit_after=10, router_commit_by_iter=510, router_lambda_ramp=500),
                 GPTConfig(schedule="R", router_per_token=False))
    with pytest.raises(ValueError, match="router_release_global releases"):
        check_config(TrainConfig(router_commit_after=10, router_release_global=True, router_token_from_iter=100),
                     GPTConfig(schedule="R"))  # no head budget
    budget = GPTConfig(schedule="R", router_global_heads=1)
    released = {"router_commit_after": 10, "router_release_global": True, "router_token_from_iter": 1000,
                "router_lambda_ramp": 500}
    with pytest.raises(ValueError, match="a deadline of the per-head phase: set it to at most"):
        check_config(TrainConfig(router_commit_by_iter=1500, **released), budget)
    check_config(TrainConfig(router_commit_by_iter=1000, **released), budget)


def test_flips_count_the_decisions_the_model_takes_committed_and_chosen():
    """count_head_flips reads Router.head_decisions: a committed head does not flip whatever its bias does, and
    with the head budget a head flips when it leaves the top k, not when it crosses the threshold."""
    model = committer_model(n_layer=1, router_per_token=False, router_global_heads=1)
    run = SimpleNamespace(raw_model=model, mcfg=model.config, head_decisions=None, head_flips=None, flip_steps=0)
    bias = model.blocks[0].attn.router.bias
    for values in ([0.3, 0.1], [0.2, 0.1], [0.1, 0.2], [-0.1, -0.2]):  # the top head changes twice
        with torch.no_grad():
            bias.copy_(torch.tensor(values))
        train.count_head_flips(run)
    assert run.head_flips.tolist() == [[2.0, 2.0]]
    model.blocks[0].attn.router.commit(1, 0)
    run.head_flips = None
    for values in ([0.1, 0.3], [0.3, 0.1]):  # head 1 committed local: head 0 is the budget's head throughout
        with torch.no_grad():
            bias.copy_(torch.tensor(values))
        train.count_head_flips(run)
    assert run.head_flips.tolist() == [[0.0, 0.0]]


def test_no_more_heads_commit_local_than_leaves_the_budget_reachable():
    """router_target_global=0.25 of 4 heads buys one: three heads all local commit, the fourth (as long all
    local) stays undecided, the one that can still meet the budget."""
    model = committer_model()
    committer = HeadCommitter(TrainConfig(router_commit_after=2, router_target_global=0.25, router_lambda_ramp=0),
                              model.routers())
    for it in range(3):
        made = committer.update(it, torch.zeros(2, 2))
    assert [r.paths for r in model.routers()] == [(0, 0), (0, -1)] and made == []
    for it in range(3, 5):
        made = committer.update(it, torch.tensor([[0.0, 0.0], [0.0, 1.0]]))
    assert made == [(1, 1, 1)]


def test_with_a_budget_of_heads_its_heads_commit_and_the_rest_commit_local():
    """router_global_heads=1 (no lambda target): the head the budget keeps global commits global, the others
    local, and no second head commits global; the last undecided head that could still carry the budget stays."""
    model = committer_model(router_per_token=False, router_global_heads=1)
    committer = HeadCommitter(TrainConfig(router_commit_after=2, router_lambda_ramp=0), model.routers(),
                              global_heads=1)
    for it in range(2):
        made = committer.update(it, torch.tensor([[1.0, 0.0], [1.0, 0.0]]))  # two heads all global (cannot both)
    assert made == [(0, 0, 1), (0, 1, 0), (1, 1, 0)]
    assert [r.paths for r in model.routers()] == [(1, 0), (-1, 0)]
    model.routers()[1].committed.fill_(-1)
    model.routers()[1]._read_paths()
    model.routers()[0].committed.fill_(-1)
    model.routers()[0]._read_paths()
    committer = HeadCommitter(TrainConfig(router_commit_after=2, router_lambda_ramp=0), model.routers(),
                              global_heads=1)
    for it in range(2):
        made = committer.update(it, torch.zeros(2, 2))
    assert sum(path == -1 for r in model.routers() for path in r.paths) == 1
