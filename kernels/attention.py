"""The one entry point every attention layer goes through.

    attention(q, k, v, kind, window, n_sink, gate, mode, backend)

q, k, v: (B, H, T, D). kind: 'dense' (full causal), 'local' (sliding window + sinks) or 'routed'
(All-or-Here: gate 1 -> full causal, 0 -> window). For 'routed', gate is a float (B, H, T) tensor holding
0/1 in the forward pass and carrying the router's straight-through gradient; the result is
O_local + gate * (O_full - O_local). mode 'exact' computes both outputs for every token; 'sparse' computes
the full output only where the gate is 1 (the router then gets its gradient only there).

backend: 'reference' (explicit masks, O(T^2), the ground truth), 'torch' (efficient PyTorch, any device),
'triton' (fused kernels, CUDA or TRITON_INTERPRET=1), 'auto' (triton on CUDA, torch elsewhere).
"""
import os

from kernels import reference, torch_attention

KINDS = ("dense", "local", "routed")
BACKENDS = ("auto", "reference", "torch", "triton")
MODES = ("exact", "sparse")


TRITON_HEAD_DIMS = (16, 32, 64, 128)


def resolve_backend(backend, device, head_dim):
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {BACKENDS}")
    if backend == "auto":
        fits = device.type == "cuda" and head_dim in TRITON_HEAD_DIMS and _triton_available()
        return "triton" if fits else "torch"
    return backend


def _triton_available():
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def attention(q, k, v, kind, window=None, n_sink=0, gate=None, mode="exact", backend="auto"):
    if kind not in KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; choose one of {KINDS}")
    if mode not in MODES:
        raise ValueError(f"unknown routed mode {mode!r}; choose one of {MODES}")
    if kind == "routed" and gate is None:
        raise ValueError("routed attention needs a gate of shape (B, H, T)")
    backend = resolve_backend(backend, q.device, q.shape[-1])
    if backend == "reference":
        return reference.reference_attention(q, k, v, kind, window, n_sink, gate, mode)
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
    return impl.routed_attention(q, k, v, gate, window, n_sink, mode)
