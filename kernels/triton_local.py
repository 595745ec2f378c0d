"""Sliding-window attention with sinks as Triton kernels (forward and backward).

Query t reads keys t-window+1 .. t (the "window" part) and the sink keys 0 .. n_sink-1 that lie before the
window (the "sink" part). The two parts are disjoint, so every kernel runs two loops with two masks:
  sink loop   keys s < n_sink with t - s >= window
  window loop keys s <= t with t - s < window
Each loop is bounded by n_sink or by window + tile size, so all work grows with T * (window + n_sink).

Backward: dQ per query tile (sink loop + window loop), dK/dV per key tile over the queries whose window covers
it. The sink keys are read by every later query, so their dK/dV through the sink part would need a loop over
all of T; the dQ kernel, which visits the sink keys of each query tile anyway, adds that part atomically into a
small fp32 buffer instead.
"""
import torch
import triton
import triton.language as tl

from kernels.triton_common import (LOG2E, bht_strides, check_inputs, dot_precision, head_ptr, key_grads,
                                   launch_config, load_rows, load_rows_t, output_buffer, row_dot, rows_contiguous,
                                   score_grads, softmax_finish, softmax_step, store_rows)


@triton.jit
def _window_start(m0, window, BLOCK_N: tl.constexpr):
    """First key tile the query tile starting at m0 reads through its window."""
    return tl.maximum(m0 - window + 1, 0) // BLOCK_N * BLOCK_N


@triton.jit
def _sink_end(m0, window, n_sink, BLOCK_M: tl.constexpr):
    """Sink keys reached past the window by some query of the tile: s <= last query - window."""
    return tl.minimum(n_sink, tl.maximum(m0 + BLOCK_M - window, 0))


@triton.jit
def _local_fwd_kernel(Q, K, V, O, LSE, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                      H, T, window, n_sink, qk_scale,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    m0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    Q = head_ptr(Q, bh, H, sqb, sqh)
    K = head_ptr(K, bh, H, skb, skh)
    V = head_ptr(V, bh, H, svb, svh)
    queries = m0 + tl.arange(0, BLOCK_M)
    in_seq = queries < T
    q = load_rows(Q, queries, sqt, in_seq, D)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in range(0, _sink_end(m0, window, n_sink, BLOCK_M), BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        k = load_rows(K, keys, skt, keys < n_sink, D)
        v = load_rows(V, keys, svt, keys < n_sink, D)
        visible = (keys[None, :] < n_sink) & (queries[:, None] - keys[None, :] >= window)
        m_i, l_i, acc = softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, PREC)
    for n0 in range(_window_start(m0, window, BLOCK_N), tl.minimum(T, m0 + BLOCK_M), BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        k = load_rows(K, keys, skt, keys < T, D)
        v = load_rows(V, keys, svt, keys < T, D)
        visible = (keys[None, :] <= queries[:, None]) & (queries[:, None] - keys[None, :] < window)
        m_i, l_i, acc = softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, PREC)
    out, lse = softmax_finish(m_i, l_i, acc)
    store_rows(O + bh.to(tl.int64) * T * D, queries, D, out.to(O.dtype.element_ty), in_seq, D)
    tl.store(LSE + bh * T + queries, lse, mask=in_seq)


@triton.jit
def _local_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, DK_SINK, DV_SINK,
                         sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                         H, T, window, n_sink, sm_scale, qk_scale,
                         D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    m0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    Q = head_ptr(Q, bh, H, sqb, sqh)
    K = head_ptr(K, bh, H, skb, skh)
    V = head_ptr(V, bh, H, svb, svh)
    DO = head_ptr(DO, bh, H, sdb, sdh)
    queries = m0 + tl.arange(0, BLOCK_M)
    in_seq = queries < T
    q = load_rows(Q, queries, sqt, in_seq, D)
    do = load_rows(DO, queries, sdt, in_seq, D)
    lse = tl.load(LSE + bh * T + queries, mask=in_seq, other=0.0)
    delta = tl.load(DELTA + bh * T + queries, mask=in_seq, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in range(0, _sink_end(m0, window, n_sink, BLOCK_M), BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        is_sink = keys < n_sink
        k = load_rows(K, keys, skt, is_sink, D)
        v = load_rows(V, keys, svt, is_sink, D)
        visible = in_seq[:, None] & is_sink[None, :] & (queries[:, None] - keys[None, :] >= window)
        p, ds = score_grads(q, k, v, do, lse, delta, visible, qk_scale, PREC)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
        sink_rows = bh * n_sink + keys
        cols = tl.arange(0, D)[None, :]
        tl.atomic_add(DV_SINK + sink_rows[:, None] * D + cols,
                      tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC), mask=is_sink[:, None])
        tl.atomic_add(DK_SINK + sink_rows[:, None] * D + cols,
                      tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC) * sm_scale, mask=is_sink[:, None])
    for n0 in range(_window_start(m0, window, BLOCK_N), tl.minimum(T, m0 + BLOCK_M), BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        k = load_rows(K, keys, skt, keys < T, D)
        v = load_rows(V, keys, svt, keys < T, D)
        visible = (in_seq[:, None] & (keys[None, :] <= queries[:, None])
                   & (queries[:, None] - keys[None, :] < window))
        p, ds = score_grads(q, k, v, do, lse, delta, visible, qk_scale, PREC)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    store_rows(DQ + bh.to(tl.int64) * T * D, queries, D, (dq * sm_scale).to(DQ.dtype.element_ty), in_seq, D)


@triton.jit
def _local_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                           sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                           H, T, window, sm_scale, qk_scale,
                           D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr):
    """dK, dV of a key tile through the window part only (the sink part comes from the dQ kernel)."""
    n0 = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    Q = head_ptr(Q, bh, H, sqb, sqh)
    K = head_ptr(K, bh, H, skb, skh)
    V = head_ptr(V, bh, H, svb, svh)
    DO = head_ptr(DO, bh, H, sdb, sdh)
    keys = n0 + tl.arange(0, BLOCK_N)
    k = load_rows(K, keys, skt, keys < T, D)
    v = load_rows(V, keys, svt, keys < T, D)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    # the tile's last key is still in the window of query n0 + BLOCK_N - 1 + window - 1
    for m0 in range(n0 // BLOCK_M * BLOCK_M, tl.minimum(T, n0 + BLOCK_N + window - 1), BLOCK_M):
        queries = m0 + tl.arange(0, BLOCK_M)
        in_seq = queries < T
        q_t = load_rows_t(Q, queries, sqt, in_seq, D)
        do = load_rows(DO, queries, sdt, in_seq, D)
        lse = tl.load(LSE + bh * T + queries, mask=in_seq, other=0.0)
        delta = tl.load(DELTA + bh * T + queries, mask=in_seq, other=0.0)
        visible_t = (in_seq[None, :] & (keys[:, None] <= queries[None, :])
                     & (queries[None, :] - keys[:, None] < window))
        p_t, ds_t = key_grads(k, v, q_t, do, lse, delta, visible_t, qk_scale, PREC)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PREC)
        dk += tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), input_precision=PREC)
    in_seq = keys < T
    store_rows(DK + bh.to(tl.int64) * T * D, keys, D, (dk * sm_scale).to(DK.dtype.element_ty), in_seq, D)
    store_rows(DV + bh.to(tl.int64) * T * D, keys, D, dv.to(DV.dtype.element_ty), in_seq, D)


# Custom ops (forward and backward, each opaque to torch.compile, with shape-only fake versions), so a compiled
# model traces through the attention call without a graph break.
@torch.library.custom_op("nanoaha::triton_local_fwd", mutates_args=())
def local_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                  n_sink: int) -> tuple[torch.Tensor, torch.Tensor]:
    B, H, T, D = q.shape
    cfg = launch_config(D, q.dtype)
    o = output_buffer((B, H, T, D), q.device, q.dtype)
    lse = output_buffer((B * H, T), q.device, torch.float32)
    _local_fwd_kernel[(triton.cdiv(T, cfg["BLOCK_M"]), B * H)](
        q, k, v, o, lse, *bht_strides(q), *bht_strides(k), *bht_strides(v),
        H, T, window, n_sink, D ** -0.5 * LOG2E, D=D, PREC=dot_precision(q.dtype), **cfg)
    return o, lse


@local_forward.register_fake
def _(q, k, v, window, n_sink):
    B, H, T, D = q.shape
    return q.new_empty((B, H, T, D)), q.new_empty((B * H, T), dtype=torch.float32)


@torch.library.custom_op("nanoaha::triton_local_bwd", mutates_args=())
def local_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, window: int, n_sink: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, H, T, D = q.shape
    cfg = launch_config(D, q.dtype)
    do = rows_contiguous(do)
    delta = row_dot(do, o)
    dq = output_buffer(q.shape, q.device, q.dtype)
    dk = output_buffer(k.shape, k.device, k.dtype)
    dv = output_buffer(v.shape, v.device, v.dtype)
    dk_sink = torch.zeros((B, H, n_sink, D), device=q.device, dtype=torch.float32)
    dv_sink = torch.zeros_like(dk_sink)
    strides = (*bht_strides(q), *bht_strides(k), *bht_strides(v), *bht_strides(do))
    scales = (D ** -0.5, D ** -0.5 * LOG2E)
    _local_bwd_dq_kernel[(triton.cdiv(T, cfg["BLOCK_M"]), B * H)](
        q, k, v, do, lse, delta, dq, dk_sink, dv_sink, *strides, H, T, window, n_sink, *scales,
        D=D, PREC=dot_precision(q.dtype), **cfg)
    _local_bwd_dkdv_kernel[(triton.cdiv(T, cfg["BLOCK_N"]), B * H)](
        q, k, v, do, lse, delta, dk, dv, *strides, H, T, window, *scales,
        D=D, PREC=dot_precision(q.dtype), **cfg)
    if n_sink:
        dk[:, :, :n_sink] += dk_sink.to(dk.dtype)
        dv[:, :, :n_sink] += dv_sink.to(dv.dtype)
    return dq, dk, dv


@local_backward.register_fake
def _(do, q, k, v, o, lse, window, n_sink):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _local_setup_context(ctx, inputs, output):
    q, k, v, window, n_sink = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.window, ctx.n_sink = window, n_sink


def _local_autograd(ctx, grad_o, grad_lse):
    dq, dk, dv = local_backward(grad_o, *ctx.saved_tensors, ctx.window, ctx.n_sink)
    return dq, dk, dv, None, None


local_forward.register_autograd(_local_autograd, setup_context=_local_setup_context)


def local_attention(q, k, v, window, n_sink=0):
    """Causal sliding-window attention plus sinks; (B, H, T, D) in, (B, H, T, D) out, q's dtype."""
    check_inputs(q, k, v)
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if n_sink > window:
        raise ValueError(f"n_sink={n_sink} must not exceed window={window}")
    n_sink = min(n_sink, q.shape[2])  # sinks past the end of the sequence do not exist
    return local_forward(rows_contiguous(q), rows_contiguous(k), rows_contiguous(v), window, n_sink)[0]
