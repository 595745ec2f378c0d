"""Triton attention kernels against the explicit-mask reference: forward and every gradient (q, k, v, gate).

Without CUDA the kernels run in Triton's interpreter on the CPU, which is slow, so shapes are small; the
interpreter uses 16-wide tiles (kernels/triton_common.py) so these shapes still span many tiles. The
interpreter computes tl.dot wrongly on bf16 operands, so bf16 runs only on a GPU (tests/conftest.py switches
to the interpreter when there is no CUDA). Inputs are random, seeded from the test's id: a failure repeats, and
its message names the seed.
"""
import zlib

import pytest
import torch

from kernels import (
    reference,
    triton_attention,
    triton_common,
    triton_global,
    triton_local,
)
from kernels.attention import attention, resolve_backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 2e-4, torch.float16: 1e-2, torch.bfloat16: 6e-2}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.skipif(
              DEVICE != "cuda", reason="the Triton interpreter computes tl.dot wrongly on bf16; GPU only"))]


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Kernel outputs start as NaN, so any element a kernel forgets to write fails the comparison."""
    monkeypatch.setattr(triton_common, "poison_buffers", True)


def seed_of(nodeid):
    return zlib.crc32(nodeid.encode())


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id (parameters included): the same inputs on every run."""
    return torch.Generator().manual_seed(seed_of(request.node.nodeid))


def test_seeds_repeat_and_differ_between_tests(rng, request):
    assert rng.initial_seed() == seed_of(request.node.nodeid)
    assert seed_of("tests/test_triton_attention.py::test_local_fp32[a]") != seed_of(
        "tests/test_triton_attention.py::test_local_fp32[b]")


def test_kernels_run_in_the_interpreter_exactly_without_cuda():
    """tests/conftest.py sets TRITON_INTERPRET=1 without CUDA before the kernels are defined: set later, the
    kernels would be compiled ones whatever the variable says."""
    from triton.runtime.interpreter import InterpretedFunction
    kernels = [getattr(module, name) for module in (triton_local, triton_global, triton_common)
               for name in dir(module) if name.endswith("_kernel")]
    assert len(kernels) >= 3
    interpreted = triton_common.interpreting()
    assert interpreted or DEVICE == "cuda", "without CUDA, tests/conftest.py must set TRITON_INTERPRET=1"
    assert [k for k in kernels if isinstance(k, InterpretedFunction) != interpreted] == []


def make_inputs(rng, B, H, T, D, dtype, global_fraction=0.3, transposed=False):
    def tensor(*shape):
        return torch.randn(*shape, generator=rng).to(DEVICE)

    if transposed:  # (B, T, H, D) storage seen as (B, H, T, D), as a model's head split produces it
        q, k, v = (tensor(B, T, H, D).to(dtype).transpose(1, 2) for _ in range(3))
    else:
        q, k, v = (tensor(B, H, T, D).to(dtype) for _ in range(3))
    gate = (torch.rand(B, H, T, generator=rng) < global_fraction).float().to(DEVICE)
    return q, k, v, gate, tensor(B, H, T, D).to(dtype)


def outputs_and_grads(fn, inputs, grad_out):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*leaves)
    out.backward(grad_out)
    return [out.detach()] + [x.grad for x in leaves]


def assert_matches_reference(rng, q, k, v, gate, grad_out, kind, window, n_sink, mode="exact"):
    """Compares the output and the gradients of q, k, v (and of the gate, for routed attention)."""
    if kind == "local":
        inputs = (q, k, v)

        def triton_fn(q, k, v):
            return triton_attention.local_attention(q, k, v, window, n_sink)

        def reference_fn(q, k, v):
            return reference.reference_attention(q, k, v, "local", window, n_sink)
    else:
        inputs = (q, k, v, gate)

        def triton_fn(q, k, v, gate):
            return triton_attention.routed_attention(q, k, v, gate, window, n_sink, mode)

        def reference_fn(q, k, v, gate):
            return reference.reference_attention(q, k, v, "routed", window, n_sink, gate, mode)

    got = outputs_and_grads(triton_fn, inputs, grad_out)
    # ground truth in fp32 from the same (rounded) inputs
    want = outputs_and_grads(reference_fn, [x.float() for x in inputs], grad_out.float())
    tol = TOLERANCE[q.dtype]
    for name, g, w in zip(("out", "dq", "dk", "dv", "dgate"), got, want):
        context = f"{name}: seed {rng.initial_seed()}, kind {kind}, mode {mode}, window {window}, n_sink {n_sink}"
        assert not g.isnan().any(), f"NaN (unwritten or broken) in {context}"
        # the gate gradient sums D products per token, so it gets a proportionally wider band
        scale = q.shape[-1] ** 0.5 if name == "dgate" else 1.0
        torch.testing.assert_close(g.float(), w, atol=tol * scale, rtol=tol, msg=lambda m: f"{context}\n{m}")


# Shapes are written in tiles (16 under the interpreter, 32 compiled for the fp32 these cases use) so that the
# off-by-one edges of the loop bounds land on tile boundaries on both.
TILE = triton_common.launch_config(64, torch.float32)["BLOCK_M"]
LOCAL_CASES = [  # B, H, T, D, window, n_sink
    (1, 2, 2 * TILE + 5, 16, TILE // 2, 0),    # T not a multiple of the tile, window smaller than a tile
    (2, 1, 50, 32, 4 * TILE, 0),               # T < window
    (1, 2, 3 * TILE + 13, 64, TILE - 1, 4),    # the first sink reached past the window sits on a tile edge
    (1, 1, 3 * TILE, 128, TILE + 2, TILE + 2), # a key tile's last query ends on a tile edge; n_sink = window
    (1, 1, TILE + 3, 16, 1, 0),                # window 1: every query sees only itself
    (1, 1, 1, 16, 4, 2),                       # a single token
]


@pytest.mark.parametrize("B,H,T,D,window,n_sink", LOCAL_CASES)
def test_local_fp32(rng, B, H, T, D, window, n_sink):
    q, k, v, gate, grad_out = make_inputs(rng, B, H, T, D, torch.float32)
    assert_matches_reference(rng, q, k, v, gate, grad_out, "local", window, n_sink)


@pytest.mark.parametrize("dtype", DTYPES)
def test_local_low_precision_and_strided(rng, dtype):
    q, k, v, gate, grad_out = make_inputs(rng, 2, 2, 53, 32, dtype, transposed=True)
    assert_matches_reference(rng, q, k, v, gate, grad_out, "local", 17, 3)


def gate_pattern(gate, pattern):
    """random (30% global, head 0 of batch 0 fully local) | all global | all local."""
    if pattern == "random":
        gate[0, 0] = 0.0
        return gate
    return torch.full_like(gate, 1.0 if pattern == "all_global" else 0.0)


ROUTED_CASES = [  # B, H, T, D, window, n_sink, gate pattern
    pytest.param(2, 2, 3 * TILE + 11, 16, TILE - 4, 0, "random"),
    (1, 2, 40, 32, 4 * TILE, 2, "random"),        # T < window
    pytest.param(1, 2, 4 * TILE + 3, 64, TILE + 2, 3, "random"),  # ~1.2 compacted global tiles per head
    (1, 2, 2 * TILE + 3, 128, TILE, 0, "random"),
    (2, 1, 45, 32, 10, 2, "all_global"),
    (1, 2, 45, 32, 10, 2, "all_local"),
]


@pytest.mark.parametrize("mode", ["sparse", "exact"])
@pytest.mark.parametrize("B,H,T,D,window,n_sink,pattern", ROUTED_CASES)
def test_routed_fp32(rng, mode, B, H, T, D, window, n_sink, pattern):
    q, k, v, gate, grad_out = make_inputs(rng, B, H, T, D, torch.float32)
    gate = gate_pattern(gate, pattern)
    assert_matches_reference(rng, q, k, v, gate, grad_out, "routed", window, n_sink, mode)


@pytest.mark.parametrize("mode", ["sparse", "exact"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_routed_low_precision_and_strided(rng, mode, dtype):
    q, k, v, gate, grad_out = make_inputs(rng, 2, 2, 57, 64, dtype, global_fraction=0.2, transposed=True)
    assert_matches_reference(rng, q, k, v, gate, grad_out, "routed", 11, 2, mode)


def test_routed_sparse_single_late_global_token(rng):
    """One gated query, the last, first in its key tile: its compacted tile must read every key tile, and every
    key tile gets dK/dV from it."""
    q, k, v, gate, grad_out = make_inputs(rng, 1, 1, 4 * TILE + 1, 16, torch.float32)
    gate = torch.zeros_like(gate)
    gate[..., -1] = 1.0
    assert_matches_reference(rng, q, k, v, gate, grad_out, "routed", 5, 0, "sparse")


@pytest.mark.parametrize("kind,mode", [("local", "exact"), ("routed", "exact"), ("routed", "sparse")])
def test_entry_point_triton_matches_torch(rng, kind, mode):
    q, k, v, gate, _ = make_inputs(rng, 2, 2, 48, 32, torch.float32)
    common = dict(kind=kind, window=10, n_sink=2, gate=gate, mode=mode)
    got = attention(q, k, v, backend="triton", **common)
    want = attention(q, k, v, backend="torch", **common)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4, msg=lambda m: f"seed {rng.initial_seed()}\n{m}")


def test_auto_backend_is_triton_exactly_on_cuda_with_a_supported_head_dim():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [resolve_backend("auto", cuda, d) for d in (16, 32, 64, 128)] == ["triton"] * 4
    assert resolve_backend("auto", cuda, 80) == "torch"
    assert resolve_backend("auto", cpu, 64) == "torch"


def test_rejects_unsupported_head_dim():
    q = torch.zeros(1, 1, 8, 24, device=DEVICE)
    with pytest.raises(ValueError, match="head dims"):
        triton_attention.local_attention(q, q, q, 4)


NAN_INPUTS = pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the interpreter's numpy notices


def poisoned(x, rows):
    """Copy of x with the given positions (dim 2) set to NaN: a kernel that reads them spreads NaN."""
    x = x.clone()
    x[:, :, rows] = float("nan")
    return x


@NAN_INPUTS
def test_local_reads_only_its_window_and_sinks(rng):
    """Work bounded by the window: NaN outside a tile's reach must not leak into that tile's results."""
    T, window, n_sink = 8 * TILE, TILE, 2
    q, k, v, _, grad_out = make_inputs(rng, 1, 2, T, 32, torch.float32)

    def local(q, k, v):
        return triton_attention.local_attention(q, k, v, window, n_sink)

    want = outputs_and_grads(lambda q, k, v: reference.reference_attention(q, k, v, "local", window, n_sink),
                             (q, k, v), grad_out)
    # the last query tile reads the sinks and key tiles 6, 7 only (forward and dQ)
    far_keys = slice(n_sink, 6 * TILE)
    out, dq, _, _ = outputs_and_grads(local, (q, poisoned(k, far_keys), poisoned(v, far_keys)), grad_out)
    last = slice(7 * TILE, T)
    torch.testing.assert_close(out[:, :, last], want[0][:, :, last], atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(dq[:, :, last], want[1][:, :, last], atol=2e-4, rtol=2e-4)
    # key tile 1 is in the window of queries up to 3 * TILE - 2 only (dK, dV)
    far_queries = slice(3 * TILE, T)
    _, _, dk, dv = outputs_and_grads(local, (poisoned(q, far_queries), k, v), poisoned(grad_out, far_queries))
    tile_1 = slice(TILE, 2 * TILE)
    torch.testing.assert_close(dk[:, :, tile_1], want[2][:, :, tile_1], atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(dv[:, :, tile_1], want[3][:, :, tile_1], atol=2e-4, rtol=2e-4)


@NAN_INPUTS
def test_sparse_global_skips_unreachable_tiles(rng):
    """Compacted global queries: a tile reads keys only up to its largest true position, and a key tile's
    dK/dV skips compacted tiles that end before it."""
    T, window = 8 * TILE, 4
    q, k, v, gate, grad_out = make_inputs(rng, 1, 1, T, 16, torch.float32)
    gate = torch.zeros_like(gate)
    gate[..., :TILE] = 1.0            # compacted tile 0: positions 0 .. TILE-1
    gate[..., 6 * TILE + 3] = 1.0     # compacted tile 1: one late position

    def routed(q, k, v, gate):
        return triton_attention.routed_attention(q, k, v, gate, window, 0, "sparse")

    want = outputs_and_grads(lambda q, k, v, g: reference.reference_attention(
        q, k, v, "routed", window, 0, g, "sparse"), (q, k, v, gate), grad_out)
    # keys past tile 1 are beyond every early global query (and beyond every early local window)
    late = slice(2 * TILE, T)
    out, dq, _, _, dgate = outputs_and_grads(routed, (q, poisoned(k, late), poisoned(v, late), gate), grad_out)
    early = slice(0, TILE)
    for got, expected in ((out, want[0]), (dq, want[1])):
        torch.testing.assert_close(got[:, :, early], expected[:, :, early], atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(dgate[..., early], want[4][..., early], atol=1e-3, rtol=2e-4)
    # key tile 3 must skip compacted tile 0, whose queries (and their gradients) are poisoned
    _, _, dk, dv, _ = outputs_and_grads(routed, (poisoned(q, early), k, v, gate), poisoned(grad_out, early))
    tile_3 = slice(3 * TILE, 4 * TILE)
    torch.testing.assert_close(dk[:, :, tile_3], want[2][:, :, tile_3], atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(dv[:, :, tile_3], want[3][:, :, tile_3], atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("mode", ["exact", "sparse"])
def test_training_path_matches_torch_backend(mode):
    """A tiny model's loss and every parameter gradient agree between the triton and torch backends."""
    from model import GPT, GPTConfig, router_penalty

    losses, grads = [], []
    for backend in ("triton", "torch"):
        torch.manual_seed(0)
        config = GPTConfig(vocab_size=64, block_size=40, n_layer=2, n_head=2, n_embd=32, window=8, n_sink=2,
                           schedule="RL", router_init_std=1.0, routed_mode=mode, attention_backend=backend)
        model = GPT(config).to(DEVICE)
        x = torch.randint(64, (2, 40), generator=torch.Generator().manual_seed(1)).to(DEVICE)
        out = model(x, x)
        assert 0 < out.gates[0].float().mean() < 1  # a real mix of global and local tokens
        loss = out.lm_loss + router_penalty(out, 0.01)
        loss.backward()
        losses.append(loss.detach())
        grads.append({name: p.grad for name, p in model.named_parameters()})
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-5)
    for name, grad in grads[1].items():
        torch.testing.assert_close(grads[0][name], grad, rtol=1e-3, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("mode", ["exact", "sparse"])
def test_the_kernels_are_custom_ops_that_compile_without_graph_breaks(rng, mode):
    """torch.compile traces a model through the Triton attention (fullgraph: no graph break; in sparse mode with
    the gated-row count captured as train.py sets it), and the compiled model's loss and gradients are the
    eager ones; opcheck checks each op's fake and autograd."""
    from model import GPT, GPTConfig, router_penalty
    q, k, v = (torch.randn(1, 2, 48, 16, generator=rng, device=DEVICE, requires_grad=True) for _ in range(3))
    torch.library.opcheck(triton_local.local_forward, (q, k, v, 8, 2))
    pos, valid = triton_attention.compact_gates(torch.rand(1, 2, 48, generator=rng, device=DEVICE) < 0.3)
    first_valid = (pos.shape[-1] - valid.sum(-1)).reshape(2).to(torch.int32)
    torch.library.opcheck(triton_global.global_forward, (q, k, v, pos.reshape(2, -1).to(torch.int32), first_valid))
    config = GPTConfig(block_size=48, n_layer=3, n_head=2, n_embd=32, window=8, n_sink=2, schedule="RLG",
                       attention_backend="triton", routed_mode=mode, router_init_std=1.0)  # mixed gates
    torch.manual_seed(0)
    model = GPT(config).to(DEVICE)
    x, y = (torch.randint(0, 256, (2, 48), generator=rng).to(DEVICE) for _ in range(2))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    losses, grads = [], []
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        for m in (model, compiled):
            model.zero_grad()
            out = m(x, y)
            loss = out.lm_loss + router_penalty(out, 0.01)
            loss.backward()
            losses.append(loss.detach())
            grads.append([p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(losses[1], losses[0])
    for compiled_grad, eager_grad in zip(*grads[::-1]):
        torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-4, atol=1e-5)
