"""Compile the Triton kernels for a GPU that need not be present, and read back what they ask of it.

Triton's compiler and the ptxas/cuobjdump shipped in its wheel turn each kernel into a cubin for a chosen
architecture (default sm_90: H100/H200) with the tile sizes and launch options the GPU path uses
(triton_common.gpu_launch_config). That catches what the CPU interpreter cannot: code the compiler rejects,
shared memory over the limit, register spills, matmuls that miss the tensor cores. It says nothing about
speed.

Under TRITON_INTERPRET=1 triton.jit hands out interpreted functions that cannot be compiled, so run this in a
process without it (tests/test_triton_compile.py uses a subprocess; bench/compile_kernels.py prints the table).
"""
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.triton_common import ROW_DOT_BLOCK, _row_dot_kernel, dot_precision, gpu_launch_config
from kernels.triton_global import _global_bwd_dkdv_kernel, _global_bwd_dq_kernel, _global_fwd_kernel
from kernels.triton_local import _local_bwd_dkdv_kernel, _local_bwd_dq_kernel, _local_fwd_kernel

KERNELS = (_local_fwd_kernel, _local_bwd_dq_kernel, _local_bwd_dkdv_kernel,
           _global_fwd_kernel, _global_bwd_dq_kernel, _global_bwd_dkdv_kernel, _row_dot_kernel)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Argument naming in the kernels: upper case = pointer (except the sizes H and T), "*_scale" = float, any other
# lower-case name = int. These buffers have a fixed element type; every other pointer has the inputs' dtype.
FP32_BUFFERS = {"LSE", "DELTA", "DK_SINK", "DV_SINK", "OUT"}
INT32_BUFFERS = {"POS", "FIRST_VALID", "FIRST_ROW"}
MAX_SHARED_BYTES = {90: 227 * 1024}  # per block, opt-in maximum (H100/H200)


@dataclass
class Resources:
    kernel: str
    dtype: str
    head_dim: int
    registers: int       # per thread
    spill_bytes: int     # per thread: stack frame (register spills), 0 when everything fits in registers
    shared_bytes: int    # per block, as Triton will request it at launch
    tensor_cores: str    # "wgmma" (Hopper's), "mma" (the older kind) or "no" (tl.dot on FMA units, or no tl.dot)


def _signature(fn, dtype, constexprs):
    """Argument types as the launcher would infer them for contiguous tensors: pointers and strides marked
    16-divisible (as Triton specialises aligned ones), sizes left unspecialised."""
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.isupper() and name not in ("H", "T"):
            signature[name] = "*fp32" if name in FP32_BUFFERS else "*i32" if name in INT32_BUFFERS else "*" + dtype
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name.endswith("scale"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name.startswith("s"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, attrs


def compile_kernel(fn, dtype, head_dim, arch=90):
    """Compile one kernel for sm_<arch> with the GPU launch configuration and return its Resources."""
    cfg = gpu_launch_config(head_dim, DTYPES[dtype])
    if fn is _row_dot_kernel:  # launched with its own row tile and default options (triton_common.row_dot)
        constexprs, options = dict(D=head_dim, BLOCK_M=ROW_DOT_BLOCK), {}
    else:
        constexprs = dict(D=head_dim, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                          PREC=dot_precision(DTYPES[dtype]))
        options = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    signature, attrs = _signature(fn, dtype, constexprs)
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                              options=options)
    registers, spill_bytes = _cubin_usage(compiled.asm["cubin"])
    return Resources(fn.__name__, dtype, head_dim, registers, spill_bytes, compiled.metadata.shared,
                     _tensor_cores(compiled.asm["ptx"]))


def _tensor_cores(ptx):
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    return "mma" if re.search(r"\bmma\.sync", ptx) else "no"


def _cubin_usage(cubin):
    """Registers and stack bytes per thread, from `cuobjdump -res-usage` (shipped with Triton)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        report = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    usage = re.search(r"REG:(\d+) STACK:(\d+)", report)
    if usage is None:
        raise RuntimeError(f"no resource usage in cuobjdump's report:\n{report}")
    return int(usage.group(1)), int(usage.group(2))
