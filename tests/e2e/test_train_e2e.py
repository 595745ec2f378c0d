import json
import math
import re

import pytest
import torch

import train
from data.loader import TokenData
from helpers import CPU_FP32, flags, run_script, tiny_train_configs
from model import GPT
from nanoaha import checkpoint
from nanoaha.training import lr_at


def test_short_training_lowers_the_loss_at_the_scheduled_learning_rate(tmp_path, tiny_corpus, capsys, monkeypatch):
    stepped_at = []  # the learning rate of every optimizer step, in every parameter group
    step = torch.optim.AdamW.step

    def recording_step(self, *args, **kwargs):
        stepped_at.append([group["lr"] for group in self.param_groups])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    tcfg, mcfg = tiny_train_configs(tmp_path, tiny_corpus, p_dense=0.2, log_interval=1)
    result = train.train(tcfg, mcfg)
    losses = result["losses"]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert result["val_loss"] < losses[0]
    assert stepped_at == [pytest.approx([lr_at(it, tcfg)] * 2) for it in range(tcfg.max_iters)]
    out = capsys.readouterr().out
    logged = re.findall(r"^iter (\d+): .* lr ([0-9.e+-]+) \|", out, re.M)
    assert len(logged) == tcfg.max_iters
    for it, lr in logged:  # the log shows the rate of the step it reports, to 3 digits
        assert float(lr) == pytest.approx(lr_at(int(it) - 1, tcfg), rel=5e-3)
    best = min(loss for _, loss in json.load(open(tmp_path / "out" / "train_summary.json"))["val_history"])
    assert out.splitlines()[-1].startswith(f"done: 40 steps in ") and f"best val loss {best:.4f} (step " in out
    assert out.splitlines()[-1].endswith(f"; checkpoint {tmp_path / 'out' / 'ckpt.pt'}, best "
                                         f"{tmp_path / 'out' / 'ckpt_best.pt'}")


@pytest.mark.parametrize("p_dense", [0.0, 0.5, 1.0])
def test_forced_global_steps_happen_at_rate_p_dense(tmp_path, tiny_corpus, capsys, p_dense):
    train.train(*tiny_train_configs(tmp_path, tiny_corpus, max_iters=30, log_interval=1, eval_interval=100, p_dense=p_dense))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("iter ")]
    forced = sum("[forced global]" in line for line in lines)
    assert len(lines) == 30
    if p_dense in (0.0, 1.0):
        assert forced == 30 * p_dense
    else:
        assert 5 <= forced <= 25


def test_training_passes_lambda_and_budget_to_the_loss(tmp_path, tiny_corpus, monkeypatch):
    calls = []
    penalty = train.router_penalty

    def recording_penalty(output, weight, budget=0.0):
        calls.append((float(weight), budget))
        return penalty(output, weight, budget)

    monkeypatch.setattr(train, "router_penalty", recording_penalty)
    train.train(*tiny_train_configs(tmp_path, tiny_corpus, max_iters=4, router_lambda=0.5, router_lambda_ramp=2,
                         router_budget=0.25, eval_interval=100))
    assert calls == [(0.25, 0.25), (0.5, 0.25), (0.5, 0.25), (0.5, 0.25)]


def test_budget_targeted_training_adapts_lambda_and_writes_the_summary(tmp_path, tiny_corpus, capsys):
    """Routers start all global (bias 3): lambda grows, up to router_lambda_max, while the layers stay above
    the target; the summary file says so."""
    result = train.train(*tiny_train_configs(tmp_path, tiny_corpus, max_iters=60, router_target_global=0.25, router_lambda=0.01,
                                  router_target_rate=0.2, router_lambda_ramp=0, router_init_bias=3.0,
                                  router_target_per_layer=True, router_lambda_max=0.5))
    with open(tmp_path / "out" / "train_summary.json") as f:
        summary = json.load(f)
    assert summary["complete"] and summary["iter_num"] == 60 and summary["max_iters"] == 60
    assert [it for it, _ in summary["val_history"]] == [0, 20, 40, 60]
    assert summary["val_loss"] == pytest.approx(result["val_loss"]) and summary["tokens_per_s"] > 0
    assert summary["router_lambdas"] == [pytest.approx(0.5, rel=1e-5)] * 2  # pushed up from 0.01, capped
    assert len(summary["global_frac_per_layer"]) == 2
    # 32-token windows of ~28-byte lines hold no 8-byte copy from beyond the window: no key tokens
    assert summary["key_tokens"] == {"k": 8, "window": 8, "n_sink": 0} and summary["key_frac"] == 0
    assert summary["key_loss"] is None and summary["other_loss"] == pytest.approx(summary["val_loss"])
    # every evaluation's key and other losses: no key tokens, so other = val at each step
    assert [[it, key] for it, key, _ in summary["key_history"]] == [[0, None], [20, None], [40, None], [60, None]]
    assert [other for _, _, other in summary["key_history"]] == pytest.approx([v for _, v in summary["val_history"]])


def test_sparse_from_iter_trains_exact_first_then_sparse(tmp_path, tiny_corpus, monkeypatch):
    modes = []
    forward = GPT.forward

    def recording_forward(self, idx, targets=None, *args, **kwargs):
        out = forward(self, idx, targets, *args, **kwargs)
        if self.training:
            modes.append(out.routed_mode)
        return out

    monkeypatch.setattr(GPT, "forward", recording_forward)
    train.train(*tiny_train_configs(tmp_path, tiny_corpus, max_iters=6, routed_mode="sparse", sparse_from_iter=4,
                         eval_interval=100))
    assert modes == ["exact"] * 4 + ["sparse"] * 2
    assert checkpoint.load_checkpoint(str(tmp_path / "out"), "cpu")["model_config"]["routed_mode"] == "sparse"
    with pytest.raises(ValueError, match="set routed_mode='sparse'"):
        train.train(*tiny_train_configs(tmp_path, tiny_corpus, max_iters=2, sparse_from_iter=1))
    with pytest.raises(ValueError, match="needs learned routers"):
        train.train(*tiny_train_configs(tmp_path, tiny_corpus, max_iters=2, schedule="G", router_target_global=0.1))


def test_router_lr_mult_scales_the_routers_learning_rate_only(tmp_path, tiny_corpus, monkeypatch):
    """The routers' parameters (router_sees_local's u included) step at router_lr_mult times the scheduled rate,
    the rest at the rate; resume continues with the same groups and the same losses."""
    stepped_at = []
    step = torch.optim.AdamW.step

    def recording_step(self, *args, **kwargs):
        stepped_at.append([(group["lr"], len(group["params"])) for group in self.param_groups])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    common = {"router_lr_mult": 10.0, "router_sees_local": True, "eval_interval": 100, "lr_decay_iters": 8}
    tcfg, mcfg = tiny_train_configs(tmp_path / "a", tiny_corpus, max_iters=8, **common)
    routers = [p for name, p in GPT(mcfg).named_parameters() if ".router." in name]
    n_matrices = sum(p.dim() >= 2 for p in routers)
    assert n_matrices == 4  # per routed layer: W and u (the biases go to the no-decay group)
    straight = train.train(tcfg, mcfg)["losses"]
    assert len(stepped_at) == 8
    for it, groups in enumerate(stepped_at):
        lr = lr_at(it, tcfg)
        assert [g[0] for g in groups] == pytest.approx([lr, lr, 10 * lr, 10 * lr])
        assert [g[1] for g in groups[2:]] == [n_matrices, len(routers) - n_matrices]
    train.train(*tiny_train_configs(tmp_path / "b", tiny_corpus, max_iters=4, **common))
    resumed = train.train(*tiny_train_configs(tmp_path / "b", tiny_corpus, max_iters=8, init_from="resume",
                                              **common))["losses"]
    assert resumed == straight[4:]


def test_resume_continues_with_identical_losses(tmp_path, tiny_corpus):
    common = {"lr_decay_iters": 12, "eval_interval": 100, "p_dense": 0.3, "routing": "random", "dropout": 0.1}
    straight = train.train(*tiny_train_configs(tmp_path / "a", tiny_corpus, max_iters=12, **common))["losses"]
    train.train(*tiny_train_configs(tmp_path / "b", tiny_corpus, max_iters=6, **common))
    resumed = train.train(*tiny_train_configs(tmp_path / "b", tiny_corpus, max_iters=12, init_from="resume", **common))["losses"]
    assert resumed == straight[6:]


def test_resume_refuses_another_model_shape(tmp_path, tiny_corpus):
    train.train(*tiny_train_configs(tmp_path, tiny_corpus, max_iters=2))
    with pytest.raises(ValueError, match="model config differs"):
        train.train(*tiny_train_configs(tmp_path, tiny_corpus, max_iters=4, init_from="resume", n_embd=64))


def test_finetune_dense_checkpoint_into_routed_model(tmp_path, tiny_corpus):
    train.train(*tiny_train_configs(tmp_path / "dense", tiny_corpus, max_iters=2, schedule="G"))
    result = train.train(*tiny_train_configs(tmp_path / "routed", tiny_corpus, max_iters=0, schedule="R",
                                  init_from=str(tmp_path / "dense" / "out")))
    assert result["routing"]["routed_global_frac"].item() == 1.0  # zero-initialised routers start all-global
    with pytest.raises(ValueError, match="another model shape"):
        train.train(*tiny_train_configs(tmp_path / "wide", tiny_corpus, max_iters=2, n_embd=64,
                             init_from=str(tmp_path / "dense" / "out")))


def test_router_only_finetune_leaves_the_rest_frozen(tmp_path, tiny_corpus):
    train.train(*tiny_train_configs(tmp_path / "dense", tiny_corpus, max_iters=2, schedule="G"))
    dense = torch.load(tmp_path / "dense" / "out" / "ckpt.pt", weights_only=False)["model"]
    train.train(*tiny_train_configs(tmp_path / "ft", tiny_corpus, max_iters=5, schedule="R", trainable="router",
                         router_lambda_ramp=0, init_from=str(tmp_path / "dense" / "out")))
    tuned = torch.load(tmp_path / "ft" / "out" / "ckpt.pt", weights_only=False)["model"]
    routers = [name for name in tuned if ".router." in name]
    assert routers and all(torch.equal(tuned[name], dense[name]) for name in dense)
    assert any(not torch.equal(tuned[name], torch.zeros_like(tuned[name])) for name in routers)
    with pytest.raises(ValueError, match="needs learned routers"):
        train.train(*tiny_train_configs(tmp_path / "g", tiny_corpus, max_iters=1, schedule="G", trainable="router"))


def test_train_and_sample_command_lines(tmp_path, tiny_corpus):
    out = tmp_path / "out"
    trained = run_script("train.py", "configs/quickstart.py", f"--data_dir={tiny_corpus}", f"--out_dir={out}",
                  "--max_iters=3", "--eval_iters=1", "--block_size=32", "--window=8", "--n_layer=1",
                  "--log_interval=1", *flags(CPU_FP32))
    assert trained.returncode == 0, trained.stderr
    assert "iter 3: loss" in trained.stdout and "tok/s" in trained.stdout
    sampled = run_script("sample.py", f"--out_dir={out}", "--start=def ", "--max_new_tokens=10", "--show_routing",
                  "--device=cpu")
    assert sampled.returncode == 0, sampled.stderr
    assert "heads that went global" in sampled.stdout and "\x1b[48;5;" in sampled.stdout
    assert re.search(r"\[prefill 4 tokens, [0-9,]+ tok/s \| decode 9 tokens, [0-9,]+ tok/s \| KV cache [0-9.]+ \w*B\]",
                     sampled.stdout)
    bad = run_script("train.py", "configs/quickstart.py", "--max_iter=3")
    assert bad.returncode != 0 and "did you mean max_iters" in bad.stderr


def test_compile_trains_like_eager_on_the_cpu(tmp_path, tiny_corpus):
    common = {"max_iters": 3, "eval_interval": 100, "n_layer": 1, "schedule": "G", "attention_backend": "torch"}
    eager = train.train(*tiny_train_configs(tmp_path / "eager", tiny_corpus, **common))
    compiled = train.train(*tiny_train_configs(tmp_path / "compiled", tiny_corpus, compile=True, **common))
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-4)
    assert compiled["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-4)


def test_the_repeat_probe_runs_at_every_evaluation_without_moving_training(tmp_path, tiny_corpus, capsys):
    """Random routing draws from the RNG: the probe (forked RNG) must leave every training loss unchanged."""
    common = {"routing": "random", "random_global_q": 0.3, "schedule": "LR"}
    probed = train.train(*tiny_train_configs(tmp_path / "probed", tiny_corpus, **common))
    printed = capsys.readouterr().out
    with open(tmp_path / "probed" / "out" / "train_summary.json") as f:
        summary = json.load(f)
    history = summary["copy_history"]
    assert [step for step, *_ in history] == [0, 20, 40]  # every evaluation
    assert all(math.isfinite(gain) and len(induction) == 2 for _, gain, induction, _ in history)
    assert history[0][2][0] == 0.0  # layer 0 is local: nothing beyond its window (span 16 > window 8)
    heads = history[-1][3]  # per layer and head: previous-token, induction, global share
    assert set(heads) == {"previous", "induction", "global"} and all(len(layer) == 2 for layer in heads["previous"])
    assert heads["global"][0] == [0.0, 0.0] and heads["induction"][0] == [0.0, 0.0]  # the local layer
    assert max(heads["induction"][1]) == history[-1][2][1] and 0.0 < heads["global"][1][0] < 1.0
    assert f"step 40: val loss {summary['val_loss']:.4f}" in printed and f"copy gain {history[-1][1]:+.3f}" in printed
    unprobed = train.train(*tiny_train_configs(tmp_path / "unprobed", tiny_corpus, probe_spans=0, **common))
    assert unprobed["losses"] == probed["losses"] and unprobed["val_loss"] == probed["val_loss"]
    with open(tmp_path / "unprobed" / "out" / "train_summary.json") as f:
        assert json.load(f)["copy_history"] == []


@pytest.fixture
def drawn(monkeypatch):
    """The window starts every TokenData.train_starts call of the test draws, in order."""
    calls = []
    starts = TokenData.train_starts
    monkeypatch.setattr(TokenData, "train_starts", lambda self, n, generator: calls.append(starts(self, n, generator))
                        or calls[-1])
    return calls


def test_fine_tuning_trains_on_the_batches_after_its_checkpoints_not_on_them_again(tmp_path, tiny_corpus, drawn):
    """Re-seeded from `seed`, a run fine-tuned from a checkpoint drew the batches its start had trained on: the
    routed half of a fine-tuning row replayed its dense half. It continues the stream: its batches are those a
    run from scratch draws after the same number of steps."""

    def run(name, steps, **overrides):
        drawn.clear()
        train.train(*tiny_train_configs(tmp_path / name, tiny_corpus, max_iters=steps, eval_interval=steps,
                                        schedule="G", **overrides))
        return list(drawn)

    whole = run("whole", 8)
    first = run("first", 4)
    assert first == whole[:4]
    tuned = run("tuned", 4, init_from=str(tmp_path / "first" / "out" / "ckpt.pt"))
    assert tuned == whole[4:] and tuned != first


def test_data_order_trains_the_same_init_on_other_batches(tmp_path, tiny_corpus, drawn):
    """data_order=0 is the seed's own order; data_order=1 draws other batches (another at another seed) from the
    same init: the step-0 val loss, on fixed val windows, is the same, the losses after it are not."""

    def run(name, **overrides):
        drawn.clear()
        losses = train.train(*tiny_train_configs(tmp_path / name, tiny_corpus, max_iters=3, eval_interval=3,
                                                 **overrides))["losses"]
        with open(tmp_path / name / "out" / "train_summary.json") as f:
            return list(drawn), losses, json.load(f)["val_history"]

    own, own_losses, own_val = run("own")
    assert run("order_0", data_order=0)[0] == own
    other, other_losses, other_val = run("order_1", data_order=1)
    assert other != own and other_val[0] == own_val[0] and other_losses != own_losses
    assert run("seed_2_order_1", data_order=1, seed=2)[0] not in (own, other)
    with pytest.raises(ValueError, match="data_order=-1 must be at least 0"):
        tiny_train_configs(tmp_path / "bad", tiny_corpus, data_order=-1)


def test_router_token_from_iter_decides_per_head_first_then_per_token(tmp_path, tiny_corpus):
    """Before router_token_from_iter the token weights stay at zero (one decision per head, from the bias, which
    learns); from it they learn."""
    def router_weights(steps, start):
        out = tmp_path / f"{steps}_{start}"
        train.train(*tiny_train_configs(out, tiny_corpus, max_iters=steps, eval_interval=steps, schedule="R",
                                        router_token_from_iter=start))
        state = checkpoint.load_checkpoint(str(out / "out"), "cpu")["model"]
        return [(state[f"blocks.{i}.attn.router.logits.weight"], state[f"blocks.{i}.attn.router.logits.bias"])
                for i in range(2)]
    held = router_weights(4, 4)
    assert all(w.abs().max() == 0 for w, _ in held) and any(b.abs().max() > 0 for _, b in held)
    released = router_weights(4, 2)
    assert any(w.abs().max() > 0 for w, _ in released)
    with pytest.raises(ValueError, match="router_token_from_iter holds per-token routers' weights at zero"):
        train.train(*tiny_train_configs(tmp_path / "bad", tiny_corpus, router_token_from_iter=2,
                                        router_per_token=False))


def test_a_budget_of_heads_with_per_token_routers_trains_its_heads_per_token_and_commits_the_others_local(
        tmp_path, tiny_corpus, capsys):
    """router_global_heads=1 with per-token routers (router_init_std > 0: p differs between tokens): every head
    outside the budget is local on every step, so with router_commit_after=4 the three of them commit local
    (no more: one head must stay reachable); the budget's head keeps routing its tokens, some global. The layer
    the budget gives no head is local by design: no collapse warning."""
    train.train(*tiny_train_configs(tmp_path, tiny_corpus, max_iters=12, lr_decay_iters=12, eval_interval=100,
                                    router_global_heads=1, router_init_std=0.5, router_lambda=0.0,
                                    router_lambda_ramp=0, router_commit_after=4))
    summary = json.load(open(tmp_path / "out" / "train_summary.json"))
    assert len(summary["commit_history"]) == 3 and {path for *_, path in summary["commit_history"]} == {0}
    model, _ = checkpoint.load_model(tmp_path / "out" / "ckpt.pt", "cpu")
    assert sum(path == -1 for block in model.blocks for path in block.attn.router.paths) == 1
    assert 0 < summary["routed_global_frac"] < 0.25  # one head of four, some of its tokens
    assert "router collapse" not in capsys.readouterr().out


def test_heads_commit_in_training_and_a_resume_keeps_their_streaks_exactly(tmp_path, tiny_corpus, capsys):
    """router_commit_after=8 with a penalty that sends every per-head router local after step 0 (at init every
    head is global): the heads commit at step 8 (8 steps all local), after a resume at step 6 as in a straight run: same losses, same commits,
    the checkpoint's model holds them and evaluation runs them. The attention training computed, a mean over
    its logged steps, counts the steps before the commits (both paths) and after (the window alone), over the
    resume too."""
    common = {"lr_decay_iters": 12, "eval_interval": 100, "router_per_token": False, "router_lambda": 1.0,
              "router_lambda_ramp": 0, "router_commit_after": 8, "log_interval": 1}
    straight = train.train(*tiny_train_configs(tmp_path / "a", tiny_corpus, max_iters=12, **common))
    summary = json.load(open(tmp_path / "a" / "out" / "train_summary.json"))
    assert summary["commit_history"] == [[8, layer, head, 0] for layer in range(2) for head in range(2)]
    assert summary["routed_global_frac"] == 0.0
    out = capsys.readouterr().out
    assert "router collapse" not in out  # layers whose heads all committed local decided it
    in_training = summary["attention_flop_frac_training"]
    assert in_training["logged_steps"] == 12
    # the steps before the commits computed local and full attention (more than dense), those after the window alone
    logged = [float(m) / 100 for m in re.findall(r"^iter \d+: .* computed (\d+)%", out, re.M)]
    assert len(logged) == 12 and logged[0] > 1.0 and logged[-1] == pytest.approx(summary["model_computed_flop_frac"], abs=0.006)
    assert in_training["computed"] == pytest.approx(sum(logged) / 12, abs=0.005)
    assert summary["model_computed_flop_frac"] < in_training["computed"] < logged[0]
    train.train(*tiny_train_configs(tmp_path / "b", tiny_corpus, max_iters=6, **common))
    resumed = train.train(*tiny_train_configs(tmp_path / "b", tiny_corpus, max_iters=12, init_from="resume",
                                              **common))
    assert resumed["losses"] == straight["losses"][6:]
    resumed_summary = json.load(open(tmp_path / "b" / "out" / "train_summary.json"))
    assert resumed_summary["commit_history"] == summary["commit_history"]
    assert resumed_summary["attention_flop_frac_training"] == pytest.approx(in_training)
    model, _ = checkpoint.load_model(tmp_path / "b" / "out" / "ckpt.pt", "cpu")
    assert [block.attn.router.paths for block in model.blocks] == [(0, 0), (0, 0)]


def test_each_evaluation_records_the_mean_bias_gradient_of_each_head_since_the_last(tmp_path, tiny_corpus):
    """decision_history's bias gradients: none at the first evaluation (no step yet); at the next, each learned
    router head's bias gradient of the step between. Two runs alike but for the penalty's weight differ by its
    gradient alone, lambda / (layers x heads) * p (1 - p) per head (the penalty is a mean over layers of each
    layer's mean p, a per-head router's p the same on every token); and a committed head's gradient is zero."""
    def entries(lam, **overrides):
        out = tmp_path / f"{lam}_{len(overrides)}"
        train.train(*tiny_train_configs(out, tiny_corpus, max_iters=1, eval_interval=1, router_per_token=False,
                                        router_lambda=lam, router_lambda_ramp=0, router_init_bias=0.5,
                                        **overrides))
        return json.load(open(out / "out" / "train_summary.json"))["decision_history"]
    free, penalised = entries(0.0), entries(1.0)
    assert free[0][5] is None and len(free) == 2
    p = torch.sigmoid(torch.tensor(0.5)).item()
    for layer_free, layer_penalised in zip(free[1][5], penalised[1][5]):
        assert len(layer_free) == 2 and any(g != 0 for g in layer_free)  # the LM loss pulls on every head
        for g_free, g_penalised in zip(layer_free, layer_penalised):
            assert g_penalised - g_free == pytest.approx(p * (1 - p) / 4, rel=1e-4)
    train.train(*tiny_train_configs(tmp_path / "c", tiny_corpus, max_iters=4, eval_interval=2,
                                    router_per_token=False, router_lambda=1.0, router_lambda_ramp=0,
                                    router_commit_after=1))
    history = json.load(open(tmp_path / "c" / "out" / "train_summary.json"))["decision_history"]
    assert history[-1][0] == 4 and all(g == 0 for layer in history[-1][5] for g in layer)  # committed local


def test_by_the_deadline_every_head_commits_within_the_budget_and_a_resume_keeps_the_recent_shares(
        tmp_path, tiny_corpus):
    """router_commit_by_iter=8 with a budget of one head (router_commit_after=8: a head stable from step 0
    commits at step 7 on its own): by step 8 every head has committed, one global; a run resumed at step 6 (the
    recent shares from its checkpoint) commits the same heads and trains the same losses."""
    common = {"lr_decay_iters": 12, "eval_interval": 100, "router_per_token": False, "router_global_heads": 1,
              "router_lambda": 0.0, "router_lambda_ramp": 0, "router_commit_after": 8, "router_commit_by_iter": 8}
    straight = train.train(*tiny_train_configs(tmp_path / "a", tiny_corpus, max_iters=12, **common))
    history = json.load(open(tmp_path / "a" / "out" / "train_summary.json"))["commit_history"]
    assert max(step for step, *_ in history) <= 8 and len(history) == 4 and sum(p for *_, p in history) == 1
    train.train(*tiny_train_configs(tmp_path / "b", tiny_corpus, max_iters=6, **common))
    resumed = train.train(*tiny_train_configs(tmp_path / "b", tiny_corpus, max_iters=12, init_from="resume",
                                              **common))
    assert resumed["losses"] == straight["losses"][6:]
    assert json.load(open(tmp_path / "b" / "out" / "train_summary.json"))["commit_history"] == history
    recent = [checkpoint.load_checkpoint(str(tmp_path / run / "out"), "cpu")["commit_recent"] for run in "ab"]
    assert recent[0].shape == (2, 2) and recent[0].sum() > 0
    torch.testing.assert_close(recent[1], recent[0])


def test_heads_committed_global_in_the_per_head_phase_route_their_tokens_after_it_and_a_resume_keeps_it(
        tmp_path, tiny_corpus):
    """router_release_global with per-token routers under a budget of one head: by the deadline (step 6) every
    head has committed, one global; at router_token_from_iter=8 that head is released (commit_history: path -1)
    and its router's token weights, zero until then, learn; the others stay committed local. Runs resumed
    before the release (step 6) and after it (step 10) train the same losses and end with the same commits."""
    common = {"lr_decay_iters": 14, "eval_interval": 100, "router_global_heads": 1, "router_init_bias": 1.0,
              "router_lambda_ramp": 0, "router_lambda_start": 8, "router_target_global": 0.25,
              "router_commit_after": 3, "router_commit_by_iter": 6, "router_token_from_iter": 8,
              "router_release_global": True}
    straight = train.train(*tiny_train_configs(tmp_path / "a", tiny_corpus, max_iters=14, **common))
    history = json.load(open(tmp_path / "a" / "out" / "train_summary.json"))["commit_history"]
    before = [entry for entry in history if entry[0] < 8]
    assert len(before) == 4 and max(step for step, *_ in before) <= 6 and sum(p for *_, p in before) == 1
    (step, layer, head, _), = [entry for entry in before if entry[3] == 1]
    assert [8, layer, head, -1] in history
    model, _ = checkpoint.load_model(tmp_path / "a" / "out" / "ckpt.pt", "cpu")
    router = model.blocks[layer].attn.router
    assert router.logits.weight[head].abs().sum() > 0  # its tokens' weights learned after the release
    others = [(i, h) for i in range(2) for h in range(2) if (i, h) != (layer, head)]
    assert all(model.blocks[i].attn.router.paths[h] == 0 for i, h in others)
    assert all(model.blocks[i].attn.router.logits.weight[h].abs().sum() == 0 for i, h in others)
    for stop in (6, 10):
        out = tmp_path / f"resumed_{stop}"
        train.train(*tiny_train_configs(out, tiny_corpus, max_iters=stop, **common))
        resumed = train.train(*tiny_train_configs(out, tiny_corpus, max_iters=14, init_from="resume", **common))
        assert resumed["losses"] == straight["losses"][stop:]
        assert json.load(open(out / "out" / "train_summary.json"))["commit_history"] == history


def test_sampled_mode_trains_the_routers_at_less_attention_than_exact(tmp_path, tiny_corpus):
    """routed_mode='sampled' (1 of the batch's 4 sequences exact): the routers learn (their weights move from
    their init) and the run computes less attention than the same run in exact mode, more than its ideal."""
    fracs = {}
    for mode in ("exact", "sampled"):
        out = tmp_path / mode
        train.train(*tiny_train_configs(tmp_path, tiny_corpus, max_iters=12, eval_interval=100, out_dir=str(out),
                                        routed_mode=mode, routed_exact_frac=0.25, router_init_std=0.1))
        fracs[mode] = json.load(open(out / "train_summary.json"))["attention_flop_frac_training"]
        ckpt = checkpoint.load_checkpoint(str(out), "cpu")
        assert ckpt["model_config"]["routed_mode"] == mode
        bias = ckpt["model"]["blocks.0.attn.router.logits.bias"]
        assert (bias != 0).all()  # init 0: the LM gradient and the penalty moved every head's
    assert fracs["sampled"]["ideal"] < fracs["sampled"]["computed"] < fracs["exact"]["computed"]
