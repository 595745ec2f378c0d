"""Compile every Triton kernel for a GPU architecture without the GPU (kernels/triton_compile.py) and print
registers, spills and shared memory per kernel, dtype and head dim: a markdown table, or JSON for the tests.

    python bench/compile_kernels.py                          (sm_90, bf16/fp16/fp32, D = 16..128; ~1.5 min cold)
    python bench/compile_kernels.py --dtypes=bf16 --json
"""
import argparse
import dataclasses
import json
import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("bench/compile_kernels.py compiles kernels; unset TRITON_INTERPRET (the interpreter cannot compile)")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kernels.triton_compile import DTYPES, KERNELS, MAX_SHARED_BYTES, compile_kernel  # noqa: E402
from nanoaha.formatting import human_bytes  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90 = H100/H200)")
    parser.add_argument("--dtypes", default="bf16,fp16,fp32", help=f"comma-separated, from {list(DTYPES)}")
    parser.add_argument("--head_dims", default="16,32,64,128")
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of the table")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        parser.error(f"unknown dtypes {unknown}; choose from {list(DTYPES)}")
    rows = [compile_kernel(fn, dtype, int(d), args.arch)
            for dtype in dtypes for d in args.head_dims.split(",") for fn in KERNELS]
    limit = MAX_SHARED_BYTES.get(args.arch)
    if args.json:
        print(json.dumps(dict(arch=args.arch, max_shared_bytes=limit, kernels=[dataclasses.asdict(r) for r in rows])))
        return
    print(f"sm_{args.arch}, launch configs of kernels/triton_common.gpu_launch_config; "
          f"shared-memory limit per block: {human_bytes(limit) if limit else '?'}\n")
    print("| kernel | dtype | D | registers | spilled bytes | shared KiB | tensor cores |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.kernel} | {r.dtype} | {r.head_dim} | {r.registers} | {r.spill_bytes} | "
              f"{r.shared_bytes / 1024:.1f} | {r.tensor_cores} |")


if __name__ == "__main__":
    main()
