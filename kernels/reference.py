"""Reference attention: explicit (T, T) masks, fp32 softmax, obviously correct and O(T^2).

Every faster backend is tested against this file, so it fixes the conventions every part of the project uses:
- a local query at position t sees keys t-window+1 .. t (window keys, itself included), plus the first n_sink
  positions;
- gate 1 = global (full causal attention), 0 = local;
- the global fraction is global (token, head) decisions / all decisions over the routed layers; the attention
  FLOP fraction weights each decision by the keys it reads.
"""
import torch

from kernels.gates import combine


def local_visible(query_pos, key_pos, window, n_sink=0):
    """(Tq, S) bool: a local query at each of query_pos may read the key at each of key_pos."""
    t, s = query_pos[:, None], key_pos[None, :]
    return (s <= t) & ((t - s < window) | (s < n_sink))


def local_mask(T, window, n_sink=0, device=None):
    """(T, T) bool: query t may read key s."""
    positions = torch.arange(T, device=device)
    return local_visible(positions, positions, window, n_sink)


def causal_mask(T, device=None):
    t = torch.arange(T, device=device)
    return t[None, :] <= t[:, None]


def attention_weights(q, k, mask):
    """softmax(q k^T / sqrt(D) masked), in fp32 (or q's wider dtype): (..., Tq, S)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    scores = (q.to(acc) @ k.to(acc).transpose(-1, -2)) * q.shape[-1] ** -0.5
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def masked_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(D) masked) v, computed in fp32 and returned in q's dtype."""
    weights = attention_weights(q, k, mask)
    return (weights @ v.to(weights.dtype)).to(q.dtype)


def reference_attention(q, k, v, kind, window, n_sink=0, gate=None, mode="exact", local=None):
    """q, k, v: (B, H, T, D). kind: 'dense' | 'local' | 'routed'.

    gate (routed only): float (B, H, T) holding 0/1 in the forward pass and carrying the router's
    straight-through gradient. The output is O_local + gate * (O_full - O_local). In 'sparse' mode the
    full output exists only for gated tokens, so the difference (and the router gradient through it)
    is zero where the gate is 0. local (routed only): the local output where the caller has it.
    """
    T = q.shape[-2]
    if kind == "dense":
        return masked_attention(q, k, v, causal_mask(T, q.device))
    if local is None or kind == "local":
        local = masked_attention(q, k, v, local_mask(T, window, n_sink, q.device))
    if kind == "local":
        return local
    full = masked_attention(q, k, v, causal_mask(T, q.device))
    return combine(local, full, gate, only_gated=mode == "sparse")
