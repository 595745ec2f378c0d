"""kernels/torch_attention.py against kernels/reference.py, and the reference's own semantics."""
import pytest
import torch

from kernels import reference, torch_attention
from kernels.attention import attention
from kernels.gates import combine, combine_rows, compact_gates

KINDS = [("local", "exact"), ("routed", "exact"), ("routed", "sparse")]  # (kind, routed mode)


def make_inputs(B=2, H=3, T=64, D=8, gate_frac=0.3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    gate = (torch.rand(B, H, T, generator=g) < gate_frac).to(dtype).requires_grad_()
    return q, k, v, gate


def efficient(q, k, v, kind, window, n_sink=0, gate=None, mode="exact"):
    if kind == "dense":
        return torch_attention.dense_attention(q, k, v)
    if kind == "local":
        return torch_attention.local_attention(q, k, v, window, n_sink)
    return torch_attention.routed_attention(q, k, v, gate, window, n_sink, mode)


def outputs_and_grads(fn, q, k, v, gate, kind, window, n_sink, mode, seed=1):
    out = fn(q, k, v, kind, window, n_sink, gate, mode)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    inputs = (q, k, v, gate) if kind == "routed" else (q, k, v)
    return (out, *torch.autograd.grad(out, inputs, grad_out))


def assert_matches_reference(q, k, v, gate, kind, window, n_sink, mode, atol):
    got = outputs_and_grads(efficient, q, k, v, gate, kind, window, n_sink, mode)
    want = outputs_and_grads(reference.reference_attention, q, k, v, gate, kind, window, n_sink, mode)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dgate"), got, want):
        torch.testing.assert_close(a, b, atol=atol, rtol=atol, msg=f"{name} differs")


# (T, window, n_sink, gate_frac): T mostly a multiple of no chunk size (local chunks are min(window, 64)),
# windows above the local chunk size, T below the window, sinks up to the window, no and all tokens gated;
# gated rows' key blocks (512 keys) and local kernel calls of a few chunks are tested apart below
CASES = [
    (300, 16, 0, 0.3),
    (300, 16, 5, 0.3),
    (300, 16, 16, 0.3),
    (10, 16, 4, 0.5),
    (1, 8, 1, 1.0),
    (400, 160, 0, 0.2),
    (500, 200, 150, 0.1),
    (150, 200, 150, 0.2),
    (257, 128, 3, 0.1),
    (256, 128, 0, 0.2),
    (100, 8, 2, 0.0),
    (100, 8, 2, 1.0),
]


@pytest.mark.parametrize("kind,mode", KINDS)
@pytest.mark.parametrize("T,window,n_sink,gate_frac", CASES)
def test_matches_reference_float64(kind, mode, T, window, n_sink, gate_frac):
    q, k, v, gate = make_inputs(T=T, gate_frac=gate_frac)
    assert_matches_reference(q, k, v, gate, kind, window, n_sink, mode, atol=1e-10)


@pytest.mark.parametrize("kind,mode", KINDS)
def test_matches_reference_float32(kind, mode):
    q, k, v, gate = make_inputs(B=2, H=4, T=400, D=32, gate_frac=0.1, dtype=torch.float32)
    assert_matches_reference(q, k, v, gate, kind, 128, 4, mode, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind,mode", KINDS)
def test_runs_in_half_precision(kind, mode, dtype):
    q, k, v, gate = make_inputs(T=200, D=16, dtype=dtype)
    assert_matches_reference(q, k, v, gate, kind, 32, 2, mode, atol=5e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind,mode", [("local", "exact"), ("routed", "sparse")])
def test_masked_attention_of_half_precision_inputs_runs_in_float32_on_cpu(kind, mode, dtype):
    """Local and gated attention of 16-bit inputs on the CPU is the fp32 computation of the same inputs,
    rounded once at the end, gradients included (the fused kernel with a mask is slow in bf16)."""
    q, k, v, gate = make_inputs(T=200, D=16, dtype=dtype, seed=4)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    wide = [x.detach().float().requires_grad_() for x in (q, k, v, gate)]
    inputs = (q, k, v, gate) if kind == "routed" else (q, k, v)
    got, want = ((efficient(*x[:3], kind, 32, 2, x[3], mode), x[:len(inputs)]) for x in ((q, k, v, gate), wide))
    got_grads = torch.autograd.grad(got[0], got[1], grad_out)
    want_grads = torch.autograd.grad(want[0], want[1], grad_out.float())
    for name, a, b in zip(("out", "dq", "dk", "dv", "dgate"), (got[0], *got_grads), (want[0], *want_grads)):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a, b.to(dtype), atol=0, rtol=0, msg=f"{name} differs")


@pytest.mark.parametrize("kind,mode", KINDS)
@pytest.mark.parametrize("T,window,n_sink,gate_frac",
                         [(300, 16, 5, 0.3), (500, 200, 150, 0.1), (10, 16, 4, 0.5)])
def test_matmul_fallback_matches_reference(monkeypatch, kind, mode, T, window, n_sink, gate_frac):
    """attend / attend_backward as on devices without the fused CPU kernel."""
    monkeypatch.setattr(torch_attention, "_cpu_kernel", lambda x: False)
    q, k, v, gate = make_inputs(T=T, gate_frac=gate_frac)
    assert_matches_reference(q, k, v, gate, kind, window, n_sink, mode, atol=1e-10)


@pytest.mark.parametrize("key_block", [pytest.param(1, marks=pytest.mark.slow), 7, 64, 1000])
def test_gated_key_blocks_of_any_size(monkeypatch, key_block):
    """Blocks of one key (every row's last block masked), blocks that some rows read none of, one block."""
    monkeypatch.setattr(torch_attention, "GATED_KEY_BLOCK", key_block)
    q, k, v, gate = make_inputs(T=300, gate_frac=0.2)
    assert_matches_reference(q, k, v, gate, "routed", 16, 2, "sparse", atol=1e-10)


@pytest.mark.parametrize("call_size", [1, 4000, 70000])
@pytest.mark.parametrize("kind,mode", [("local", "exact"), ("routed", "sparse")])
@pytest.mark.parametrize("T,window,n_sink", [(300, 16, 5), (500, 200, 150)])
def test_local_chunks_in_several_calls(monkeypatch, call_size, kind, mode, T, window, n_sink):
    """One chunk per kernel call, or a few: the windows' gradients folded across calls."""
    monkeypatch.setattr(torch_attention, "LOCAL_CALL_SIZE", call_size)
    q, k, v, gate = make_inputs(T=T)
    assert_matches_reference(q, k, v, gate, kind, window, n_sink, mode, atol=1e-10)


@pytest.mark.parametrize("mode", ["exact", "sparse"])
def test_routed_with_one_head_never_gated(mode):
    q, k, v, gate = make_inputs(T=200)
    with torch.no_grad():
        gate[0, 1] = 0  # its gated rows are all padding (position 0) in the sparse path
    assert_matches_reference(q, k, v, gate, "routed", 16, 2, mode, atol=1e-10)


@pytest.mark.parametrize("given_local", [False, True])
@pytest.mark.parametrize("pattern", ["all, none, some", "none, all, all", "some, some, none", "all, all, all"])
def test_sparse_heads_with_every_token_or_none_gated(pattern, given_local, monkeypatch):
    """A per-head router's gates: heads with every token gated run dense attention, heads with none their window
    alone (no compacted rows), the others the compacted rows; outputs and gradients as the reference's."""
    q, k, v, gate = make_inputs(B=2, H=3, T=200, gate_frac=0.3)
    with torch.no_grad():
        for h, which in enumerate(pattern.split(", ")):
            if which != "some":
                gate[:, h] = 1.0 if which == "all" else 0.0
    compacted = []
    original = torch_attention.compact_gates
    monkeypatch.setattr(torch_attention, "compact_gates", lambda g: compacted.append(g.shape[1]) or original(g))

    def efficient_given(q, k, v, kind, window, n_sink, gate, mode):
        local = torch_attention.local_attention(q, k, v, window, n_sink) if given_local else None
        return torch_attention.routed_attention(q, k, v, gate, window, n_sink, mode, local)

    got = outputs_and_grads(efficient_given, q, k, v, gate, "routed", 16, 2, "sparse")
    want = outputs_and_grads(reference.reference_attention, q, k, v, gate, "routed", 16, 2, "sparse")
    for name, a, b in zip(("out", "dq", "dk", "dv", "dgate"), got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=f"{name} differs")
    assert compacted == ([pattern.count("some")] if "some" in pattern else [])  # only mixed heads are compacted


def test_dense_matches_reference():
    q, k, v, gate = make_inputs(T=100)
    assert_matches_reference(q, k, v, gate, "dense", None, 0, "exact", atol=1e-10)


# --- semantics of the reference itself (the conventions in its docstring, kernels/reference.py) ---

def reference_out(q, k, v, kind, window=8, n_sink=0, gate=None, mode="exact"):
    with torch.no_grad():
        return reference.reference_attention(q, k, v, kind, window, n_sink, gate, mode)


@pytest.mark.parametrize("kind,mode", [("dense", "exact")] + KINDS)
@pytest.mark.parametrize("n_sink", [0, 3])
def test_causal(kind, mode, n_sink):
    q, k, v, gate = make_inputs(T=40)
    before = reference_out(q, k, v, kind, 8, n_sink, gate, mode)
    t = 20
    for i in range(3):  # q, k, v
        changed = [y.detach().clone() for y in (q, k, v)]
        changed[i][:, :, t + 1:] += 1.0
        after = reference_out(*changed, kind, 8, n_sink, gate, mode)
        torch.testing.assert_close(after[:, :, :t + 1], before[:, :, :t + 1], atol=0, rtol=0)
        assert not torch.equal(after[:, :, t + 1:], before[:, :, t + 1:])


@pytest.mark.parametrize("x", ["k", "v"])
def test_local_reads_exactly_the_window(x):
    q, k, v, _ = make_inputs(T=40)
    window, t = 8, 30
    before = reference_out(q, k, v, "local", window)

    def changed_at(s):
        inputs = {"q": q.detach(), "k": k.detach().clone(), "v": v.detach().clone()}
        inputs[x][:, :, s] += 1.0
        return reference_out(inputs["q"], inputs["k"], inputs["v"], "local", window)[:, :, t]

    torch.testing.assert_close(changed_at(t - window), before[:, :, t], atol=0, rtol=0)  # just outside
    for s in (t - window + 1, t):  # oldest and newest key inside
        assert not torch.allclose(changed_at(s), before[:, :, t])


def test_local_sees_sinks():
    q, k, v, _ = make_inputs(T=40)
    window, n_sink, t = 8, 2, 30
    before = reference_out(q, k, v, "local", window, n_sink)

    def changed_at(s):
        changed_v = v.detach().clone()
        changed_v[:, :, s] += 1.0
        return reference_out(q, k, changed_v, "local", window, n_sink)[:, :, t]

    assert not torch.allclose(changed_at(n_sink - 1), before[:, :, t])  # the last sink, far outside
    torch.testing.assert_close(changed_at(n_sink), before[:, :, t], atol=0, rtol=0)  # first non-sink


@pytest.mark.parametrize("mode", ["exact", "sparse"])
@pytest.mark.parametrize("n_sink", [0, 3])
def test_routed_all_gates_one_is_dense_and_zero_is_local(mode, n_sink):
    q, k, v, gate = make_inputs(T=40)
    ones, zeros = torch.ones_like(gate), torch.zeros_like(gate)
    torch.testing.assert_close(reference_out(q, k, v, "routed", 8, n_sink, ones, mode),
                               reference_out(q, k, v, "dense"), atol=1e-12, rtol=0)
    torch.testing.assert_close(reference_out(q, k, v, "routed", 8, n_sink, zeros, mode),
                               reference_out(q, k, v, "local", 8, n_sink), atol=0, rtol=0)


def test_compact_gates_positions():
    """Each (batch, head)'s gated positions in order, right-aligned, padded at the front with position 0."""
    gated = torch.rand(2, 3, 50, generator=torch.Generator().manual_seed(0)) < 0.3
    gated[0, 1] = False  # a (batch, head) with no gated token
    pos, valid = compact_gates(gated)
    M = int(gated.sum(-1).max())
    assert pos.shape == valid.shape == (2, 3, M)
    for b in range(2):
        for h in range(3):
            expected = gated[b, h].nonzero().flatten()
            padding = M - len(expected)
            assert torch.equal(pos[b, h], torch.cat([expected.new_zeros(padding), expected]))
            assert torch.equal(valid[b, h], torch.arange(M) >= padding)
    pos, valid = compact_gates(torch.zeros(1, 2, 5, dtype=torch.bool))  # nothing gated: one padding row
    assert pos.shape == (1, 2, 1) and not valid.any()


def test_combine_rows_is_combine_on_the_gated_rows():
    q, k, v, gate = make_inputs(T=30, gate_frac=0.4)
    local, full = torch.randn(2, 3, 30, 8, dtype=torch.float64), torch.randn(2, 3, 30, 8, dtype=torch.float64)
    pos, valid = compact_gates(gate.detach() > 0.5)
    full_rows = full.gather(2, pos.unsqueeze(-1).expand(*pos.shape, 8))
    out = combine_rows(local, full_rows, gate, pos, valid)[0]
    torch.testing.assert_close(out, combine(local, full, gate, only_gated=True))
    torch.testing.assert_close(out, combine(local, full, gate))  # the same forward values


BACKENDS = ["reference", "torch", "triton"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="local", window=None), "window=None"),
    (dict(kind="local", window=0), "window=0"),
    (dict(kind="routed", window=4, n_sink=-1), "n_sink=-1"),
    (dict(kind="local", window=4, n_sink=5), "n_sink=5 must be an integer between 0 and window=4"),
    (dict(kind="routed", window=4), "needs a gate"),
    (dict(kind="local", window=4, T=0), "empty sequence"),
    (dict(kind="local", window=4, kv_heads=1), "grouped-query"),
    (dict(kind="dense", kv_heads=1), "grouped-query"),
    (dict(kind="sliding", window=4), "unknown attention kind"),
])
def test_bad_arguments_get_the_same_clear_error_on_every_backend(backend, kwargs, message):
    kwargs = dict(kwargs)
    T, kv_heads = kwargs.pop("T", 8), kwargs.pop("kv_heads", 2)
    q = torch.randn(1, 2, T, 16)
    k = v = torch.randn(1, kv_heads, T, 16)
    with pytest.raises(ValueError, match=message):
        attention(q, k, v, backend=backend, **kwargs)


@pytest.mark.parametrize("kind,mode", KINDS)
def test_strided_inputs_that_need_no_padding(kind, mode):
    """(B, T, H, D) storage seen as (B, H, T, D), T a multiple of the local chunk: no copy made by padding."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 2, 16, generator=g, dtype=torch.float64).transpose(1, 2) for _ in range(3))
    gate = (torch.rand(2, 2, 8, generator=g) < 0.5).double()
    got = attention(q, k, v, kind=kind, window=4, gate=gate, mode=mode, backend="torch")
    want = attention(q, k, v, kind=kind, window=4, gate=gate, mode=mode, backend="reference")
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kind,mode", KINDS)
def test_matmul_fallback_in_bfloat16_computes_softmax_in_float32(monkeypatch, kind, mode):
    """The plain-matmul path in bf16 against the fp64 reference of the same (rounded) inputs, with the
    tolerance of the fused CPU path."""
    q, k, v, gate = make_inputs(T=200, D=16, dtype=torch.bfloat16, seed=3)
    fused = outputs_and_grads(efficient, q, k, v, gate, kind, 32, 2, mode)
    monkeypatch.setattr(torch_attention, "_cpu_kernel", lambda x: False)
    plain = outputs_and_grads(efficient, q, k, v, gate, kind, 32, 2, mode)
    wide = [x.detach().double().requires_grad_() for x in (q, k, v, gate)]
    want = outputs_and_grads(reference.reference_attention, *wide, kind, 32, 2, mode)
    for name, f, p, w in zip(("out", "dq", "dk", "dv", "dgate"), fused, plain, want):
        fused_err = (f.double() - w).abs().max().item()
        plain_err = (p.double() - w).abs().max().item()
        assert plain_err <= max(2 * fused_err, 1e-2), f"{name}: plain {plain_err:.2e}, fused {fused_err:.2e}"
