"""Efficient pure-PyTorch attention: runs everywhere (CPU included), same results as kernels/reference.py.

- local: queries in chunks; every chunk reads the sinks and the keys from `window` before it to its end,
  under a mask (ChunkedLocalAttention), so the cost grows with T * window, not T^2.
- routed, 'exact': full and local outputs for every token (exact straight-through gradient).
- 16-bit inputs on the CPU: dense attention runs in bf16/fp16, local and gated attention in fp32
  (_masked_dtype), softmax statistics in fp32 on every path.
- routed, 'sparse': local output for every token, full output only for gated tokens (kernels/gates.py
  compacts them), over key blocks merged by their log-sum-exps (RoutedSparseAttention); a head whose every
  token is gated runs dense attention, one with none its window alone (_sparse_by_head: compacted rows are
  padded to the most gated tokens of any head, so one all-global head made every head compute them all).

Forward and backward are written out on `attend` / `attend_backward`: attention over one block of keys
that also returns the log-sum-exp, and its backward given the output and log-sum-exp over all the blocks
a row reads (the fused flash kernel on CPU, plain fp32 matmuls elsewhere).
"""
import math

import torch
import torch.nn.functional as F

from kernels.gates import combine, combine_rows, compact_gates, head_index

# Tuning constants, measured on the CPU flash kernel (results/2026-11-29_cpu_attention_tuning).
LOCAL_CHUNK = 64  # most queries per local chunk: longer chunks read more masked keys, shorter ones give
                  # the kernel fewer rows per call
LOCAL_CALL_SIZE = 2 ** 18  # key elements per local kernel call: one call's key and value gradients stay in L2
MASKED = -1e30  # _gated_forward's mask value: finite, so rows that read none of a block get a finite
                # log-sum-exp near -1e30 (not NaN) and merge with weight exp(-1e30 - lse) = 0
GATED_KEY_BLOCK = 512  # keys per _gated_forward block: larger blocks mask more scores, smaller ones cost
                       # more calls and merges


def dense_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def local_attention(q, k, v, window, n_sink=0):
    """Sliding-window attention with sinks. Chunk i holds queries i*c .. i*c+c-1 and reads the sinks and
    chunks i-m .. i (m = ceil(window / c)) under a mask (ChunkedLocalAttention). Arguments are checked by
    kernels.attention.attention."""
    dtype = _masked_dtype(q)
    return ChunkedLocalAttention.apply(q.to(dtype), k.to(dtype), v.to(dtype), window, min(n_sink, q.shape[2])).to(q.dtype)


def _masked_dtype(x):
    """The dtype local and gated attention compute in: fp32 for 16-bit inputs on the CPU, where the fused
    kernel runs several times slower with a mask in bf16 than in fp32 (its backward;
    results/2026-12-02_cpu_bf16_speed), x's own dtype elsewhere. Window attention is a small part of a step."""
    return torch.float32 if _cpu_kernel(x) and x.dtype in (torch.bfloat16, torch.float16) else x.dtype


class ChunkedLocalAttention(torch.autograd.Function):
    """Local attention over chunks, forward and backward written out (_local_forward, _local_backward)."""

    @staticmethod
    def forward(ctx, q, k, v, window, n_sink):
        out, saved, ctx.meta = _local_forward(q, k, v, window, n_sink)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return *_local_backward(ctx.saved_tensors, ctx.meta, grad_out), None, None


def _local_forward(q, k, v, window, n_sink):
    """Every chunk's window is a view into one padded copy of the keys (of the values); the backward folds
    the windows' gradients back onto the keys (autograd's unfold backward measured several times slower).
    Chunks go to the kernel a few at a time (LOCAL_CALL_SIZE); those from `first` on (_local_masks) share
    one mask, passed once for all of them. Returns the output (a fresh buffer, not saved: the caller may
    change it in place), the tensors _local_backward needs and its other arguments."""
    B, H, T, D = q.shape
    c = min(window, LOCAL_CHUNK)
    n = math.ceil(T / c)
    n_prev = math.ceil(window / c)
    queries = _pad_to(q, n * c).reshape(B * H, n, c, D)  # q may be strided
    keys, values = (_windows(x, n, c, n_prev, n_sink) for x in (k, v))
    per_call = max(1, LOCAL_CALL_SIZE // (B * H * keys.shape[2] * D))
    parts = _local_masks(n, c, n_prev, window, n_sink, per_call, q)
    outs, lses = zip(*(attend(queries[:, a:b], keys[:, a:b], values[:, a:b], mask) for a, b, mask in parts))
    saved = (queries, keys, values, *outs, *lses, *(mask for _, _, mask in parts))  # per call
    out = torch.cat(outs, 1).view(B, H, n * c, D)[:, :, :T]
    return out, saved, ([(a, b) for a, b, _ in parts], T, c, n_prev, n_sink)


def _local_backward(saved, meta, grad_out):
    """Gradients (q, k, v) of _local_forward: (B, H, T, D) views into fresh buffers, which the caller may
    add more gradient to."""
    queries, keys, values, *per_call = saved
    parts, T, c, n_prev, n_sink = meta
    outs, lses, masks = (per_call[i * len(parts):(i + 1) * len(parts)] for i in range(3))
    BH, n, _, D = queries.shape
    B, H = grad_out.shape[:2]
    grad_out = _pad_to(grad_out, n * c).reshape(BH, n, c, D)
    grad_q, grad_k, grad_v = (queries.new_empty(queries.shape) for _ in range(3))  # (BH, n, c, D)
    for (a, b), out, lse, mask in zip(parts, outs, lses, masks):
        dq, dk, dv = attend_backward(grad_out[:, a:b], queries[:, a:b], keys[:, a:b], values[:, a:b],
                                     out, lse, mask)
        grad_q[:, a:b] = dq
        for grad, d in ((grad_k, dk), (grad_v, dv)):
            window_slot = [d[:, :, n_sink + j * c:n_sink + (j + 1) * c] for j in range(n_prev + 1)]
            # the chunk's own slot plus the next chunk's slot for it in one pass (the next chunk of the
            # last one is in the next call), then the others add to earlier chunks
            own, next_slot = window_slot[n_prev], window_slot[n_prev - 1]
            torch.add(own[:, :-1], next_slot[:, 1:], out=grad[:, a:b - 1])
            grad[:, b - 1] = own[:, -1]
            if a > 0:
                grad[:, a - 1] += next_slot[:, 0]
            for j in range(n_prev - 1):  # chunk i - (n_prev - j); those before position 0 get no gradient
                back = n_prev - j
                if max(a, back) < b:
                    grad[:, max(a, back) - back:b - back] += window_slot[j][:, max(a, back) - a:]
            if n_sink:  # queries read only sinks before their window, in chunks already written
                grad.view(BH, n * c, D)[:, :n_sink] += d[:, :, :n_sink].sum(1)
    grad_q, grad_k, grad_v = (g.view(B, H, n * c, D)[:, :, :T] for g in (grad_q, grad_k, grad_v))
    return grad_q, grad_k, grad_v


def _pad_to(x, length):
    """Zero-pad dim 2 to `length` (no copy when it already has it)."""
    return x if x.shape[2] == length else F.pad(x, (0, 0, 0, length - x.shape[2]))


def _windows(x, n, c, n_prev, n_sink):
    """(B * H, n, n_sink + (n_prev + 1) * c, D): per chunk i, the sinks, then chunks i-n_prev .. i (zeros
    before position 0), all chunks' windows views into one padded copy of x (a copy per chunk with sinks)."""
    B, H, T, D = x.shape
    padded = F.pad(x, (0, 0, n_prev * c, n * c - T))
    windows = padded.unfold(2, (n_prev + 1) * c, c).transpose(-1, -2)  # (B, H, n, (n_prev + 1) * c, D)
    if n_sink:
        windows = torch.cat([x[:, :, None, :n_sink].expand(B, H, n, n_sink, D), windows], dim=3)
    return windows.reshape(B * H, n, -1, D)


def _local_masks(n, c, n_prev, window, n_sink, per_call, like):
    """Additive masks in the layout of _windows, as (first chunk, end chunk, (1, chunks or 1, c, keys) mask)
    parts of at most `per_call` chunks. A window key is read if it exists and is one of the last `window`
    positions; a sink only if it lies before the window (inside it, it is already read as a window key).
    Chunks far enough from the start all share one pattern: their masks are one broadcast over them."""
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
    bounds = [*range(0, first, per_call), *range(first, n, per_call), n]
    return [(a, b, mask[None, a:b] if a < first else mask[None, first:]) for a, b in zip(bounds, bounds[1:])]


def _cpu_kernel(x):
    """Whether attend runs the fused CPU flash kernel (a private op, any float dtype; it returns the
    log-sum-exp, which SDPA does not) rather than plain matmuls (every other device)."""
    return x.device.type == "cpu"


def attend(q, k, v, mask=None):
    """softmax(q k^T / sqrt(D) + mask) v and its log-sum-exp (B, H, Lq): attention over one block of keys.
    The output has q's dtype; scores, softmax and log-sum-exp are at least fp32 on every path."""
    if _cpu_kernel(q):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask)
    acc = _accumulation_dtype(q)
    scores = _scores(q, k, mask, acc)
    lse = scores.logsumexp(-1)
    return ((scores - lse[..., None]).exp() @ v.to(acc)).to(q.dtype), lse


def _accumulation_dtype(x):
    return torch.promote_types(x.dtype, torch.float32)


def _scores(q, k, mask, acc):
    scores = (q.to(acc) * q.shape[-1] ** -0.5) @ k.to(acc).transpose(-1, -2)
    return scores if mask is None else scores + mask


def attend_backward(grad_out, q, k, v, out, lse, mask=None):
    """Gradients (q, k, v) of attend(q, k, v, mask) when its rows also read other key blocks: `out` and `lse`
    are the rows' output and log-sum-exp over all of them, so this block's probabilities are exactly the
    merged softmax restricted to it."""
    if _cpu_kernel(q):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, False, attn_mask=mask)
    acc, scale = _accumulation_dtype(q), q.shape[-1] ** -0.5
    p = (_scores(q, k, mask, acc) - lse.to(acc)[..., None]).exp()
    grad_out = grad_out.to(acc)
    grad_scores = p * (grad_out @ v.to(acc).transpose(-1, -2) - (grad_out * out.to(acc)).sum(-1, keepdim=True))
    return ((grad_scores @ k.to(acc) * scale).to(q.dtype), (grad_scores.transpose(-1, -2) @ q.to(acc) * scale).to(k.dtype),
            (p.transpose(-1, -2) @ grad_out).to(v.dtype))


def _merge(out, lse, block_out, block_lse):
    """Turns (out, lse), attention over some keys, into attention over those and a block's, in place."""
    torch.logaddexp(lse, block_lse, out=lse)
    out.lerp_(block_out, (block_lse - lse).exp_().unsqueeze(-1))  # the block's share of the softmax


def _gated_forward(q_rows, k, v, pos, blocks):
    """Full causal attention of gathered query rows, over key blocks merged by their log-sum-exps.

    q_rows (B, H, M, D): each (batch, head)'s queries in position order, `pos` (B, H, M) their positions.
    Per key block [s, e) (`blocks`, from key_blocks), rows [b, M) see all of it in every batch and head: one
    call without a mask, over many rows, which the CPU kernel runs about as fast per score as dense attention;
    rows [a, b) see part of it: one call with a mask (_block_masks); rows before a see none of it. Returns
    the output and the tensors _gated_backward needs."""
    M = q_rows.shape[2]
    out = torch.zeros_like(q_rows)
    lse = q_rows.new_full(q_rows.shape[:3], float("-inf"))
    for (s, e, a, b), mask in zip(blocks, _block_masks(pos, blocks, q_rows.dtype)):
        keys, values = k[:, :, s:e], v[:, :, s:e]
        if a < b:
            _merge(out[:, :, a:b], lse[:, :, a:b], *attend(q_rows[:, :, a:b], keys, values, mask))
        if b < M:
            _merge(out[:, :, b:], lse[:, :, b:], *attend(q_rows[:, :, b:], keys, values))
    return out, (q_rows, k, v, out, lse, pos)


def _block_masks(pos, blocks, dtype):
    """Each block's mask for its rows [a, b) that see part of it (None where there are none), all in one
    buffer that the next overwrites, and built again for the backward (fresh memory per block costs more in
    page faults than building twice). Row i + 1 of the table is the mask of a row at key i of its block, so a
    block's mask is a copy of table rows (index_select copies whole rows, the fastest way measured)."""
    B, H = pos.shape[:2]
    block = max(e - s for s, e, _, _ in blocks)
    mask_rows = torch.full((block + 1, block), MASKED, dtype=dtype, device=pos.device).triu_()
    buffer = mask_rows.new_empty(B * H * max(b - a for _, _, a, b in blocks), block)
    for s, e, a, b in blocks:
        if a == b:
            yield None
            continue
        row = (pos[:, :, a:b] - (s - 1)).clamp_(0, block)
        mask = torch.index_select(mask_rows, 0, row.flatten(), out=buffer[:row.numel()])
        yield mask.view(*row.shape, block)[..., :e - s]


def _gated_backward(saved, blocks, grad_out, grad_k, grad_v):
    """Adds the gradients of _gated_forward for k and v to grad_k and grad_v, returns the one for q_rows.
    Each call's backward gets the merged output and log-sum-exp (attend_backward), so they just add up."""
    q_rows, k, v, out, lse, pos = saved
    M = q_rows.shape[2]
    grad_q = _zeros_like_kernel_output(q_rows)
    for (s, e, a, b), mask in zip(blocks, _block_masks(pos, blocks, q_rows.dtype)):
        for lo, hi, block_mask in ((a, b, mask), (b, M, None)):
            if lo < hi:
                dq, dk, dv = attend_backward(grad_out[:, :, lo:hi], q_rows[:, :, lo:hi], k[:, :, s:e],
                                             v[:, :, s:e], out[:, :, lo:hi], lse[:, :, lo:hi], block_mask)
                grad_q[:, :, lo:hi] += dq
                grad_k[:, :, s:e] += dk
                grad_v[:, :, s:e] += dv
    return grad_q


def _zeros_like_kernel_output(x):
    """Zeros like x (B, H, L, D) laid out as the CPU kernel's outputs, (B, L, H, D), which add faster."""
    B, H, L, D = x.shape
    return x.new_zeros(B, L, H, D).transpose(1, 2)


class RoutedSparseAttention(torch.autograd.Function):
    """routed_attention's 'sparse' mode: out = local + gate * (full - local), the full output computed for
    gated rows only (compact_gates, _gated_forward) and added in place of a full-size delta. Written out so
    that the gated rows' gradients go straight into the local attention's gradient buffers."""

    @staticmethod
    def forward(ctx, q, k, v, gate, window, n_sink):
        local, local_saved, ctx.local_meta = _local_forward(q, k, v, window, n_sink)
        pos, valid = compact_gates(gate > 0.5)
        ctx.blocks = key_blocks(pos, q.shape[2], GATED_KEY_BLOCK)
        index = pos.unsqueeze(-1).expand(*pos.shape, q.shape[-1])
        acc = torch.promote_types(q.dtype, torch.float32)
        full, gated_saved = _gated_forward(q.gather(2, index).to(acc), k.to(acc), v.to(acc), pos, ctx.blocks)
        out, index, weight, delta = combine_rows(local, full, gate, pos, valid, in_place=True)  # local: fresh
        ctx.save_for_backward(pos, valid, delta, weight, *local_saved, *gated_saved)
        ctx.n_local = len(local_saved)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        pos, valid, delta, weight, *saved = ctx.saved_tensors
        local_saved, gated_saved = saved[:ctx.n_local], saved[ctx.n_local:]
        index = pos.unsqueeze(-1).expand(*delta.shape)
        grad_rows = grad_out.gather(2, index)
        grad_gate = torch.zeros(grad_out.shape[:3], dtype=weight.dtype, device=weight.device)
        grad_gate.scatter_add_(2, pos, (delta * grad_rows).sum(-1).to(weight.dtype) * valid)
        grad_full = weight.unsqueeze(-1).to(grad_rows.dtype) * grad_rows
        grad_q, grad_k, grad_v = _local_backward(local_saved, ctx.local_meta,
                                                 grad_out.scatter_add(2, index, -grad_full))
        acc = gated_saved[0].dtype
        grad_q_rows = _gated_backward(gated_saved, ctx.blocks, grad_full.to(acc), grad_k, grad_v)
        grad_q.scatter_add_(2, index, grad_q_rows.to(grad_q.dtype))
        return grad_q, grad_k, grad_v, grad_gate, None, None


class GatedRowsAttention(torch.autograd.Function):
    """Full causal attention of the gated rows only (compact_gates' pos), for a caller that has the local
    output already (a router that reads it): the routed 'sparse' mode without computing local a second time."""

    @staticmethod
    def forward(ctx, q, k, v, pos):
        ctx.blocks = key_blocks(pos, q.shape[2], GATED_KEY_BLOCK)
        ctx.index = pos.unsqueeze(-1).expand(*pos.shape, q.shape[-1])
        ctx.dtype = q.dtype
        acc = torch.promote_types(q.dtype, torch.float32)
        full, saved = _gated_forward(q.gather(2, ctx.index).to(acc), k.to(acc), v.to(acc), pos, ctx.blocks)
        ctx.save_for_backward(*saved)
        return full.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_full):
        saved = ctx.saved_tensors
        k = saved[1]
        grad_k, grad_v = _zeros_like_kernel_output(k), _zeros_like_kernel_output(k)
        grad_rows = _gated_backward(saved, ctx.blocks, grad_full.to(k.dtype), grad_k, grad_v)
        B, H, T, D = k.shape
        grad_q = grad_rows.new_zeros(B, H, T, D).scatter_add_(2, ctx.index, grad_rows)
        return grad_q.to(ctx.dtype), grad_k.to(ctx.dtype), grad_v.to(ctx.dtype), None


def key_blocks(pos, T, key_block):
    """_gated_forward's key blocks for the rows of compact_gates: per block [s, e), the first row that reads
    any of it and the first that reads all of it, over all batches and heads (positions never decrease along
    the rows, so the rows reading any or all of a block are a suffix)."""
    starts = torch.arange(0, T, key_block, device=pos.device)
    ends = (starts + key_block).clamp(max=T)
    reads_any = torch.searchsorted(pos.amax((0, 1)), starts)
    reads_all = torch.searchsorted(pos.amin((0, 1)), ends - 1)
    return list(zip(starts.tolist(), ends.tolist(), reads_any.tolist(), reads_all.tolist()))


def routed_attention(q, k, v, gate, window, n_sink=0, mode="exact", local=None):
    """gate: float (B, H, T), 0/1 forward values carrying the straight-through gradient. local: the local
    output where the caller has it (not computed again). Arguments are checked by kernels.attention.attention."""
    if mode == "exact":
        local = local_attention(q, k, v, window, n_sink) if local is None else local
        return combine(local, dense_attention(q, k, v), gate)
    gated = gate.detach() > 0.5
    every, some = gated.all(2).all(0).tolist(), gated.any(2).any(0).tolist()  # per head
    if any(every) or not all(some):
        return _sparse_by_head(q, k, v, gate, window, n_sink, local, every, some)
    dtype = _masked_dtype(q)
    if local is not None:
        pos, valid = compact_gates(gated)
        full = GatedRowsAttention.apply(q.to(dtype), k.to(dtype), v.to(dtype), pos)
        return combine_rows(local, full, gate, pos, valid)[0]
    return RoutedSparseAttention.apply(q.to(dtype), k.to(dtype), v.to(dtype), gate, window,
                                       min(n_sink, q.shape[2])).to(q.dtype)


def _sparse_by_head(q, k, v, gate, window, n_sink, local, every, some):
    """routed_attention's 'sparse' mode where some heads have every token gated (every) or none (not some), as a
    per-head router decides: those heads run dense attention (combined with the local output, which the
    straight-through gradient needs) or their local output alone, the others the compacted rows."""
    local = local_attention(q, k, v, window, n_sink) if local is None else local
    y = torch.empty_like(local)
    groups = {"dense": [h for h, all_gated in enumerate(every) if all_gated],
              "mixed": [h for h, (a, s) in enumerate(zip(every, some)) if s and not a]}
    for kind, heads in groups.items():
        if not heads:
            continue
        i = head_index(heads)
        if kind == "dense":
            y[:, i] = combine(local[:, i], dense_attention(q[:, i], k[:, i], v[:, i]), gate[:, i])
        else:
            y[:, i] = routed_attention(q[:, i], k[:, i], v[:, i], gate[:, i], window, n_sink, "sparse", local[:, i])
    ungated = [h for h, s in enumerate(some) if not s]
    if ungated:
        # no token gated: the window's output; the gate's gradient there is zero, as sparse mode's, and the gate
        # stays in the graph (a caller may ask for its gradient)
        y[:, ungated] = local[:, ungated] + 0 * gate[:, ungated].unsqueeze(-1).to(local.dtype)
    return y
