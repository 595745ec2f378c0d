"""What every backend does with the routed gate, written once: combine the local and full outputs, and
compact each (batch, head)'s gated tokens into rows for the sparse mode.

The gate is a float (B, H, T) tensor holding 0/1 in the forward pass and carrying the router's
straight-through gradient; a token is gated (global) where it is 1.
"""
import torch


def head_index(heads):
    """Index of the head dim for a group of heads decided alike: consecutive heads as a slice (a view, not a
    copy), others as the list."""
    return slice(heads[0], heads[-1] + 1) if heads == list(range(heads[0], heads[-1] + 1)) else heads


def combine(local, full, gate, only_gated=False):
    """local + gate * (full - local), every row: (B, H, T, D) outputs, gate (B, H, T).
    only_gated: the difference counts only where the gate is 1, so the router gets no gradient from the other
    tokens (the sparse mode's semantics, computed densely)."""
    delta = full - local
    if only_gated:
        delta = delta * (gate.detach() > 0.5).unsqueeze(-1)
    return local + gate.unsqueeze(-1).to(local.dtype) * delta


def compact_gates(gated):
    """Each (batch, head)'s gated token positions as rows, in position order, right-aligned.

    gated: bool (B, H, T). Returns pos (B, H, M) int64 and valid (B, H, M) bool, M the largest gated count over
    (batch, head), at least 1 so that shapes never vanish. A (batch, head) with fewer gated tokens is padded at
    the front with position 0 (valid False): along every row of pos the positions never decrease, and a padding
    row sits where real rows read the fewest keys."""
    B, H, T = gated.shape
    counts = gated.sum(-1, keepdim=True)
    M = max(1, int(counts.max()))
    # each gated token's row from its rank among the gated ones (a cumsum, cheaper than a sort); the other
    # tokens all go to a spare row M, dropped
    row = torch.where(gated, gated.cumsum(-1) + (M - 1 - counts), M)
    positions = torch.arange(T, device=gated.device).expand(B, H, T)
    pos = gated.new_zeros((B, H, M + 1), dtype=torch.long).scatter_(2, row, positions)[..., :M]
    valid = torch.arange(M, device=gated.device) >= M - counts
    return pos, valid


def combine_rows(local, full_rows, gate, pos, valid, in_place=False):
    """local + gate * (full - local) where the full output exists only on the compacted rows (compact_gates).

    local (B, H, T, D), full_rows (B, H, M, D). Padding rows add nothing (their weight is 0). in_place adds into
    `local` (outside autograd). Returns (output, row index (B, H, M, D), row weights (B, H, M), row deltas
    full - local (B, H, M, D)): the last three are what a hand-written backward needs."""
    index = pos.unsqueeze(-1).expand(*pos.shape, local.shape[-1])
    weight = gate.gather(2, pos) * valid
    delta = full_rows.to(local.dtype) - local.gather(2, index)
    update = weight.unsqueeze(-1).to(local.dtype) * delta
    out = local.scatter_add_(2, index, update) if in_place else local.scatter_add(2, index, update)
    return out, index, weight, delta
