"""kernels/layer.py, one layer's attention: the local output a router reads is computed once and gives the same
outputs and gradients as the routed kernel computing its own, and the query-key pairs it reports are those its
kernels computed (sequence and decode); heads committed to a path (paths=) compute only that path, with the
outputs and gradients of the same decisions routed; 'sampled' mode gives exact mode's outputs and weight
gradients, and the router's gradient from its exact sequences only, scaled up."""
import pytest
import torch

import kernels.layer
from kernels import torch_attention
from kernels.attention import attention
from kernels.layer import exact_rows, keys_read, layer_attention, sequence_keys
from model import KVCache
from test_torch_attention import make_inputs


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("mode", ["exact", "sparse"])
def test_routed_attention_given_the_local_output_equals_the_one_computing_it(backend, mode):
    q, k, v, gate = make_inputs(T=48, gate_frac=0.4)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(3), dtype=q.dtype)

    def run(given):
        local = attention(q, k, v, kind="local", window=8, n_sink=2, backend=backend) if given else None
        out = attention(q, k, v, kind="routed", window=8, n_sink=2, gate=gate, mode=mode, backend=backend,
                        local=local)
        return (out, *torch.autograd.grad(out, (q, k, v, gate), grad_out))

    for name, a, b in zip(("out", "dq", "dk", "dv", "dgate"), run(True), run(False)):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f"{name} differs")
    with pytest.raises(ValueError, match="local= is the routed layer's local output"):
        attention(q, k, v, kind="local", window=8, local=q)


def test_a_router_that_reads_the_local_output_has_it_computed_once(monkeypatch):
    """Sparse mode once computed the local output for the router and again inside the routed kernel."""
    q, k, v, _ = make_inputs(T=40)
    calls = []
    original = torch_attention._local_forward  # every local output of the torch backend, alone or in a kernel
    monkeypatch.setattr(torch_attention, "_local_forward", lambda *a, **kw: calls.append(1) or original(*a, **kw))

    def route(local, token):
        hard = local[..., 0] > 0
        return hard, hard.to(q.dtype), None

    for mode in ("exact", "sparse"):
        calls.clear()
        out = layer_attention(q, k, v, "routed", 8, route=route, sees_local=True, mode=mode, backend="torch")
        assert len(calls) == 1 and out.y.shape == q.shape


@pytest.mark.parametrize("kind, mode", [("dense", "exact"), ("local", "exact"), ("routed", "exact"),
                                        ("routed", "sparse")])
def test_the_reported_pairs_are_what_the_kernels_computed(kind, mode):
    B, H, T, window, n_sink = 2, 3, 40, 8, 2
    q, k, v, gate = make_inputs(B=B, H=H, T=T, gate_frac=0.25)
    hard = gate.detach() > 0.5

    def route(local, token):
        return hard, gate, None

    out = layer_attention(q, k, v, kind, window, n_sink, route=route, mode=mode, backend="torch")
    dense = torch.arange(1, T + 1, dtype=torch.float64)  # causal: query t reads t + 1 keys
    local = keys_read("local", T, window, n_sink).double()
    want = {"dense": B * H * dense.sum(), "local": B * H * local.sum(),
            "exact": B * H * (local.sum() + dense.sum()),
            "sparse": B * H * local.sum() + (hard.double() * dense).sum()}[kind if kind != "routed" else mode]
    assert out.keys.item() == pytest.approx(want.item())
    assert sequence_keys(kind, hard if kind == "routed" else None, mode, T, window, n_sink, B, H).item() == \
        pytest.approx(want.item())


def test_decode_reports_the_keys_each_new_token_read():
    """A routed layer's decode step reads its window for every head and the whole cache for the global ones;
    a dense layer the whole cache."""
    B, H, D, window = 1, 2, 8, 4
    q, k, v, _ = make_inputs(B=B, H=H, T=12, D=D)
    q, k, v = q.detach(), k.detach(), v.detach()
    hard = torch.zeros(B, H, 12, dtype=torch.bool)
    hard[0, 1, 10] = True  # token 10, head 1 goes global

    def route(local, token):
        return hard[:, :, 10:], hard[:, :, 10:].double(), None

    for kind, want in (("dense", B * H * (11 + 12)), ("routed", B * H * window * 2 + 11)):
        cache = KVCache(kind, 12, window, 0)
        layer_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], kind, window, route=lambda l, t: (
            hard[:, :, :10], hard[:, :, :10].double(), None), cache=cache)  # the prefill fills the cache
        out = layer_attention(q[:, :, 10:], k[:, :, 10:], v[:, :, 10:], kind, window, route=route, cache=cache)
        assert out.keys.item() == want, kind
        assert kernels.layer.decode_gathers(q) is False


def committed_route(paths, B, H, T, seed=0, sees_local=False):
    """A route function built as model.Router builds its gates: committed heads decide their path with a gate
    that carries no gradient, routed heads decide at random with the straight-through gate of p (a leaf)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(B, H, T, generator=g).requires_grad_()
    hard = torch.rand(B, H, T, generator=g) < 0.4
    committed = torch.tensor([path != -1 for path in paths]).view(1, H, 1)
    hard = torch.where(committed, torch.tensor([path == 1 for path in paths]).view(1, H, 1), hard)

    def route(local, token):
        assert (local is not None) == sees_local and token is None
        gate = torch.where(committed, hard.float(), hard.float() + p - p.detach())
        return hard, gate, p

    return route, p


@pytest.mark.parametrize("sees_local", [False, True])
@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("mode", ["exact", "sparse"])
def test_committed_heads_give_the_outputs_and_gradients_of_the_routed_call(mode, backend, sees_local):
    """Heads committed to global (0) and local (1) run dense and local attention alone, the others the routed
    kernel: the same outputs and gradients (the routed heads' p included) as every head routed with the same
    decisions."""
    paths, B, H, T, window, n_sink = (1, 0, -1, -1), 2, 4, 48, 8, 2
    q, k, v, _ = make_inputs(B=B, H=H, T=T, dtype=torch.float32)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))

    def run(given):
        route, p = committed_route(paths, B, H, T, sees_local=sees_local)
        out = layer_attention(q, k, v, "routed", window, n_sink, route=route, sees_local=sees_local, mode=mode,
                              backend=backend, paths=paths if given else None)
        return out, (out.y, *torch.autograd.grad(out.y, (q, k, v, p), grad_out))

    (split, split_grads), (whole, whole_grads) = run(True), run(False)
    for name, a, b in zip(("y", "dq", "dk", "dv", "dp"), split_grads, whole_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"{name} differs")
    assert split_grads[-1][:, 2:].abs().sum() > 0  # the routed heads' gradient reached p (it is compared above)
    assert torch.equal(split.hard, whole.hard) and torch.equal(split.p, whole.p)
    assert split.keys < whole.keys if mode == "exact" else split.keys <= whole.keys


def test_committed_heads_run_only_their_path(monkeypatch):
    """One call per group of heads: the global head dense, the local head local, the two routed heads the
    routed kernel with their own gates."""
    q, k, v, _ = make_inputs(B=2, H=4, T=40)
    route, _ = committed_route((-1, 1, -1, 0), 2, 4, 40)
    calls = []
    monkeypatch.setattr("kernels.layer.attention", lambda q, k, v, kind, gate=None, **kw: calls.append(
        (kind, q.shape[1], None if gate is None else gate.shape[1])) or attention(q, k, v, kind, gate=gate, **kw))
    layer_attention(q, k, v, "routed", 8, 2, route=route, mode="exact", backend="torch", paths=(-1, 1, -1, 0))
    assert sorted(calls) == [("dense", 1, None), ("local", 1, None), ("routed", 2, 2)]


def test_a_router_that_reads_the_local_output_has_it_computed_once_with_committed_heads(monkeypatch):
    """The local heads reuse the local output the router read, and the routed heads get their part of it."""
    q, k, v, _ = make_inputs(B=2, H=4, T=40)
    paths = (1, 0, -1, -1)
    calls = []
    original = torch_attention._local_forward
    monkeypatch.setattr(torch_attention, "_local_forward", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    for mode in ("exact", "sparse"):
        calls.clear()
        route, _ = committed_route(paths, 2, 4, 40, sees_local=True)
        out = layer_attention(q, k, v, "routed", 8, 2, route=route, sees_local=True, mode=mode, backend="torch",
                              paths=paths)
        assert len(calls) == 1
        local = attention(q, k, v, kind="local", window=8, n_sink=2, backend="reference")
        torch.testing.assert_close(out.y[:, 1], local[:, 1])  # the committed local head's output is its window's


def test_committed_heads_count_only_the_keys_of_their_path():
    B, H, T, window, n_sink = 2, 4, 40, 8, 2
    q, k, v, _ = make_inputs(B=B, H=H, T=T)
    dense = torch.arange(1, T + 1, dtype=torch.float64).sum()
    local = keys_read("local", T, window, n_sink).double().sum()

    def keys(paths, mode="exact"):
        route, _ = committed_route(paths or (-1,) * H, B, H, T)
        out = layer_attention(q, k, v, "routed", window, n_sink, route=route, mode=mode, backend="torch",
                              paths=paths)
        assert out.keys.item() == sequence_keys("routed", out.hard, mode, T, window, n_sink, paths=paths).item()
        return out.keys.item()

    assert keys((1, 0, 0, 0)) == pytest.approx((B * (dense + 3 * local)).item())
    assert keys((1, 0, 0, 0)) < keys(None) == pytest.approx((B * H * (dense + local)).item())
    assert keys((-1, -1, -1, -1)) == keys(None)
    # a routed head among committed ones counts what the routed kernel computed for it, in its mode
    route, _ = committed_route((1, -1, 0, 0), B, H, T)
    out = layer_attention(q, k, v, "routed", window, n_sink, route=route, mode="sparse", backend="torch",
                          paths=(1, -1, 0, 0))
    routed = B * local + (out.hard[:, 1].double() * torch.arange(1, T + 1, dtype=torch.float64)).sum()
    assert out.keys.item() == pytest.approx((B * dense + routed + 2 * B * local).item())


def test_every_head_routed_is_the_call_without_paths():
    q, k, v, _ = make_inputs(B=2, H=4, T=40)
    route, _ = committed_route((-1,) * 4, 2, 4, 40)
    a, b = (layer_attention(q, k, v, "routed", 8, 2, route=route, mode="sparse", backend="torch", paths=paths)
            for paths in (None, (-1, -1, -1, -1)))
    assert torch.equal(a.y, b.y) and torch.equal(a.hard, b.hard) and a.p is b.p and torch.equal(a.keys, b.keys)


@pytest.mark.parametrize("kind, paths, message", [
    ("routed", (1, 0, -1), "one path per head"), ("routed", (1, 0, -1, 2), "one path per head"),
    ("routed", (1, 0, -1, True), "one path per head"), ("routed", 1, "one path per head"),
    ("dense", (1, 1, 1, 1), "a dense layer takes paths=None"), ("local", (0, 0, 0, 0), "a local layer takes")])
def test_paths_are_refused_where_they_mean_nothing(kind, paths, message):
    q, k, v, _ = make_inputs(B=1, H=4, T=16)
    route, _ = committed_route((-1,) * 4, 1, 4, 16)
    with pytest.raises(ValueError, match=message):
        layer_attention(q, k, v, kind, 8, route=route, paths=paths)


@pytest.mark.parametrize("sees_local", [False, True])
def test_decode_with_committed_heads_is_decode_without_paths(sees_local):
    """Decode already reads only the window for a local decision, and a committed head's decision is its path:
    the same outputs and keys with paths as without."""
    B, H, T, window, paths = 1, 4, 14, 4, (1, 0, -1, -1)
    q, k, v, _ = make_inputs(B=B, H=H, T=T)
    q, k, v = q.detach(), k.detach(), v.detach()
    route, _ = committed_route(paths, B, H, T, sees_local=False)
    hard = route(None, None)[0]

    def decode_route(local, token):  # the decisions of the new tokens 10 .. 13
        part = hard[:, :, 10:] if token is None else hard[:, :, 10 + token:11 + token]
        return part, part.double(), None

    outs = []
    for given in (paths, None):
        cache = KVCache("routed", T, window, 1)
        layer_attention(q[:, :, :10], k[:, :, :10], v[:, :, :10], "routed", window, 1, mode="sparse",
                        route=lambda l, t: (hard[:, :, :10], hard[:, :, :10].double(), None),
                        sees_local=sees_local, cache=cache, paths=given)
        outs.append(layer_attention(q[:, :, 10:], k[:, :, 10:], v[:, :, 10:], "routed", window, 1,
                                    route=decode_route, sees_local=sees_local, cache=cache, paths=given))
    a, b = outs
    assert torch.equal(a.y, b.y) and torch.equal(a.hard, b.hard) and a.keys.item() == b.keys.item()
    # every head its window and sink, the global decisions (head 0's all) every key
    want = B * H * keys_read("local", T, window, 1)[10:].sum() + (a.hard.sum((0, 1)) * torch.arange(11, T + 1)).sum()
    assert a.keys.item() == want.item()
    assert a.hard[:, 0].all() and not a.hard[:, 1].any()


def test_exact_rows_takes_a_share_of_the_batch_and_at_least_one():
    assert [exact_rows(4, frac) for frac in (0.01, 0.25, 0.5, 1.0)] == [1, 1, 2, 4]
    assert exact_rows(8, 0.125) == 1 and exact_rows(8, 0.3) == 2 and exact_rows(1, 0.25) == 1


@pytest.mark.parametrize("paths", [None, (1, 0, -1, -1)])
@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("exact_frac, n", [(0.25, 1), (0.5, 2), (1.0, 4)])
def test_sampled_mode_is_exact_with_the_router_gradient_of_its_exact_sequences(exact_frac, n, backend, paths):
    """The same outputs and q, k, v gradients as exact mode (both modes' weight gradients are those of the
    decisions); the router's gradient (dp) is exact mode's on the first n sequences times B / n and zero on the
    others, so its expectation over which sequences come first is exact mode's."""
    B, H, T, window, n_sink = 4, 4, 40, 8, 2
    q, k, v, _ = make_inputs(B=B, H=H, T=T, dtype=torch.float32)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))

    def run(mode):
        route, p = committed_route(paths or (-1,) * H, B, H, T)
        out = layer_attention(q, k, v, "routed", window, n_sink, route=route, mode=mode, backend=backend,
                              paths=paths, exact_frac=exact_frac)
        return out, (out.y, *torch.autograd.grad(out.y, (q, k, v, p), grad_out))

    (sampled, (y, dq, dk, dv, dp)), (exact, (y_e, dq_e, dk_e, dv_e, dp_e)) = run("sampled"), run("exact")
    for name, a, b in (("y", y, y_e), ("dq", dq, dq_e), ("dk", dk, dk_e), ("dv", dv, dv_e),
                       ("dp of the exact sequences", dp[:n], dp_e[:n] * (B / n))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"{name} differs")
    assert dp[n:].abs().sum() == 0 and dp_e[n:].abs().sum() > 0 if n < B else True
    assert dp[:n].abs().sum() > 0
    hard = sampled.hard
    want = sequence_keys("routed", hard[:n], "exact", T, window, n_sink, paths=paths) + (
        sequence_keys("routed", hard[n:], "sparse", T, window, n_sink, paths=paths) if n < B else 0)
    assert sampled.keys.item() == pytest.approx(float(want))
    assert sequence_keys("routed", hard, "sampled", T, window, n_sink, paths=paths,
                         exact_frac=exact_frac).item() == pytest.approx(float(want))
    sparse_keys = sequence_keys("routed", hard, "sparse", T, window, n_sink, paths=paths)
    assert sparse_keys < sampled.keys <= exact.keys and (sampled.keys < exact.keys) == (n < B)
