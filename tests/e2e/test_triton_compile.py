"""The Triton kernels compile for the H100/H200 (sm_90) without a GPU, with the launch configuration the GPU
path uses, and fit it: shared memory under the per-block limit and, in bf16 (the training dtype on CUDA), no
register spills and tensor cores (wgmma) for every matmul. The interpreter tests cannot see any of this. The
compiler runs in a subprocess (bench/compile_kernels.py) without TRITON_INTERPRET, because tests/conftest.py
switches this process to the interpreter when there is no CUDA.
"""
import glob
import json
import os
import re

import pytest

from helpers import ROOT, run_script
from kernels.triton_common import HEAD_DIMS as TRITON_HEAD_DIMS


@pytest.fixture(scope="module")
def bf16_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    head_dims = ",".join(map(str, TRITON_HEAD_DIMS))
    done = run_script("bench/compile_kernels.py", "--arch=90", "--dtypes=bf16", f"--head_dims={head_dims}", "--json",
                      timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_kernel_compiles_for_every_head_dim(bf16_sm90):
    defined = set()
    for path in glob.glob(os.path.join(ROOT, "kernels", "triton_*.py")):
        defined |= set(re.findall(r"@triton\.jit\ndef (_\w+_kernel)\(", open(path).read()))
    compiled = {(r["kernel"], r["head_dim"]) for r in bf16_sm90["kernels"]}
    assert len(defined) >= 7
    assert compiled == {(name, d) for name in defined for d in TRITON_HEAD_DIMS}


def test_shared_memory_fits_and_nothing_spills(bf16_sm90):
    rows = bf16_sm90["kernels"]
    assert [r for r in rows if r["shared_bytes"] > bf16_sm90["max_shared_bytes"]] == []
    assert [r for r in rows if r["spill_bytes"] > 0] == []
    assert all(0 < r["registers"] <= 255 for r in rows)


def test_matmuls_run_on_hopper_tensor_cores(bf16_sm90):
    attention = [r["tensor_cores"] for r in bf16_sm90["kernels"] if r["kernel"] != "_row_dot_kernel"]
    assert attention and set(attention) == {"wgmma"}
