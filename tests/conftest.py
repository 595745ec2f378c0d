import os
import sys

import numpy as np
import pytest
import torch

# Without CUDA the Triton kernels run in Triton's interpreter. triton.jit picks the interpreter when a kernel is
# defined, so TRITON_INTERPRET must be set before anything imports the kernels: here, when pytest loads this
# file, before it imports any test module. (tests/test_triton_compile.py runs the compiler in a subprocess
# without it.)
if not torch.cuda.is_available():
    assert "kernels.triton_common" not in sys.modules, "Triton kernels were imported before TRITON_INTERPRET=1"
    os.environ["TRITON_INTERPRET"] = "1"

from data.tokens import write_meta, write_tokens  # noqa: E402


@pytest.fixture
def tiny_corpus(tmp_path):
    """A byte-level corpus of repetitive Python-like lines: a small model learns it in a few steps."""
    rng = np.random.default_rng(0)
    lines = [f"def f{i}(x):\n    return x + {i}\n" for i in range(40)]
    docs = ["".join(rng.choice(lines, 30)) for _ in range(12)]
    for split, part in (("train", docs[:10]), ("val", docs[10:])):
        write_tokens(str(tmp_path), split, (np.frombuffer(d.encode(), dtype=np.uint8) for d in part), np.uint16, 0)
    write_meta(str(tmp_path), {"encoding": "bytes", "vocab_size": 256, "dtype": "uint16", "eot_token": 0})
    return tmp_path
