"""Full causal attention for the gated (global) queries only, as Triton kernels (the L2A compaction scheme).

The gated queries of each (batch, head) arrive compacted by kernels.gates.compact_gates: `pos` (B, H, n_rows)
holds their positions in order, right-aligned, and rows before `first_valid` (one per (batch, head)) are
padding. Kernels read q rows through `pos` (no gathered copy of q) and mask causally on true positions; a
padding row sees no key at all.
  forward  per compacted query tile: key tiles 0 .. the tile's largest true position
  dQ       per compacted query tile, the same loop; written straight to the true positions
  dK, dV   per key tile: compacted query tiles from the first one whose largest position reaches the key tile
           (positions never decrease along the rows, so that is a searchsorted) to the last row
"""
import torch
import triton
import triton.language as tl

from kernels.triton_common import (LOG2E, bht_strides, dot_precision, head_ptr, key_grads, launch_config,
                                   load_rows, load_rows_t, output_buffer, row_dot, rows_contiguous, score_grads,
                                   softmax_finish, softmax_step, store_rows)


@triton.jit
def _load_rows_of(POS, FIRST_VALID, bh, rows, n_rows):
    """Positions of compacted rows and whether they are real (not padding, inside the buffer)."""
    in_buf = rows < n_rows
    pos = tl.load(POS + bh * n_rows + rows, mask=in_buf, other=0)
    return pos, in_buf & (rows >= tl.load(FIRST_VALID + bh))


@triton.jit
def _global_fwd_kernel(Q, K, V, POS, FIRST_VALID, O, LSE, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                       H, T, n_rows, qk_scale,
                       D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(1)
    Q = head_ptr(Q, bh, H, sqb, sqh)
    K = head_ptr(K, bh, H, skb, skh)
    V = head_ptr(V, bh, H, svb, svh)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    pos, valid = _load_rows_of(POS, FIRST_VALID, bh, rows, n_rows)
    q = load_rows(Q, pos, sqt, valid, D)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in range(0, tl.max(pos) + 1, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        k = load_rows(K, keys, skt, keys < T, D)
        v = load_rows(V, keys, svt, keys < T, D)
        visible = valid[:, None] & (keys[None, :] <= pos[:, None])
        m_i, l_i, acc = softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, PREC)
    out, lse = softmax_finish(m_i, l_i, acc)
    in_buf = rows < n_rows
    store_rows(O + bh.to(tl.int64) * n_rows * D, rows, D, out.to(O.dtype.element_ty), in_buf, D)
    tl.store(LSE + bh * n_rows + rows, lse, mask=in_buf)


@triton.jit
def _global_bwd_dq_kernel(Q, K, V, POS, FIRST_VALID, DO, LSE, DELTA, DQ,
                          sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                          H, T, n_rows, sm_scale, qk_scale,
                          D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    bh = tl.program_id(1)
    Q = head_ptr(Q, bh, H, sqb, sqh)
    K = head_ptr(K, bh, H, skb, skh)
    V = head_ptr(V, bh, H, svb, svh)
    DO = head_ptr(DO, bh, H, sdb, sdh)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_buf = rows < n_rows
    pos, valid = _load_rows_of(POS, FIRST_VALID, bh, rows, n_rows)
    q = load_rows(Q, pos, sqt, valid, D)
    do = load_rows(DO, rows, sdt, in_buf, D)
    lse = tl.load(LSE + bh * n_rows + rows, mask=in_buf, other=0.0)
    delta = tl.load(DELTA + bh * n_rows + rows, mask=in_buf, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in range(0, tl.max(pos) + 1, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        k = load_rows(K, keys, skt, keys < T, D)
        v = load_rows(V, keys, svt, keys < T, D)
        visible = valid[:, None] & (keys[None, :] <= pos[:, None])
        p, ds = score_grads(q, k, v, do, lse, delta, visible, qk_scale, PREC)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    store_rows(DQ + bh.to(tl.int64) * T * D, pos, D, (dq * sm_scale).to(DQ.dtype.element_ty), valid, D)


@triton.jit
def _global_bwd_dkdv_kernel(Q, K, V, POS, FIRST_VALID, DO, LSE, DELTA, FIRST_ROW, DK, DV,
                            sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                            H, T, n_rows, sm_scale, qk_scale,
                            D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    key_tile = tl.program_id(0)
    bh = tl.program_id(1)
    Q = head_ptr(Q, bh, H, sqb, sqh)
    K = head_ptr(K, bh, H, skb, skh)
    V = head_ptr(V, bh, H, svb, svh)
    DO = head_ptr(DO, bh, H, sdb, sdh)
    keys = key_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    k = load_rows(K, keys, skt, keys < T, D)
    v = load_rows(V, keys, svt, keys < T, D)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    first_row = tl.load(FIRST_ROW + bh * tl.num_programs(0) + key_tile)
    for r0 in range(first_row // BLOCK_M * BLOCK_M, n_rows, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        pos, is_gated = _load_rows_of(POS, FIRST_VALID, bh, rows, n_rows)
        q_t = load_rows_t(Q, pos, sqt, is_gated, D)
        do = load_rows(DO, rows, sdt, is_gated, D)
        lse = tl.load(LSE + bh * n_rows + rows, mask=is_gated, other=0.0)
        delta = tl.load(DELTA + bh * n_rows + rows, mask=is_gated, other=0.0)
        visible_t = is_gated[None, :] & (keys[:, None] <= pos[None, :])
        p_t, ds_t = key_grads(k, v, q_t, do, lse, delta, visible_t, qk_scale, PREC)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PREC)
        dk += tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), input_precision=PREC)
    in_seq = keys < T
    store_rows(DK + bh.to(tl.int64) * T * D, keys, D, (dk * sm_scale).to(DK.dtype.element_ty), in_seq, D)
    store_rows(DV + bh.to(tl.int64) * T * D, keys, D, dv.to(DV.dtype.element_ty), in_seq, D)


# Custom ops, as in triton_local.py: opaque to torch.compile, traced by their fake (shape-only) versions.
@torch.library.custom_op("nanoaha::triton_global_fwd", mutates_args=())
def global_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                   first_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """pos (B * H, n_rows) int32, first_valid (B * H,) int32 -> the compacted rows' output and log-sum-exp."""
    B, H, T, D = q.shape
    n_rows = pos.shape[-1]
    cfg = launch_config(D, q.dtype)
    o = output_buffer((B, H, n_rows, D), q.device, q.dtype)
    lse = output_buffer((B * H, n_rows), q.device, torch.float32)
    _global_fwd_kernel[(triton.cdiv(n_rows, cfg["BLOCK_M"]), B * H)](
        q, k, v, pos, first_valid, o, lse, *bht_strides(q), *bht_strides(k), *bht_strides(v),
        H, T, n_rows, D ** -0.5 * LOG2E, D=D, PREC=dot_precision(q.dtype), **cfg)
    return o, lse


@global_forward.register_fake
def _(q, k, v, pos, first_valid):
    B, H, T, D = q.shape
    n_rows = pos.shape[-1]
    return q.new_empty((B, H, n_rows, D)), q.new_empty((B * H, n_rows), dtype=torch.float32)


@torch.library.custom_op("nanoaha::triton_global_bwd", mutates_args=())
def global_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                    first_valid: torch.Tensor, o: torch.Tensor,
                    lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, H, T, D = q.shape
    n_rows = pos.shape[-1]
    cfg = launch_config(D, q.dtype)
    do = rows_contiguous(do)
    delta = row_dot(do, o)
    key_tile_starts = torch.arange(0, T, cfg["BLOCK_N"], device=q.device, dtype=torch.int32)
    first_row = torch.searchsorted(pos, key_tile_starts.expand(B * H, -1).contiguous(), out_int32=True)
    first_row = torch.maximum(first_row, first_valid[:, None])  # padding rows (position 0) come first
    dq = torch.zeros(q.shape, device=q.device, dtype=q.dtype)  # ungated rows get no gradient here
    dk = output_buffer(k.shape, k.device, k.dtype)
    dv = output_buffer(v.shape, v.device, v.dtype)
    strides = (*bht_strides(q), *bht_strides(k), *bht_strides(v), *bht_strides(do))
    scales = (D ** -0.5, D ** -0.5 * LOG2E)
    _global_bwd_dq_kernel[(triton.cdiv(n_rows, cfg["BLOCK_M"]), B * H)](
        q, k, v, pos, first_valid, do, lse, delta, dq, *strides, H, T, n_rows, *scales,
        D=D, PREC=dot_precision(q.dtype), **cfg)
    _global_bwd_dkdv_kernel[(triton.cdiv(T, cfg["BLOCK_N"]), B * H)](
        q, k, v, pos, first_valid, do, lse, delta, first_row, dk, dv, *strides, H, T, n_rows, *scales,
        D=D, PREC=dot_precision(q.dtype), **cfg)
    return dq, dk, dv


@global_backward.register_fake
def _(do, q, k, v, pos, first_valid, o, lse):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _global_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)


def _global_autograd(ctx, grad_o, grad_lse):
    return (*global_backward(grad_o, *ctx.saved_tensors), None, None)


global_forward.register_autograd(_global_autograd, setup_context=_global_setup_context)


def global_attention(q, k, v, pos, valid):
    """(q, k, v: (B, H, T, D), pos, valid: (B, H, n_rows) from compact_gates) -> full causal output of the
    compacted rows, (B, H, n_rows, D); padding rows hold zeros."""
    B, H, n_rows = pos.shape
    first_valid = (n_rows - valid.sum(-1)).reshape(B * H).to(torch.int32)
    return global_forward(q, k, v, pos.reshape(B * H, n_rows).to(torch.int32), first_valid)[0]
