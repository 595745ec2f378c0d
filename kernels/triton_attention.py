"""Triton attention backend: same functions and semantics as kernels/torch_attention.py.

- local: kernels/triton_local.py, forward and backward bounded by the window (work grows with T * window).
- routed, 'exact': the local kernel for every token and SDPA (flash on the GPU) for the full output.
- routed, 'sparse': the local kernel for every token; full causal attention only for the gated tokens,
  compacted per (batch, head) (kernels/triton_global.py). The two are combined in torch on the compacted rows
  only: out = local, plus gate * (full - local) scattered onto the gated rows, so autograd gives the router
  sum(dO * (full - local)) on gated tokens and zero elsewhere.
"""
import torch.nn.functional as F

from kernels.triton_common import check_inputs
from kernels.triton_global import GlobalAttention, compact_gated
from kernels.triton_local import local_attention


def routed_attention(q, k, v, gate, window, n_sink=0, mode="exact"):
    """gate: float (B, H, T), 0/1 forward values carrying the straight-through gradient."""
    check_inputs(q, k, v)
    if gate.shape != q.shape[:3]:
        raise ValueError(f"gate must have shape {tuple(q.shape[:3])}, got {tuple(gate.shape)}")
    local = local_attention(q, k, v, window, n_sink)
    if mode == "exact":
        full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return local + gate.unsqueeze(-1).to(q.dtype) * (full - local)
    if mode != "sparse":
        raise ValueError(f"routed mode must be 'exact' or 'sparse', got {mode!r}")
    rows, pos = compact_gated(gate.detach() > 0.5)
    full = GlobalAttention.apply(q, k, v, pos)
    rows_d = rows.unsqueeze(-1).expand(*rows.shape, q.shape[-1])
    weight = gate.gather(-1, rows) * (pos >= 0)  # padding slots point at ungated rows and add nothing
    return local.scatter_add(2, rows_d, weight.unsqueeze(-1).to(q.dtype) * (full - local.gather(2, rows_d)))
