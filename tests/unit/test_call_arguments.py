"""The model's config is not a control channel: the routed mode and the router threshold of a call are
arguments, never written into the shared config; generation runs routed layers sparse and is timed from outside
the model; checkpoints of earlier key names are refused; the RNG states of a resume."""
import json
import os
from dataclasses import asdict

import pytest
import torch

import kernels.layer
import sample
from kernels.attention import attention
from model import GPT, GPTConfig, Routing
from nanoaha.checkpoint import load_model_state, save_checkpoint
from nanoaha.evaluation import evaluate_loss, threshold_sweep
from nanoaha.generation_timing import timed_generate
from nanoaha.routing_stats import routing_stats
from nanoaha.train_config import TrainConfig
from nanoaha.training import restore_rng, routed_mode_at


def small_config(**overrides):
    return GPTConfig(**{"vocab_size": 64, "block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32, "window": 4,
                        "attention_backend": "torch", **overrides})


def tokens(B=2, T=20, vocab=64, seed=0):
    return torch.randint(vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def forbid_config_writes(monkeypatch):
    """From here on, writing an attribute of any GPTConfig (constructing one, too) fails the test."""
    def refuse(self, name, value):
        raise AssertionError(f"config.{name} written at run time")
    monkeypatch.setattr(GPTConfig, "__setattr__", refuse)


def test_generation_runs_routed_layers_sparse_in_prefill_and_decode_whatever_the_trained_mode(monkeypatch):
    """'exact' computes full attention for every token only for the straight-through gradient; generation has
    none, so a model trained exact generates sparse: in the prefill (the attention call) and in decode."""
    torch.manual_seed(0)
    model = GPT(small_config(schedule="RL", routed_mode="exact", router_init_std=1.0)).eval()
    prefill_modes, call_modes = [], []
    monkeypatch.setattr(kernels.layer, "attention", lambda *a, kind, mode, **kw: (
        prefill_modes.append(mode) if kind == "routed" else None) or attention(*a, kind=kind, mode=mode, **kw))
    forward = GPT.forward

    def recording_forward(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        call_modes.append(out.routed_mode)
        return out

    monkeypatch.setattr(GPT, "forward", recording_forward)
    model.generate(tokens(T=6), 5, temperature=0)
    assert prefill_modes == ["sparse"]  # one prefill, one routed layer
    assert call_modes == ["sparse"] * 5  # the prefill and four decode steps
    with torch.no_grad():  # a gradient-free call without a cache (evaluation) runs sparse too
        assert model(tokens()).routed_mode == "sparse"
    assert model(tokens()).routed_mode == "exact"  # with a gradient: the trained mode


def test_the_routed_mode_of_a_call_is_an_argument_and_leaves_the_config_alone(monkeypatch):
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", routed_mode="sparse", router_init_std=1.0))
    x, tcfg = tokens(), TrainConfig(sparse_from_iter=3)
    forbid_config_writes(monkeypatch)
    assert model(x, x).routed_mode == "sparse"
    exact = model(x, x, Routing(mode="exact"))
    assert exact.routed_mode == "exact" and model.config.routed_mode == "sparse"
    assert model(x, x, Routing(mode="exact", force="global")).routed_mode == "exact"
    torch.testing.assert_close(exact.logits, model(x, x).logits)  # the same output, computed another way
    assert [routed_mode_at(it, tcfg, model.config) for it in range(5)] == ["exact"] * 3 + ["sparse"] * 2


def test_a_threshold_argument_routes_as_a_model_built_with_that_threshold(monkeypatch):
    torch.manual_seed(0)
    config = small_config(schedule="R", router_init_std=1.0)
    model, x = GPT(config).eval(), tokens()
    built_at_08 = GPT(GPTConfig(**{**asdict(config), "router_threshold": 0.8})).eval()
    built_at_08.load_state_dict(model.state_dict())
    forbid_config_writes(monkeypatch)
    with torch.no_grad():
        fractions = [routing_stats(model(x, routing=Routing(threshold=t)), config)["routed_global_frac"].item()
                     for t in (0.2, 0.5, 0.8)]
        torch.testing.assert_close(model(x, routing=Routing(threshold=0.8)).logits, built_at_08(x).logits)
    assert fractions[0] > fractions[1] > fractions[2]
    assert model.config.router_threshold == 0.5


def test_the_threshold_sweep_never_writes_the_models_config(monkeypatch):
    torch.manual_seed(0)
    model = GPT(small_config(schedule="RR", router_init_std=1.0))
    batches = [(tokens(seed=s), tokens(seed=s + 10)) for s in range(2)]
    forbid_config_writes(monkeypatch)
    rows = threshold_sweep(model, batches, [0.0, 0.5, 1.0])
    fractions = [row["global_frac"] for row in rows]
    assert fractions[0] == 1.0 and 0.2 < fractions[1] < 0.8 and fractions[2] < 0.01
    assert rows[1]["val_loss"] == pytest.approx(evaluate_loss(model, batches)[0], rel=1e-6)


def test_timed_generate_gives_generates_tokens_and_counts_prefill_and_decode():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="RL", router_init_std=1.0)).eval()
    prompt = tokens(B=3, T=6)
    expected = model.generate(prompt, 8, temperature=0)
    generated, timings = timed_generate(model, prompt, 8, temperature=0)
    assert torch.equal(generated, expected)
    assert timings["prefill_tokens"] == 3 * 6 and timings["decode_tokens"] == 3 * 7
    assert timings["prefill_s"] > 0 and timings["decode_s"] > 0
    head_dim = 32 // 2
    assert timings["cache_bytes"] == 2 * 3 * 2 * head_dim * 4 * (6 + 8 + 4)  # routed: every position; local: 4
    uncached, timings = timed_generate(model, prompt, 8, temperature=0, use_kv_cache=False)
    assert torch.equal(uncached, expected) and timings["decode_tokens"] == 0 and timings["cache_bytes"] == 0
    assert timings["prefill_tokens"] == 3 * sum(range(6, 14))
    assert not model._forward_pre_hooks and not model._forward_hooks  # the clock leaves the model as it was


def test_sample_router_threshold_overrides_the_trained_one(tmp_path, tiny_corpus, capsys):
    config = small_config(vocab_size=256, schedule="R", router_init_std=1.0)
    torch.manual_seed(0)
    save_checkpoint(str(tmp_path / "ckpt.pt"), {
        "model": GPT(config).state_dict(), "model_config": asdict(config),
        "data_meta": json.load(open(os.path.join(tiny_corpus, "meta.json")))})
    shown = {}
    for threshold in (0.0, 1.0):
        sample.main([f"--out_dir={tmp_path}", "--start=def ", "--max_new_tokens=4", "--show_routing",
                     "--device=cpu", f"--router_threshold={threshold}"])
        shown[threshold] = capsys.readouterr().out
    assert "100.0% global overall" in shown[0.0] and "0.0% global overall" in shown[1.0]


def test_state_dicts_with_the_routers_earlier_key_names_are_refused():
    model = GPT(small_config(schedule="R"))
    state = {k.replace(".router.logits.", ".router.proj."): v for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"does not match this model: missing \['blocks.0.attn.router.logits"):
        load_model_state(model, state, "old.pt")


def test_restore_rng_sets_this_ranks_state_or_reseeds_for_another_world_size():
    states = []
    for rank in range(2):
        torch.manual_seed(100 + rank)
        states.append(torch.get_rng_state())
    rng = {"torch": states, "cuda": [None, None], "data": torch.Generator().manual_seed(7).get_state()}
    generator = torch.Generator()
    assert restore_rng(rng, generator, rank=1, world=2, seed=0, iter_num=5) is None
    assert torch.equal(torch.get_rng_state(), states[1])
    assert torch.equal(generator.get_state(), rng["data"])
    message = restore_rng(rng, generator, rank=2, world=3, seed=0, iter_num=5)
    assert message.startswith("resuming a run of 2 process(es) with 3")
    reseeded = torch.get_rng_state()
    torch.manual_seed(1_000_003 * 6 + 2)  # from the step and the rank
    assert torch.equal(reseeded, torch.get_rng_state())
