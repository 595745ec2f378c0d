"""The one entry point every attention layer goes through.

    attention(q, k, v, kind=..., window=..., n_sink=..., gate=..., mode=..., backend=...)

q, k, v: (B, H, T, D), one shape and dtype (k and v with fewer heads, grouped-query attention, are refused).
kind: 'dense' (full causal), 'local' (sliding window + sinks) or 'routed' (All-or-Here: gate 1 -> full
causal, 0 -> window). For 'routed', gate is a float (B, H, T) tensor holding 0/1 in the forward pass and
carrying the router's straight-through gradient; the result is O_local + gate * (O_full - O_local)
(kernels/gates.py). mode 'exact' computes both outputs for every token; 'sparse' computes
the full output only where the gate is 1 (the router then gets its gradient only there).

backend: 'reference' (explicit masks, O(T^2), the ground truth), 'torch' (efficient PyTorch, any device),
'triton' (fused kernels, CUDA or TRITON_INTERPRET=1), 'auto' (triton on CUDA, torch elsewhere).
"""
import os

from kernels import reference, torch_attention

KINDS = ("dense", "local", "routed")
BACKENDS = ("auto", "reference", "torch", "triton")
MODES = ("exact", "sparse")


def resolve_backend(backend, device, head_dim):
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and _triton_fits(head_dim) else "torch"
    return backend


def _triton_fits(head_dim):
    """Triton is installed and has kernels for this head dim. Imported here, not at the top: the Triton modules
    need triton, which a CPU install may lack."""
    try:
        from kernels.triton_common import HEAD_DIMS
    except ImportError:
        return False
    return head_dim in HEAD_DIMS


def check_arguments(q, k, v, kind, window, n_sink, gate, mode):
    """One check of every argument, with the same messages whichever backend runs."""
    if kind not in KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; choose one of {KINDS}")
    if mode not in MODES:
        raise ValueError(f"unknown routed mode {mode!r}; choose one of {MODES}")
    if q.dim() != 4:
        raise ValueError(f"q must be (B, H, T, D), got shape {tuple(q.shape)}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must share one (B, H, T, D) shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}; for grouped-query attention repeat k and v to q's heads first")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[2] == 0:
        raise ValueError("empty sequence (T = 0): attention needs at least one position")
    if kind == "dense":
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: {kind} attention needs an integer window >= 1 (keys t-window+1 .. t)")
    if isinstance(n_sink, bool) or not isinstance(n_sink, int) or not 0 <= n_sink <= window:
        raise ValueError(f"n_sink={n_sink!r} must be an integer between 0 and window={window}")
    if kind == "routed":
        if gate is None:
            raise ValueError("routed attention needs a gate of shape (B, H, T)")
        if gate.shape != q.shape[:3]:
            raise ValueError(f"gate must have shape (B, H, T) = {tuple(q.shape[:3])}, got {tuple(gate.shape)}")


def attention(q, k, v, kind, window=None, n_sink=0, gate=None, mode="exact", backend="auto", local=None):
    """local (routed only): the heads' local output where the caller computed it already (a router that reads
    it), so that it is not computed again."""
    check_arguments(q, k, v, kind, window, n_sink, gate, mode)
    if local is not None and (kind != "routed" or local.shape != q.shape):
        raise ValueError(f"local= is the routed layer's local output, shaped like q {tuple(q.shape)}")
    backend = resolve_backend(backend, q.device, q.shape[-1])
    if backend == "reference":
        return reference.reference_attention(q, k, v, kind, window, n_sink, gate, mode, local)
    if kind == "dense":
        return torch_attention.dense_attention(q, k, v)  # SDPA (flash on GPU) for every fast backend
    if backend == "triton":
        if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("backend='triton' needs a CUDA device, or TRITON_INTERPRET=1 to run on the CPU")
        from kernels import triton_attention as impl
    else:
        impl = torch_attention
    if kind == "local":
        return impl.local_attention(q, k, v, window, n_sink)
    return impl.routed_attention(q, k, v, gate, window, n_sink, mode, local)
