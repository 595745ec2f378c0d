"""kernels/layer.py, one layer's attention: the local output a router reads is computed once and gives the same
outputs and gradients as the routed kernel computing its own, and the query-key pairs it reports are those its
kernels computed (sequence and decode)."""
import pytest
import torch

import kernels.layer
from kernels import torch_attention
from kernels.attention import attention
from kernels.layer import keys_read, layer_attention, sequence_keys
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
