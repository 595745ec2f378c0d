"""Efficient pure-PyTorch attention: runs everywhere (CPU included), same results as kernels/reference.py.

- local: queries in chunks; every chunk reads the sinks and the keys from `window` before it to its end,
  all chunks in one fused SDPA call, so the cost grows with T * window, not T^2.
- routed, 'exact': full and local outputs for every token (exact straight-through gradient).
- routed, 'sparse': local output for every token, full output only for gated tokens (GatedRowsAttention).
"""
import math

import torch
import torch.nn.functional as F

LOCAL_CHUNK = 128  # most queries per local chunk: longer ones read more masked keys, 64 measured the same
GATED_GROUP = 32  # gated query rows per matmul group (GatedRowsAttention): smaller ones waste fewer keys
                  # but cost more Python ops; 16 to 64 measured within noise of each other


def dense_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def local_attention(q, k, v, window, n_sink=0):
    """Sliding-window attention with sinks. Chunk i holds queries i*c .. i*c+c-1 and reads the sinks and
    chunks i-m .. i (m = ceil(window / c)) under a mask, all chunks in one SDPA call."""
    B, H, T, D = q.shape
    if n_sink > window:
        raise ValueError(f"n_sink={n_sink} must not exceed window={window}")
    n_sink = min(n_sink, T)
    c = min(window, LOCAL_CHUNK)
    n = math.ceil(T / c)
    n_prev = math.ceil(window / c)
    queries = _pad_to(q, n * c).view(B * H, n, c, D)
    keys = _chunk_keys(k, n, c, n_prev, n_sink)
    values = _chunk_keys(v, n, c, n_prev, n_sink)
    out = F.scaled_dot_product_attention(queries, keys, values,
                                         attn_mask=_local_mask(n, c, n_prev, window, n_sink, q))
    return out.reshape(B, H, n * c, D)[:, :, :T]


def _pad_to(x, length):
    """Zero-pad dim 2 to `length` (no copy when it already has it)."""
    return x if x.shape[2] == length else F.pad(x, (0, 0, 0, length - x.shape[2]))


def _chunk_keys(x, n, c, n_prev, n_sink):
    """(B * H, n, n_sink + (n_prev + 1) * c, D): per chunk i, the sinks, then chunks i-n_prev .. i (zeros
    before position 0)."""
    B, H, T, D = x.shape
    chunks = _pad_to(x, n * c).view(B, H, n, c, D)
    # chunk i - j for every i: shift by j chunks, zeros in front (F.pad crops the end with a negative pad)
    earlier = [F.pad(chunks, (0, 0, 0, 0, min(j, n), -min(j, n))) for j in range(n_prev, 0, -1)]
    sinks = [x[:, :, None, :n_sink].expand(B, H, n, n_sink, D)] if n_sink else []
    return torch.cat(sinks + earlier + [chunks], dim=3).view(B * H, n, -1, D)


def _local_mask(n, c, n_prev, window, n_sink, like):
    """Additive (1, n, c, n_sink + (n_prev + 1) * c) mask in the layout of _chunk_keys (SDPA's fused CPU
    kernel takes 2D or 4D masks). A window key is read if it exists and is one of the last `window`
    positions; a sink only if it lies before the window (inside it, it is already read as a window key).
    Chunks far enough from the start all share one pattern, so only the first ones are computed apart."""
    device = like.device
    first = min(n, math.ceil((window + max(n_sink - 1, 0)) / c))  # first chunk with the shared pattern
    chunk = torch.arange(min(first + 1, n), device=device)[:, None, None]
    t = chunk * c + torch.arange(c, device=device)[:, None]  # query positions (chunks, c, 1)
    key_pos = (chunk - n_prev) * c + torch.arange((n_prev + 1) * c, device=device)
    allowed = (key_pos >= 0) & (key_pos <= t) & (t - key_pos < window)
    if n_sink:
        sinks_allowed = torch.arange(n_sink, device=device) <= t - window
        allowed = torch.cat([sinks_allowed, allowed], dim=2)
    mask = torch.zeros(allowed.shape, dtype=like.dtype, device=device).masked_fill(~allowed, float("-inf"))
    if first < n:
        mask = torch.cat([mask[:first], mask[first:].expand(n - first, -1, -1)])
    return mask[None]


class GatedRowsAttention(torch.autograd.Function):
    """Full causal attention of gathered query rows, forward and backward written out with matmuls.

    q_rows (B, H, M, D): each (batch, head)'s queries in position order, `pos` (B, H, M) their positions.
    Rows are taken in groups (`bounds`: first row, end row, lowest and highest position + 1 of the group
    over all batches and heads); a group reads keys [0, hi) and masks only [lo, hi), where its rows differ.
    Written out because autograd would turn each group's key slice gradient into a full-size (T) tensor;
    here the groups' key and value gradients accumulate in place into one buffer. The softmax
    probabilities are kept for the backward (about 1.2 * gated fraction * T^2 / 2 floats per batch and
    head); recomputing them instead measured as fast with glibc's allocator, slower with a caching one."""

    @staticmethod
    def forward(ctx, q_rows, k, v, pos, bounds):
        scaled_q = q_rows * q_rows.shape[-1] ** -0.5
        k_t = k.transpose(-1, -2).contiguous()  # (B, H, D, T): a contiguous right operand is faster
        out = torch.empty_like(q_rows)
        scratch = _Scratch(q_rows, bounds)
        probs = []
        for a, b, lo, hi in bounds:
            scores = torch.matmul(scaled_q[:, :, a:b], k_t[..., :hi], out=scratch.get(b - a, hi))
            future = torch.arange(lo, hi, device=k.device) > pos[:, :, a:b, None]
            scores[..., lo:].masked_fill_(future, float("-inf"))
            p = scores.softmax(-1)
            out[:, :, a:b] = p @ v[:, :, :hi]
            probs.append(p)
        ctx.save_for_backward(scaled_q, k, v, out, *probs)
        ctx.bounds = bounds
        return out

    @staticmethod
    def backward(ctx, grad_out):
        scaled_q, k, v, out, *probs = ctx.saved_tensors
        v_t = v.transpose(-1, -2).contiguous()
        rowsum = (grad_out * out).sum(-1, keepdim=True)  # sum_j p_j dp_j, the softmax backward's shift
        grad_q = torch.empty_like(scaled_q)
        grad_k = torch.zeros_like(k)
        grad_v = torch.zeros_like(v)
        scratch = _Scratch(grad_out, ctx.bounds)
        for (a, b, lo, hi), p in zip(ctx.bounds, probs):
            g = grad_out[:, :, a:b]
            grad_scores = torch.matmul(g, v_t[..., :hi], out=scratch.get(b - a, hi))
            grad_scores.sub_(rowsum[:, :, a:b]).mul_(p)
            grad_q[:, :, a:b] = grad_scores @ k[:, :, :hi]
            grad_k[:, :, :hi] += grad_scores.transpose(-1, -2) @ scaled_q[:, :, a:b]
            grad_v[:, :, :hi] += p.transpose(-1, -2) @ g
        grad_q *= scaled_q.shape[-1] ** -0.5
        return grad_q, grad_k, grad_v, None, None


class _Scratch:
    """One buffer for every group's (B, H, rows, keys) score-sized temporary: a fresh allocation per group
    costs page faults (glibc hands large freed blocks back to the OS); measured 3.0x -> 3.5x at T=8192."""

    def __init__(self, like, bounds):
        self.B, self.H = like.shape[:2]
        largest = max([(b - a) * hi for a, b, _, hi in bounds], default=0)
        self.buffer = like.new_empty(self.B * self.H * largest)

    def get(self, rows, keys):
        return self.buffer[:self.B * self.H * rows * keys].view(self.B, self.H, rows, keys)


def gated_rows(gated, group=GATED_GROUP):
    """Positions (B, H, M) of each (batch, head)'s gated tokens in order, M the largest count, and `valid`
    marking them; the rows are right-aligned: a (batch, head) with fewer gated tokens is padded at the
    front with position 0, where rows read the fewest keys. Also the group bounds GatedRowsAttention takes."""
    B, H, T = gated.shape
    counts = gated.sum(-1, keepdim=True)
    M = int(counts.max())
    order = torch.sort(gated.to(torch.int8), dim=-1, stable=True).indices[..., T - M:]  # gated last
    valid = torch.arange(M, device=gated.device) >= M - counts
    pos = torch.where(valid, order, 0)
    n_groups = math.ceil(M / group)
    grouped = F.pad(pos, (n_groups * group - M, 0)).view(B, H, n_groups, group)  # pad rows at the front
    lo = grouped.amin((0, 1, 3)).tolist()
    hi = (grouped.amax((0, 1, 3)) + 1).tolist()
    starts = [max(0, M - (n_groups - i) * group) for i in range(n_groups + 1)]
    return pos, valid, [(starts[i], starts[i + 1], lo[i], hi[i]) for i in range(n_groups)]


def routed_attention(q, k, v, gate, window, n_sink=0, mode="exact"):
    """gate: float (B, H, T), 0/1 forward values carrying the straight-through gradient."""
    local = local_attention(q, k, v, window, n_sink)
    if mode == "exact":
        return local + gate.unsqueeze(-1).to(q.dtype) * (dense_attention(q, k, v) - local)
    if mode != "sparse":
        raise ValueError(f"routed mode must be 'exact' or 'sparse', got {mode!r}")
    # out = local + gate * (full - local) on gated rows only, added in place of a full-size delta
    pos, valid, bounds = gated_rows(gate.detach() > 0.5)
    index = pos[..., None].expand(*pos.shape, q.shape[-1])
    acc = torch.promote_types(q.dtype, torch.float32)
    full = GatedRowsAttention.apply(q.gather(2, index).to(acc), k.to(acc), v.to(acc), pos, bounds)
    weight = (gate.gather(2, pos) * valid).unsqueeze(-1).to(q.dtype)
    return local.scatter_add(2, index, weight * (full.to(q.dtype) - local.gather(2, index)))
