"""Efficient pure-PyTorch attention: runs everywhere (CPU included), same results as kernels/reference.py.

- local: queries in chunks of `window`; each chunk reads only its own keys, the `window` keys before it
  and the sink keys, so the cost grows with T * window, not T^2.
- routed, 'exact': full and local outputs for every token (exact straight-through gradient).
- routed, 'sparse': local output for every token, full output only for gated tokens, which are gathered
  per (batch, head) into a compact buffer in position order and processed in groups that read keys only
  up to the group's last true position.
"""
import math

import torch
import torch.nn.functional as F

from kernels import reference


def dense_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _band_mask(window, n_sink, dtype, device):
    """Additive (window, n_sink + 2 * window) mask of a steady-state chunk: query r of the chunk reads the
    sinks and keys r+1 .. r+window of [previous chunk, own chunk]. Shared by every chunk, so SDPA's fused
    CPU/GPU kernels take it as one broadcast 2D mask."""
    r = torch.arange(window, device=device)[:, None]
    j = torch.arange(2 * window, device=device)[None, :]
    band = (j > r) & (j <= r + window)
    allowed = torch.cat([band.new_ones(window, n_sink), band], dim=1)
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))


def local_attention(q, k, v, window, n_sink=0):
    """Sliding-window attention in chunks of `window` queries. The first chunks (where the window or the
    sinks are cut by the start of the sequence) use an explicit mask; every later chunk reads
    [sinks, previous chunk, own chunk] under the same band mask."""
    B, H, T, D = q.shape
    if n_sink > window:
        raise ValueError(f"n_sink={n_sink} must not exceed window={window}")
    head = min(T, window if n_sink == 0 else 2 * window)
    out_head = F.scaled_dot_product_attention(
        q[:, :, :head], k[:, :, :head], v[:, :, :head],
        attn_mask=_additive(reference.local_mask(head, window, n_sink, q.device), q.dtype))
    if head == T:
        return out_head
    n_chunks = math.ceil(T / window)
    pad = n_chunks * window - T
    kb = F.pad(k, (0, 0, 0, pad)).view(B, H, n_chunks, window, D)
    vb = F.pad(v, (0, 0, 0, pad)).view(B, H, n_chunks, window, D)
    first = head // window  # index of the first steady-state chunk
    keys = [kb[:, :, first - 1:-1], kb[:, :, first:]]
    values = [vb[:, :, first - 1:-1], vb[:, :, first:]]
    n = n_chunks - first
    if n_sink:
        keys.insert(0, k[:, :, None, :n_sink].expand(B, H, n, n_sink, D))
        values.insert(0, v[:, :, None, :n_sink].expand(B, H, n, n_sink, D))
    qc = F.pad(q[:, :, head:], (0, 0, 0, pad)).reshape(B, H * n, window, D)
    kc = torch.cat(keys, dim=3).reshape(B, H * n, -1, D)
    vc = torch.cat(values, dim=3).reshape(B, H * n, -1, D)
    out = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=_band_mask(window, n_sink, q.dtype, q.device))
    out = out.view(B, H, n * window, D)[:, :, :T - head]
    return torch.cat([out_head, out], dim=2)


def _additive(allowed, dtype):
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, float("-inf"))


def _group_count(n_rows):
    return max(1, min(8, n_rows // 64))


def gathered_global_attention(q, k, v, gated):
    """Full causal attention for the gated queries only. Returns (B, H, T, D), rows of ungated
    queries hold unspecified values (callers mask them out)."""
    B, H, T, D = q.shape
    counts = gated.sum(-1)
    n_max = int(counts.max())
    if n_max == 0:
        return torch.zeros_like(q)
    # stable sort puts gated tokens first, in position order; the first n_max columns are the compacted
    # queries of each (batch, head), padded with ungated positions
    order = torch.sort((~gated).to(torch.int8), dim=-1, stable=True).indices[..., :n_max]
    valid = torch.arange(n_max, device=q.device) < counts[..., None]
    # padding rows take the position of the last real row so they never widen a group's key range
    last = order.gather(-1, (counts - 1).clamp(min=0)[..., None])
    pos = torch.where(valid, order, last)
    qg = q.gather(2, order[..., None].expand(B, H, n_max, D))
    groups = _group_count(n_max)
    bounds = [round(g * n_max / groups) for g in range(groups + 1)]
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        p = pos[..., a:b]
        n_keys = int(p.max()) + 1
        mask = torch.arange(n_keys, device=q.device) <= p[..., None]
        outs.append(F.scaled_dot_product_attention(qg[:, :, a:b], k[:, :, :n_keys], v[:, :, :n_keys],
                                                   attn_mask=mask))
    og = torch.cat(outs, dim=2)
    return torch.zeros_like(q).scatter(2, order[..., None].expand(B, H, n_max, D), og)


def routed_attention(q, k, v, gate, window, n_sink=0, mode="exact"):
    """gate: float (B, H, T), 0/1 forward values carrying the straight-through gradient."""
    local = local_attention(q, k, v, window, n_sink)
    hard = gate.detach() > 0.5
    if mode == "exact":
        full = dense_attention(q, k, v)
        delta = full - local
    elif mode == "sparse":
        full = gathered_global_attention(q, k, v, hard)
        delta = (full - local) * hard.unsqueeze(-1)
    else:
        raise ValueError(f"routed mode must be 'exact' or 'sparse', got {mode!r}")
    return local + gate.unsqueeze(-1).to(q.dtype) * delta
