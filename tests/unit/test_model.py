import pytest
import torch

from helpers import small_config
from kernels.attention import attention
from model import GPT, GPTConfig, GPTOutput, Router, Routing, apply_rotary, router_penalty, rotary_tables
from nanoaha.checkpoint import load_model_state
from nanoaha.pruning import prune_checkpoint
from kernels.layer import keys_read, sequence_keys
from nanoaha.routing_stats import global_heads_per_token, routing_stats


def with_router_bias(model, bias):
    for block in model.blocks:
        torch.nn.init.constant_(block.attn.router.logits.bias, bias)
    return model


def tokens(B=2, T=40, vocab=64, seed=0):
    return torch.randint(vocab, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bias, same_as", [(30.0, "G"), (-30.0, "L")])
def test_routed_model_all_global_equals_dense_and_all_local_equals_local(bias, same_as):
    torch.manual_seed(0)
    routed = with_router_bias(GPT(small_config(schedule="R")), bias)
    other = GPT(small_config(schedule=same_as))
    other.load_state_dict(routed.state_dict(), strict=False)
    x = tokens()
    torch.testing.assert_close(routed(x, x).logits, other(x, x).logits)


def test_router_starts_all_global_and_init_is_configurable():
    x = tokens()
    out = GPT(small_config(schedule="R"))(x, x)
    assert all(g.all() for g in out.gates)
    out = GPT(small_config(schedule="R", router_init_bias=-5.0))(x, x)
    assert not any(g.any() for g in out.gates)


def test_ste_gradient_reaches_router_and_penalty_is_lambda_times_mean_probability():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="RL", router_init_std=0.5))
    x = tokens()
    out = model(x, x)
    mean_p = out.probs[0].mean()  # one routed layer
    torch.testing.assert_close(out.layer_p, mean_p.view(1))
    torch.testing.assert_close(router_penalty(out, 0.3), 0.3 * mean_p)  # what training adds to the loss
    out.lm_loss.backward()  # the LM loss alone: the router's gradient can only come through the STE
    grad = model.blocks[0].attn.router.logits.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_straight_through_gradient_of_the_gate_is_that_of_p():
    """d gate / d logit = p (1 - p) > 0: the bias gradient of gate.sum() is the sum of p (1 - p) per head."""
    torch.manual_seed(0)
    router = Router(small_config(router_init_std=1.0))
    router.reset_parameters()
    x = torch.randn(2, 40, 32)
    hard, gate, p = router(x)
    assert torch.equal(gate.detach(), hard.float())  # the forward value is the hard 0/1 decision
    gate.sum().backward()
    expected = (p * (1 - p)).sum(dim=(0, 2)).detach()
    assert (expected > 0).all()
    torch.testing.assert_close(router.logits.bias.grad, expected)


@pytest.mark.parametrize("mode", ["exact", "sparse", "sampled"])
def test_model_outputs_and_gradients_match_the_reference_backend(mode):
    """The torch backend against explicit masks in the same mode: logits and every parameter's gradient
    (the router's included, which differs between the modes)."""
    results = []
    for backend in ("torch", "reference"):
        torch.manual_seed(0)
        model = GPT(small_config(schedule="RL", router_init_std=1.0, n_sink=2, routed_mode=mode,
                                 attention_backend=backend)).double()
        x = tokens()
        out = model(x, x)
        assert 0 < out.gates[0].float().mean() < 1  # a real mix of global and local tokens
        (out.lm_loss + router_penalty(out, 0.1)).backward()
        results.append((out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (logits, grads), (ref_logits, ref_grads) = results
    torch.testing.assert_close(logits, ref_logits)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, msg=lambda m: f"{name}: {m}")
    assert ref_grads["blocks.0.attn.router.logits.weight"].abs().sum() > 0


def test_exact_and_sparse_router_gradients_differ_only_where_the_gate_is_zero():
    """Sparse mode gives the router no gradient from ungated tokens; on gated tokens the two modes agree."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 30, 8, dtype=torch.float64) for _ in range(3))
    gate = (torch.rand(1, 2, 30) < 0.4).double()
    grads = {}
    for mode in ("exact", "sparse"):
        g = gate.clone().requires_grad_()
        attention(q, k, v, kind="routed", window=4, gate=g, mode=mode, backend="torch").sum().backward()
        grads[mode] = g.grad
    on = gate.bool()
    torch.testing.assert_close(grads["sparse"][on], grads["exact"][on])
    assert (grads["sparse"][~on] == 0).all() and (grads["exact"][~on] != 0).any()


def test_threshold_changes_routing_at_inference():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", router_init_std=1.0))
    x = tokens()
    fractions = []
    for threshold in (0.2, 0.5, 0.8):
        model.config.router_threshold = threshold
        fractions.append(routing_stats(model(x, x), model.config)["routed_global_frac"].item())
    assert fractions[0] > fractions[1] > fractions[2]


def test_force_global_overrides_router_but_keeps_its_gradient():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", router_init_bias=-5.0))
    x = tokens()
    out = model(x, x, Routing(force="global"))
    assert all(g.all() for g in out.gates)
    out.lm_loss.backward()
    assert model.blocks[0].attn.router.logits.bias.grad.abs().sum() > 0


def test_a_seed_gives_routed_and_router_less_models_the_same_backbone_and_rng():
    """Routers must not shift the backbone init: at one seed, every weight a local, dense, LLLG, random-routing
    or per-head-router model has equals the learned-routing model's, and the RNG is left in the same state."""
    def build(**overrides):
        torch.manual_seed(7)
        model = GPT(small_config(n_layer=3, **overrides))
        return model, torch.rand(4)
    reference, reference_rng = build(schedule="L")
    routed, routed_rng = build(schedule="R", router_init_std=0.5)
    for model, rng in [build(schedule="G"), build(schedule="LLG"), (routed, routed_rng),
                       build(schedule="R", routing="random"), build(schedule="R", router_per_token=False)]:
        shared = {k: v for k, v in model.state_dict().items() if "router" not in k}
        assert shared.keys() == reference.state_dict().keys()
        assert all(torch.equal(v, reference.state_dict()[k]) for k, v in shared.items())
        assert torch.equal(rng, reference_rng)
    # the routers themselves are drawn (std 0.5), one draw per layer, not one copied
    w = [block.attn.router.logits.weight for block in routed.blocks]
    assert w[0].std() > 0.3 and not torch.equal(w[0], w[1])


def test_random_routing_is_content_free_with_rate_q():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", routing="random", random_global_q=0.25))
    assert all(block.attn.router is None for block in model.blocks)
    x = tokens(B=8)
    stats = routing_stats(model(x, x), model.config)
    assert abs(stats["routed_global_frac"].item() - 0.25) < 0.03
    assert router_penalty(model(x, x), 0.5).item() == 0.0 and model(x, x).layer_p.tolist() == [0.0]


def test_routing_stats_global_fraction_per_layer_and_head():
    """B=3, H=2, T=40 (H != T): per head, the mean over batch and positions."""
    torch.manual_seed(0)
    cfg = small_config(schedule="RL", router_init_std=0.3)
    model = GPT(cfg)
    with torch.no_grad():  # head 0 mostly global, head 1 mostly local, neither entirely
        model.blocks[0].attn.router.logits.bias.copy_(torch.tensor([1.5, -1.5]))
    x = tokens(B=3, T=40)
    out = model(x, x)
    stats = routing_stats(out, cfg)
    assert stats["global_frac"].shape == (2, 2)
    torch.testing.assert_close(stats["global_frac"][0], out.gates[0].float().mean(dim=(0, 2)))
    torch.testing.assert_close(stats["mean_p"][0], out.probs[0].mean(dim=(0, 2)))
    assert 0.5 < stats["global_frac"][0, 0] < 1 and 0 < stats["global_frac"][0, 1] < 0.5
    torch.testing.assert_close(stats["routed_global_frac"], out.gates[0].float().mean())
    assert stats["global_frac"][1].eq(0).all() and stats["mean_p"][1].isnan().all()
    counts = global_heads_per_token(out)
    assert counts.shape == (3, 40) and torch.equal(counts, out.gates[0].sum(1))


@pytest.mark.parametrize("mode", ["exact", "sparse", "sampled"])
@pytest.mark.parametrize("bias", [30.0, -30.0])
def test_routed_layer_flop_fraction_ideal_and_computed(mode, bias):
    """All global: ideal 1 (dense); all local: ideal = the local fraction. Computed: exact mode runs local and
    full for every token; sparse mode local for all and full for the gated ones; sampled mode exact for the
    first of the batch's 4 sequences (routed_exact_frac 0.25), sparse for the others."""
    cfg = small_config(schedule="R", n_layer=1, window=8, n_sink=2, routed_mode=mode, routed_exact_frac=0.25)
    model = with_router_bias(GPT(cfg), bias)
    x = tokens(B=4, T=48)
    stats = routing_stats(model(x, x), cfg)
    local = (keys_read("local", 48, 8, 2).sum() / keys_read("dense", 48, 8, 2).sum()).float()
    ideal = torch.tensor(1.0) if bias > 0 else local
    computed = 1 + local if mode == "exact" or bias > 0 else local + 0.25 if mode == "sampled" else local
    torch.testing.assert_close(stats["ideal_flop_frac"], ideal[None])
    torch.testing.assert_close(stats["computed_flop_frac"], computed[None])
    forced = routing_stats(model(x, x, Routing(force="global")), cfg)  # forced-global steps run exact mode
    torch.testing.assert_close(forced["computed_flop_frac"], (1 + local)[None])


@pytest.mark.parametrize("n_sink", [0, 2])
def test_ideal_flops_weigh_each_global_token_by_its_own_position(n_sink):
    """Only the last position global: ideal reads its whole causal row (48 keys) and the window elsewhere, not
    the mean global fraction (1/48) of every position's row; both heads and batch rows alike."""
    cfg = small_config(schedule="R", n_layer=1, window=8, n_sink=n_sink)
    gate = torch.zeros(2, cfg.n_head, 48, dtype=torch.bool)
    gate[..., -1] = True
    out = GPTOutput(logits=torch.zeros(2, 48, cfg.vocab_size), gates=[gate], probs=[gate.float()], seq_len=48,
                    routed_mode="sparse", attention_keys=[sequence_keys("routed", gate, "sparse", 48, 8, n_sink)])
    local, dense = keys_read("local", 48, 8, n_sink).float(), keys_read("dense", 48, 8, n_sink).float()
    ideal = (local.sum() - local[-1] + dense[-1]) / dense.sum()
    stats = routing_stats(out, cfg)
    torch.testing.assert_close(stats["ideal_flop_frac"], ideal[None])
    by_mean_fraction = (local.sum() + (dense - local).sum() / 48) / dense.sum()
    assert abs(ideal - by_mean_fraction) > 0.01  # what the mean global fraction would give (0.019 off)


def test_without_a_gradient_routed_layers_run_sparse_and_compute_what_exact_computes(monkeypatch):
    """Evaluation needs no straight-through gradient, so an exact-mode model runs sparse there: the same
    logits, fewer FLOPs; routing_stats can still count what training in the model's mode computes."""
    torch.manual_seed(0)
    cfg = small_config(schedule="RLR", n_layer=3, router_init_std=1.0, n_sink=2, routed_mode="exact")
    model, x = GPT(cfg).double(), tokens()
    modes = []
    monkeypatch.setattr("kernels.layer.attention", lambda *a, mode, **kw: modes.append(mode) or attention(*a, mode=mode, **kw))
    trained = model(x, x)
    assert modes == ["exact", "exact", "exact"] and trained.routed_mode == "exact"
    modes.clear()
    with torch.no_grad():
        evaluated = model(x, x)
        forced = model(x, x, Routing(force="global"))
    assert modes == ["sparse"] * 3 + ["exact"] * 3 and evaluated.routed_mode == "sparse"
    assert 0 < evaluated.gates[0].float().mean() < 1  # a real mix of global and local tokens
    torch.testing.assert_close(evaluated.logits, trained.logits.detach())
    assert forced.routed_mode == "exact"
    as_run, as_trained = routing_stats(evaluated, cfg), routing_stats(evaluated, cfg, mode="exact")
    torch.testing.assert_close(as_trained["computed_flop_frac"], routing_stats(trained, cfg)["computed_flop_frac"])
    assert as_run["model_computed_flop_frac"] < as_trained["model_computed_flop_frac"]
    torch.testing.assert_close(as_trained["model_inference_flop_frac"], as_run["model_computed_flop_frac"])
    assert "model_inference_flop_frac" not in as_run
    torch.testing.assert_close(as_run["ideal_flop_frac"], as_trained["ideal_flop_frac"])


def test_router_explore_sends_a_fraction_of_local_decisions_global_in_training_only():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", router_init_bias=-30.0, router_explore=0.25))
    x = tokens(B=8)
    out = model(x, x)
    frac = torch.stack([g.float().mean() for g in out.gates]).mean()
    assert abs(frac.item() - 0.25) < 0.03
    out.lm_loss.backward()  # explored tokens carry the straight-through gradient to the router
    assert model.blocks[0].attn.router.logits.weight.grad.abs().sum() > 0
    assert not any(g.any() for g in model.eval()(x, x).gates)


def test_random_routing_rate_per_layer():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", n_layer=3, routing="random", random_global_q=[0.0, 1.0, 0.5]))
    x = tokens(B=8)
    fracs = routing_stats(model(x, x), model.config)["global_frac"].mean(1)
    assert fracs[0] == 0 and fracs[1] == 1 and abs(fracs[2] - 0.5) < 0.05
    with pytest.raises(ValueError, match="one per layer"):
        small_config(routing="random", random_global_q=[0.1])


def test_random_routing_rate_per_head_fixes_heads_global_or_local():
    """A layer's rate may be one per head: rates 0 and 1 make a fixed mix, e.g. one global head in a local
    layer (the fixed counterpart of a router that sends one head global); a wrong length is refused."""
    torch.manual_seed(0)
    model = GPT(small_config(schedule="LR", n_head=4, routing="random",
                             random_global_q=[0.0, [1.0, 0.0, 0.0, 0.5]]))
    x = tokens(B=32)
    heads = routing_stats(model(x, x), model.config)["global_frac"][1]
    assert heads[0] == 1 and heads[1] == 0 and heads[2] == 0 and abs(heads[3] - 0.5) < 0.05
    with pytest.raises(ValueError, match="a list of 4 \\(one per head\\)"):
        small_config(schedule="LR", n_head=4, routing="random", random_global_q=[0.0, [1.0, 0.0]])
    with pytest.raises(ValueError, match="must be a probability"):
        small_config(schedule="LR", n_head=4, routing="random", random_global_q=[0.0, [1.0, 0.0, 0.0, 2.0]])


def test_random_routing_per_head_draws_once_per_row_and_head_without_router_per_token():
    """router_per_token=False with routing='random' drew per token anyway; now every token of a (row, head) has
    its one draw (a random per-head schedule, also through a generation's KV cache), at the layer's rate; the
    default stays a draw per token."""
    torch.manual_seed(0)
    x = tokens(B=64)
    per_head = GPT(small_config(schedule="R", routing="random", random_global_q=0.5, router_per_token=False)).eval()
    for gate in per_head(x, x).gates:
        assert (gate == gate[:, :, :1]).all()  # (B, H, T): one decision per row and head
        assert 0.35 < gate[:, :, 0].float().mean() < 0.65 and not (gate[0, 0, 0] == gate[:, :, 0]).all()
    per_token = GPT(small_config(schedule="R", routing="random", random_global_q=0.5)).eval()
    for gate in per_token(x, x).gates:
        assert not (gate == gate[:, :, :1]).all() and 0.45 < gate.float().mean() < 0.55
    cache = per_head.new_cache()
    with torch.no_grad():
        first = per_head(x[:4, :10], cache=cache).gates
        later = [per_head(x[:4, t:t + 1], cache=cache).gates for t in range(10, 14)]
    for layer, gate in enumerate(first):
        assert all((step[layer] == gate[:, :, :1]).all() for step in later)  # decoding keeps the draw


def test_routing_stats_flop_fraction():
    cfg = small_config(schedule="LG", window=8, n_sink=2)
    x = tokens(T=48)
    stats = routing_stats(GPT(cfg)(x, x), cfg)
    local = keys_read("local", 48, 8, 2).sum() / keys_read("dense", 48, 8, 2).sum()
    for key in ("ideal_flop_frac", "computed_flop_frac"):  # fixed layers compute what they ask for
        torch.testing.assert_close(stats[key], torch.stack([local, torch.tensor(1.0)]).float())
    assert stats["global_frac"][0].eq(0).all() and stats["global_frac"][1].eq(1).all()
    assert torch.isnan(stats["routed_global_frac"])
    # keys read by one local query: the window (cut at the start) plus sinks outside it
    assert keys_read("local", 12, 4, 2).tolist() == [1, 2, 3, 4, 5, 6, 6, 6, 6, 6, 6, 6]


@pytest.mark.parametrize("schedule, n_sink, sees_local", [("R", 0, False), ("R", 3, False), ("RL", 2, False),
                                                         ("R", 2, True)])
@pytest.mark.parametrize("gather", [False, True])
def test_decode_reads_what_full_attention_reads_for_each_gate(schedule, n_sink, sees_local, gather, monkeypatch):
    """Token by token with the cache, logits and gates equal those of one forward over the whole sequence (the
    reference backend's explicit masks), batch 3, each sequence and head with its own gates; both ways of
    reading the global heads (head by head as on the CPU, gathered as on CUDA); a router that reads the local
    output routes each decoded token from its window output, prefill (10 tokens at once) included."""
    monkeypatch.setattr("kernels.layer.decode_gathers", lambda q: gather)
    torch.manual_seed(0)
    cfg = small_config(schedule=schedule, n_sink=n_sink, router_init_std=2.0, n_layer=2, attention_backend="reference",
                       router_sees_local=sees_local)
    model = GPT(cfg).eval()
    x = tokens(B=3, T=30)
    with torch.no_grad():
        out = model(x, torch.zeros_like(x))
        gates = out.gates[0][:, :, 10:]
        assert 0.1 < gates.float().mean() < 0.9 and not torch.equal(gates[0], gates[1])
        cache = model.new_cache()
        first = model(x[:, :10], cache=cache)
        steps = [first.logits[:, -1]]
        step_gates = [first.gates[0]]
        for t in range(10, 30):
            step = model(x[:, t:t + 1], cache=cache)
            steps.append(step.logits[:, -1])
            step_gates.append(step.gates[0])
    torch.testing.assert_close(torch.stack(steps, 1), out.logits[:, 9:], rtol=1e-4, atol=1e-4)
    assert torch.equal(torch.cat(step_gates, 2), out.gates[0])


def test_a_router_that_sees_the_local_output_adds_u_dot_it_to_its_logit():
    """p = sigmoid(W x + b + u_h . o_h), o_h the head's local attention output; with u = 0 (its init) the model is
    the plain-router model with the same weights, and the LM loss alone trains u through the STE."""
    torch.manual_seed(0)
    cfg = dict(schedule="RL", router_init_std=0.5, n_layer=2, attention_backend="reference")
    plain, seeing = GPT(small_config(**cfg)), GPT(small_config(router_sees_local=True, **cfg))
    seeing.load_state_dict(plain.state_dict(), strict=False)
    router = seeing.blocks[0].attn.router
    assert router.local_weight.abs().sum() == 0
    x = tokens()
    torch.testing.assert_close(seeing(x, x).logits, plain(x, x).logits)
    out = seeing(x, x)
    out.lm_loss.backward()
    assert router.local_weight.grad.abs().sum() > 0
    with torch.no_grad():
        router.local_weight.normal_()
        attn, h = seeing.blocks[0].attn, seeing.blocks[0].ln_1(seeing.wte(x))
        q, k, v = attn.qkv(h).view(2, 40, 3, 2, 16).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(q, seeing.rope_cos[:40], seeing.rope_sin[:40]), \
            apply_rotary(k, seeing.rope_cos[:40], seeing.rope_sin[:40])
        local = attention(q, k, v, kind="local", window=8, backend="reference")
        logits = router.logits(h).transpose(1, 2) + (local * router.local_weight[None, :, None]).sum(-1)
        torch.testing.assert_close(seeing(x, x).probs[0], torch.sigmoid(logits))


@pytest.mark.parametrize("mode", ["exact", "sparse"])
def test_a_router_that_sees_the_local_output_matches_the_reference_backend(mode):
    """Exact mode combines the router's local output with full attention (no second local pass); sparse mode
    runs the routed kernel: logits and gradients as the reference backend's explicit masks give them."""
    torch.manual_seed(0)
    cfg = dict(schedule="R", router_init_std=1.0, n_layer=2, routed_mode=mode, router_sees_local=True)
    fast, ref = GPT(small_config(**cfg)), GPT(small_config(attention_backend="reference", **cfg))
    with torch.no_grad():
        for block in fast.blocks:
            block.attn.router.local_weight.normal_()
    ref.load_state_dict(fast.state_dict())
    x = tokens()
    out_fast, out_ref = fast(x, x), ref(x, x)
    assert 0.1 < out_fast.gates[0].float().mean() < 0.9
    torch.testing.assert_close(out_fast.logits, out_ref.logits, rtol=1e-4, atol=1e-4)
    out_fast.lm_loss.backward()
    out_ref.lm_loss.backward()
    for (name, a), b in zip(fast.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-5, msg=name)


def per_head_and_token_routers(bias, **cfg):
    """A model with per-head routers and the same model with token routers whose weights are zero, both with
    these router biases (one per head, every routed layer) and the same backbone."""
    models = []
    for per_token in (False, True):
        torch.manual_seed(0)
        model = GPT(small_config(router_per_token=per_token, **cfg))
        with torch.no_grad():
            for block in model.blocks:
                if block.attn.router is not None:
                    (block.attn.router.logits.bias if per_token else block.attn.router.bias).copy_(bias)
        models.append(model)
    return models


def test_a_per_head_router_is_a_token_router_without_weights():
    """router_per_token=False: one parameter per head, p = sigmoid(b_h) for every token and sequence; its loss,
    gates and bias gradient (LM loss through the STE plus the penalty) are those of a token router whose W is
    zero, which is what it is (its backbone init: test_a_seed_gives_routed_and_router_less_models_...)."""
    bias = torch.tensor([1.5, -0.7])
    per_head, per_token = per_head_and_token_routers(bias, schedule="RL")
    router = per_head.blocks[0].attn.router
    assert [n for n, _ in router.named_parameters()] == ["bias"] and router.bias.shape == (2,)
    x = tokens()
    out, ref = per_head(x, x), per_token(x, x)
    assert torch.equal(out.gates[0], (bias >= 0).view(1, 2, 1).expand_as(out.gates[0]))
    assert torch.equal(out.probs[0], torch.sigmoid(bias).view(1, 2, 1).expand_as(out.probs[0]))
    loss, ref_loss = (o.lm_loss + router_penalty(o, 0.3) for o in (out, ref))
    torch.testing.assert_close(loss, ref_loss)
    loss.backward()
    ref_loss.backward()
    assert router.bias.grad.abs().min() > 0
    torch.testing.assert_close(router.bias.grad, per_token.blocks[0].attn.router.logits.bias.grad)


@pytest.mark.parametrize("mode", ["exact", "sparse"])
def test_a_per_head_router_computes_what_the_reference_masks_give_and_decodes_from_the_cache(mode):
    """One head global and one local in each routed layer: the torch backend's logits and gradients equal the
    reference's explicit masks; token by token with the KV cache, the logits equal one forward's."""
    bias = torch.tensor([-2.0, 2.0])
    fast, _ = per_head_and_token_routers(bias, schedule="RR", routed_mode=mode)
    ref, _ = per_head_and_token_routers(bias, schedule="RR", routed_mode=mode, attention_backend="reference")
    x = tokens()
    out_fast, out_ref = fast(x, x), ref(x, x)
    torch.testing.assert_close(out_fast.logits, out_ref.logits, rtol=1e-4, atol=1e-4)
    out_fast.lm_loss.backward()
    out_ref.lm_loss.backward()
    for (name, a), b in zip(fast.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-5, msg=name)
    fast.eval()
    with torch.no_grad():
        whole = fast(x, torch.zeros_like(x)).logits
        cache = fast.new_cache()
        steps = [fast(x[:, :10], cache=cache).logits[:, -1]]
        steps += [fast(x[:, t:t + 1], cache=cache).logits[:, -1] for t in range(10, x.shape[1])]
    torch.testing.assert_close(torch.stack(steps, 1), whole[:, 9:], rtol=1e-4, atol=1e-4)


def test_a_pruned_model_generates_from_a_window_cache():
    torch.manual_seed(0)
    cfg = small_config(schedule="RR", router_init_std=2.0, n_sink=2)
    model = GPT(cfg).eval()
    ckpt = {"model": model.state_dict(), "model_config": vars(cfg)}
    pruned = GPT(GPTConfig(**prune_checkpoint(ckpt, [1])["model_config"])).eval()
    load_model_state(pruned, prune_checkpoint(ckpt, [1])["model"], "pruned")
    prompt = tokens(B=2, T=12)
    cached = pruned.generate(prompt, 30, temperature=0, use_kv_cache=True)
    assert torch.equal(cached, pruned.generate(prompt, 30, temperature=0, use_kv_cache=False))
    cache = pruned.new_cache()
    with torch.no_grad():
        pruned(prompt, cache=cache)
    per_position = 2 * 2 * cfg.n_embd * 4  # keys and values, batch 2, fp32
    assert [c.bytes for c in cache] == [per_position * cfg.block_size, per_position * (cfg.window + 2)]


def test_local_layer_cache_keeps_only_window_and_sinks():
    cfg = small_config(schedule="L", window=8, n_sink=2)
    model = GPT(cfg).eval()
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens(B=1, T=20), cache=cache)
        model(tokens(B=1, T=1), cache=cache)
    assert cache[0].k.shape[2] == 8 and cache[0].sink_k.shape[2] == 2  # preallocated: a ring of the window
    assert cache[0].positions() == [0, 1] + list(range(13, 21))
    assert cache[0].bytes == 2 * 10 * cfg.n_embd * 4


def test_config_rejects_bad_values():
    for bad in ({"window": 0}, {"window": 100}, {"n_sink": 9}, {"schedule": "RX"}, {"routing": "coin"},
                {"n_embd": 30}, {"router_per_token": False, "router_sees_local": True},
                {"router_per_token": False, "router_init_std": 0.5}):
        with pytest.raises(ValueError):
            small_config(**bad)


def test_router_budget_applies_per_layer():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", n_layer=2))
    torch.nn.init.constant_(model.blocks[0].attn.router.logits.bias, -3.0)  # layer 0: p = 0.047
    torch.nn.init.constant_(model.blocks[1].attn.router.logits.bias, 1.0)   # layer 1: p = 0.731
    x = tokens()
    out = model(x, x)
    p0, p1 = torch.sigmoid(torch.tensor(-3.0)), torch.sigmoid(torch.tensor(1.0))
    torch.testing.assert_close(out.layer_p, torch.stack([p0, p1]))
    # layer 0 is under the budget and costs nothing; a budget on the mean (0.39) would have charged it
    torch.testing.assert_close(router_penalty(out, 1.0, budget=0.1), (p1 - 0.1) / 2)
    assert router_penalty(out, 1.0, budget=0.8).item() == 0.0
    per_layer = router_penalty(out, torch.tensor([2.0, 1.0]), budget=0.0)  # one weight per routed layer
    torch.testing.assert_close(per_layer, (2 * p0 + p1) / 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_rotates_each_pair_by_its_position_angle(dtype):
    # the tables fold the sign and the duplicate cos in (four ops per call): check against the rotation itself
    head_dim, length, base = 16, 40, 10000.0
    cos, sin = rotary_tables(head_dim, length, base)
    assert cos.shape == sin.shape == (length, head_dim)
    x = torch.randn(2, 3, length, head_dim).to(dtype)
    half = head_dim // 2
    angle = torch.arange(length).float()[:, None] / base ** (torch.arange(half).float() * 2 / head_dim)
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    expected = torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], -1)
    rotated = apply_rotary(x, cos, sin)
    assert rotated.dtype == dtype
    torch.testing.assert_close(rotated, expected.to(dtype))
    # position 0 is the identity; a rotation keeps each pair's length
    torch.testing.assert_close(rotated[..., 0, :], x[..., 0, :])
    norms = lambda y: y.float()[..., :half] ** 2 + y.float()[..., half:] ** 2
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(norms(rotated), norms(x), **tol)


def test_random_routing_trains_sparse_with_the_gradients_exact_mode_gives(monkeypatch):
    """A random gate carries no gradient, so 'exact' would compute the full output of local tokens for nothing:
    random routing trains 'sparse', with exact mode's outputs and weight gradients, at less attention."""
    torch.manual_seed(0)
    cfg = small_config(schedule="RL", routing="random", random_global_q=0.3, routed_mode="exact")
    model, x = GPT(cfg).double(), tokens()
    runs = []
    for forced_exact in (False, True):
        if forced_exact:  # what training random routing in exact mode would compute
            monkeypatch.setattr("model.trained_mode", lambda config, routed_mode=None: "exact")
        torch.manual_seed(1)  # the same random gates
        model.zero_grad()
        out = model(x, x)
        assert out.routed_mode == ("exact" if forced_exact else "sparse")
        out.lm_loss.backward()
        runs.append((out.logits.detach(), [p.grad.clone() for p in model.parameters()], out.attention_keys[0]))
    torch.testing.assert_close(runs[0][0], runs[1][0])
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b)
    assert runs[0][2] < runs[1][2]  # fewer query-key pairs than exact's


def test_decision_stability_counts_changed_decisions_and_the_distance_from_the_threshold():
    from nanoaha.routing_stats import decision_stability, stability_scalars
    gates = torch.tensor([[[True, False, True, True]], [[False, False, True, True]]])  # (B=2, H=1, T=4)
    probs = torch.tensor([[[0.9, 0.1, 0.52, 0.6]], [[0.3, 0.2, 0.7, 0.98]]])
    first = decision_stability(None, [([gates, None], [probs, None])], threshold=0.5)
    assert first["flicker"] == [None, None]  # nothing to compare with yet; layer 1 is not routed
    assert first["margin"][0] == pytest.approx([(0.4 + 0.4 + 0.02 + 0.1 + 0.2 + 0.3 + 0.2 + 0.48) / 8])
    assert first["near"][0] == [1 / 8] and first["margin"][1] is None
    changed = gates.clone()
    changed[0, 0, 0] = changed[1, 0, 3] = False  # two of eight decisions flip
    second = decision_stability(first["gates"], [([changed, None], [probs, None])], threshold=0.5)
    assert second["flicker"][0] == [0.25]
    scalars = stability_scalars(second, flips=[[0.1], None], bias_grads=[[-0.5], None])
    assert scalars["val_stability/flicker_layer0"] == 0.25 and "val_stability/flicker_layer1" not in scalars
    assert scalars["val_stability_heads_layer0/step_flips_head0"] == 0.1
    assert scalars["val_stability_heads_layer0/bias_grad_head0"] == -0.5 and "val_stability/bias_grad_layer1" \
        not in scalars


@pytest.mark.parametrize("per_token", [True, False])
def test_a_committed_head_runs_its_path_whatever_its_router_says_and_its_router_gets_no_gradient(per_token):
    """Router.commit: the head's hard decision and p are its path at any threshold; the other heads decide as
    before; the committed head's router parameters get no gradient; the model computes what the same decisions
    computed without committing (a head whose router says the same thing)."""
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", router_per_token=per_token))
    router = model.blocks[0].attn.router
    x = tokens()
    before = model(x, x)
    router.commit(0, 0)  # head 0 committed local; at init every router says global (p = 0.5)
    assert router.paths == (0, -1) and router.committed.tolist() == [0, -1]
    for threshold in (None, 0.0, 1.0):
        out = model(x, x, Routing(threshold=threshold))
        assert not out.gates[0][:, 0].any() and (out.probs[0][:, 0] == 0).all()
        assert torch.equal(out.gates[0][:, 1], before.gates[0][:, 1] if threshold != 1.0 else
                           torch.zeros_like(out.gates[0][:, 1]))
    out = model(x, x)
    (out.lm_loss + router_penalty(out, 0.5)).backward()
    bias_grad = router.bias.grad if not per_token else router.logits.bias.grad
    assert bias_grad[0] == 0 and bias_grad[1] != 0
    if per_token:
        assert (router.logits.weight.grad[0] == 0).all() and (router.logits.weight.grad[1] != 0).any()
    # the same decisions from the router itself: a head whose bias says local
    torch.manual_seed(0)
    same = GPT(small_config(schedule="R", router_per_token=per_token))
    with torch.no_grad():
        (same.blocks[0].attn.router.bias if not per_token else same.blocks[0].attn.router.logits.bias)[0] = -30.0
    torch.testing.assert_close(out.logits, same(x, x).logits)
    # forced routing still forces every head (evaluation's all-global and all-local comparisons)
    forced = model(x, x, Routing(force="global"))
    assert forced.gates[0].all()


def test_committed_heads_are_part_of_the_model_state():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="RL", router_per_token=False))
    model.blocks[0].attn.router.commit(1, 1)
    state = model.state_dict()
    assert state["blocks.0.attn.router.committed"].tolist() == [-1, 1]
    fresh = GPT(small_config(schedule="RL", router_per_token=False))
    assert fresh.blocks[0].attn.router.paths == (-1, -1)
    load_model_state(fresh, state, "test")
    assert fresh.blocks[0].attn.router.paths == (-1, 1)


def test_the_head_budget_makes_the_k_heads_of_highest_bias_global_over_every_layer():
    """router_global_heads=k: the k routed heads of highest bias over both layers are global, whatever the
    threshold; a committed global head takes a place first, a committed local one never gets one."""
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", router_per_token=False, router_global_heads=2))
    r0, r1 = (block.attn.router for block in model.blocks)
    with torch.no_grad():
        r0.bias.copy_(torch.tensor([-3.0, 0.5]))
        r1.bias.copy_(torch.tensor([1.0, -4.0]))
    x = tokens()
    out = model(x, x, Routing(threshold=0.99))
    assert [g[0, :, 0].tolist() for g in out.gates] == [[False, True], [True, False]]
    assert [c.tolist() for c in model.chosen_heads()] == [[False, True], [True, False]]
    assert [r.head_decisions(chosen=c).tolist() for r, c in zip((r0, r1), model.chosen_heads())] == \
        [[False, True], [True, False]]
    r1.commit(1, 1)  # the lowest bias, committed global: it takes one of the two places
    r1.commit(0, 0)  # the highest, committed local: it gets none
    out = model(x, x)
    assert [g[0, :, 0].tolist() for g in out.gates] == [[False, True], [False, True]]
    with torch.no_grad():
        r0.bias.copy_(torch.tensor([0.0, 0.0]))  # a tie goes to the lower head
    r1.committed.fill_(-1)
    r1._read_paths()
    with torch.no_grad():
        r1.bias.copy_(torch.tensor([0.0, 0.0]))
    assert [c.tolist() for c in model.chosen_heads()] == [[True, True], [False, False]]
    # the STE gradient still reaches every head's bias
    out = model(x, x)
    out.lm_loss.backward()
    assert (r0.bias.grad != 0).all() and (r1.bias.grad != 0).all()


def test_a_budget_of_heads_with_per_token_routers_routes_the_tokens_of_its_heads_and_keeps_the_others_local():
    """router_global_heads=k with router_per_token=True: the k heads of highest router bias (the token-independent
    part of p) decide per token by the threshold, the other routed heads are local for every token; the
    straight-through gradient reaches every head's router, so an unchosen head can earn its place."""
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", router_per_token=True, router_global_heads=1))
    r0, r1 = (block.attn.router for block in model.blocks)
    with torch.no_grad():
        r0.logits.bias.copy_(torch.tensor([0.5, 3.0]))  # the highest bias: layer 0 head 1
        r1.logits.bias.copy_(torch.tensor([2.0, -1.0]))
        r0.logits.weight.zero_()
        r0.logits.weight[1, 0] = 40.0  # head 1's p follows the input's first feature: global on some tokens only
    x = tokens()
    assert [c.tolist() for c in model.chosen_heads()] == [[False, True], [False, False]]
    out = model(x, x)
    chosen_gate = out.gates[0][:, 1]
    assert torch.equal(chosen_gate, out.probs[0][:, 1] >= 0.5) and 0 < chosen_gate.float().mean() < 1  # per token, by the threshold
    assert not out.gates[0][:, 0].any() and not out.gates[1].any()  # every other head local, whatever its p
    low = model(x, x, Routing(threshold=0.01))  # a threshold moves the chosen head's tokens only
    assert torch.equal(low.gates[0][:, 1], low.probs[0][:, 1] >= 0.01) and low.gates[0][:, 1].sum() > chosen_gate.sum()
    assert not low.gates[0][:, 0].any() and not low.gates[1].any()
    model(x, x).lm_loss.backward()
    assert (r1.logits.bias.grad != 0).all() and (r0.logits.weight.grad[1] != 0).any()


@pytest.mark.parametrize("overrides", [{"routing": "random", "router_per_token": False},
                                       {"router_per_token": False, "router_global_heads": 5},
                                       {"router_global_heads": 5}, {"router_explore": 0.1}])
def test_the_head_budget_needs_learned_routers_and_at_most_the_routed_heads(overrides):
    with pytest.raises(ValueError, match="router_global_heads"):
        small_config(schedule="RL", **{"router_global_heads": 1, **overrides})


@pytest.mark.parametrize("layout", ["committed", "random"])
def test_a_fixed_layout_computes_what_it_decides_in_training_and_in_the_statistics(layout):
    """Every head of the routed layer fixed (committed, or random routing at rates 0 and 1): in exact mode, the
    pass computes only each head's path, so the computed attention FLOPs equal the ideal ones, in the pass and
    in routing_stats' count of the trained mode from an evaluation pass (sparse); a forced call splits nothing."""
    torch.manual_seed(0)
    if layout == "committed":
        model = GPT(small_config(schedule="LR", router_per_token=False))
        for head, path in enumerate((1, 0)):
            model.blocks[1].attn.router.commit(head, path)
    else:
        model = GPT(small_config(schedule="LR", routing="random", random_global_q=[0.0, [1.0, 0.0]]))
    assert model.blocks[1].attn.paths() == (1, 0) and model.blocks[1].attn.paths("global") is None
    x = tokens()
    out = model(x, x, Routing(mode="exact"))
    T, w = x.shape[1], model.config.window
    expected = x.shape[0] * (keys_read("dense", T, w, 0).sum() + keys_read("local", T, w, 0).sum())
    assert out.attention_keys[1] == expected and out.paths == [None, (1, 0)]
    stats = routing_stats(out, model.config)
    torch.testing.assert_close(stats["computed_flop_frac"], stats["ideal_flop_frac"])
    with torch.no_grad():
        evaluated = model(x, x)
    stats = routing_stats(evaluated, model.config, mode="exact")
    torch.testing.assert_close(stats["computed_flop_frac"], stats["ideal_flop_frac"])
    forced = model(x, x, Routing(force="global", mode="exact"))
    assert forced.paths == [None, None]
    assert forced.attention_keys[1] == sequence_keys("routed", forced.gates[1], "exact", T, w, 0) > expected


def test_a_config_with_another_schedule_caps_its_head_budget_at_the_routed_heads_left():
    """GPTConfig.with_schedule, for the models derived from a trained one (the KV cache's dense reference,
    pruning, bench/generate.py's dense and local rows): a budget of heads is kept where enough routed heads
    remain, capped where fewer do, and gone where none do (a budget over no routed head is refused)."""
    config = small_config(schedule="R", router_per_token=False, router_global_heads=3)  # 2 layers x 2 heads
    assert config.with_schedule("LR").router_global_heads == 2
    assert config.with_schedule("RR").router_global_heads == 3
    dense = config.with_schedule("G")
    assert dense.layer_letters == "GG" and dense.router_global_heads == 0
    assert dense.n_embd == config.n_embd and dense.router_per_token is False  # the shape and the rest kept
