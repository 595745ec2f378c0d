"""Pieces shared by the Triton attention kernels (kernels/triton_local.py, kernels/triton_global.py).

Layout: q, k, v, dO are (B, H, T, D) with any strides as long as the last dimension is contiguous; kernels get
(stride_b, stride_h, stride_t) per tensor. Buffers the kernels create are contiguous. Softmax runs in base 2
(scores scaled by log2(e) / sqrt(D)) and the saved log-sum-exp is in that base too. Accumulation is fp32.
"""
import math
import os

import torch
import triton
import triton.language as tl

HEAD_DIMS = (16, 32, 64, 128)  # the head dims the kernels are built and tested for (kernels.attention checks it)
LOG2E = 1.0 / math.log(2.0)

# Tests set this: every buffer a kernel must fill completely then starts as NaN, so an element left unwritten
# shows up in the comparison instead of passing with stale memory.
poison_buffers = False


def output_buffer(shape, device, dtype):
    if poison_buffers:
        return torch.full(shape, float("nan"), device=device, dtype=dtype)
    return torch.empty(shape, device=device, dtype=dtype)


def interpreting():
    return os.environ.get("TRITON_INTERPRET") == "1"


def launch_config(head_dim, dtype):
    """Tile sizes and launch options. The interpreter (CPU tests) uses 16-wide tiles so that small test
    sequences still span many tiles; on the GPU, gpu_launch_config."""
    if interpreting():
        return dict(BLOCK_M=16, BLOCK_N=16)
    return gpu_launch_config(head_dim, dtype)


def gpu_launch_config(head_dim, dtype):
    """16-bit inputs: 64 x 64 tiles keep the window overhead (w + BLOCK_M keys read per query tile instead of w)
    low while staying tensor-core friendly. fp32 (a correctness path; train in bf16) runs tl.dot on FMA units
    at "highest" precision, which needs more registers: 32 x 32 tiles (results/2026-11-29_sm90_compiled)."""
    if dtype == torch.float32:
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4 if head_dim <= 64 else 8, num_stages=2)


def dot_precision(dtype):
    """fp32 inputs follow torch.set_float32_matmul_precision, as torch's own matmuls do: exact fp32 products
    by default ("highest"), TF32 tensor cores when allowed. 16-bit inputs ignore the setting."""
    if dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
        return "ieee"
    return "tf32"


def check_inputs(q, k, v):
    if not (q.shape == k.shape == v.shape) or q.dim() != 4:
        raise ValueError(f"q, k, v must share one (B, H, T, D) shape, got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"triton attention supports head dims {HEAD_DIMS}, got {q.shape[-1]}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def rows_contiguous(x):
    """Kernels index rows by stride but assume the head dim is packed (autograd may hand over expanded grads)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def bht_strides(x):
    return x.stride(0), x.stride(1), x.stride(2)


@triton.jit
def head_ptr(ptr, bh, H, stride_b, stride_h):
    """Pointer to the (batch, head) slice bh = b * H + h; int64 so that big tensors do not overflow."""
    return ptr + (bh // H).to(tl.int64) * stride_b + (bh % H).to(tl.int64) * stride_h


@triton.jit
def load_rows(base, rows, stride_t, valid, D: tl.constexpr):
    """(len(rows), D) tile of rows at the given positions, zeros where not valid."""
    return tl.load(base + rows[:, None] * stride_t + tl.arange(0, D)[None, :], mask=valid[:, None], other=0.0)


@triton.jit
def store_rows(base, rows, stride_t, tile, valid, D: tl.constexpr):
    tl.store(base + rows[:, None] * stride_t + tl.arange(0, D)[None, :], tile, mask=valid[:, None])


@triton.jit
def softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, PREC: tl.constexpr):
    """One key tile of the online softmax. m_i starts at a large finite negative value (not -inf), so a row whose
    keys are all masked in this tile keeps alpha = 1 and p = 0 instead of producing NaN."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def softmax_finish(m_i, l_i, acc):
    """Normalised output and base-2 log-sum-exp. Rows with no visible key (padding only) get l = 0 and are
    turned into zeros rather than NaN."""
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    return acc / l_safe[:, None], m_i + tl.log2(l_safe)


@triton.jit
def score_grads(q, k, v, do, lse, delta, visible, qk_scale, PREC: tl.constexpr):
    """Probabilities p and score gradients ds = p * (dO v^T - rowsum(dO * O)) of a (query tile, key tile)
    pair, both (BLOCK_M, BLOCK_N) fp32 and zero where not visible."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    p = tl.exp2(tl.where(visible, s, float("-inf")) - lse[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)
    return p, p * (dp - delta[:, None])


@triton.jit
def load_rows_t(base, rows, stride_t, valid, D: tl.constexpr):
    """load_rows transposed, (D, len(rows)), read that way from memory rather than transposed in registers."""
    return tl.load(base + rows[None, :] * stride_t + tl.arange(0, D)[:, None], mask=valid[None, :], other=0.0)


@triton.jit
def key_grads(k, v, q_t, do, lse, delta, visible_t, qk_scale, PREC: tl.constexpr):
    """score_grads computed key-major: p^T and ds^T, (BLOCK_N, BLOCK_M), for the dK/dV loops, whose products
    dV += p^T dO and dK += ds^T Q then need no transposed score tiles."""
    s_t = tl.dot(k, q_t, input_precision=PREC) * qk_scale
    p_t = tl.exp2(tl.where(visible_t, s_t, float("-inf")) - lse[None, :])
    dp_t = tl.dot(v, tl.trans(do), input_precision=PREC)
    return p_t, p_t * (dp_t - delta[None, :])


ROW_DOT_BLOCK = 64  # rows per program of _row_dot_kernel


@triton.jit
def _row_dot_kernel(A, B, OUT, sab, sah, sat, sbb, sbh, sbt, H, n_rows,
                    D: tl.constexpr, BLOCK_M: tl.constexpr):
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = rows < n_rows
    a = load_rows(head_ptr(A, bh, H, sab, sah), rows, sat, valid, D).to(tl.float32)
    b = load_rows(head_ptr(B, bh, H, sbb, sbh), rows, sbt, valid, D).to(tl.float32)
    tl.store(OUT + bh * n_rows + rows, tl.sum(a * b, 1), mask=valid)


def row_dot(a, b):
    """rowsum(a * b) in fp32 for (B, H, n, D) tensors -> (B * H, n): the backward's delta = rowsum(dO * O),
    without materialising an fp32 product."""
    B, H, n, D = a.shape
    out = output_buffer((B * H, n), a.device, torch.float32)
    _row_dot_kernel[(triton.cdiv(n, ROW_DOT_BLOCK), B * H)](a, b, out, *bht_strides(a), *bht_strides(b), H, n,
                                                           D=D, BLOCK_M=ROW_DOT_BLOCK)
    return out
