"""Triton attention backend: same functions and semantics as kernels/torch_attention.py; the kernels are in
kernels/triton_local.py (window + sinks) and kernels/triton_global.py (full attention of the gated rows).

- local: the local kernel, forward and backward bounded by the window (work grows with T * window).
- routed, 'exact': the local kernel for every token and SDPA (flash on the GPU) for the full output.
- routed, 'sparse': the local kernel for every token; full causal attention only for the gated tokens,
  compacted per (batch, head) (kernels/gates.py). The two are combined on the compacted rows only, so
  autograd gives the router sum(dO * (full - local)) on gated tokens and zero elsewhere.
"""
import torch.nn.functional as F

from kernels.gates import combine, combine_rows, compact_gates
from kernels.triton_common import check_inputs
from kernels.triton_global import global_attention
from kernels.triton_local import local_attention


def routed_attention(q, k, v, gate, window, n_sink=0, mode="exact", local=None):
    """gate: float (B, H, T), 0/1 forward values carrying the straight-through gradient. local: the local
    output where the caller has it (not computed again)."""
    check_inputs(q, k, v)
    local = local_attention(q, k, v, window, n_sink) if local is None else local
    if mode == "exact":
        return combine(local, F.scaled_dot_product_attention(q, k, v, is_causal=True), gate)
    pos, valid = compact_gates(gate.detach() > 0.5)
    return combine_rows(local, global_attention(q, k, v, pos, valid), gate, pos, valid)[0]
