import importlib.util
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

# Without CUDA the Triton kernels run in Triton's interpreter. triton.jit picks the interpreter when a kernel is
# defined, so TRITON_INTERPRET must be set before anything imports the kernels: here, when pytest loads this
# file, before it imports any test module. (tests/e2e/test_triton_compile.py runs the compiler in a subprocess
# without it.)
if not torch.cuda.is_available():
    assert "kernels.triton_common" not in sys.modules, "Triton kernels were imported before TRITON_INTERPRET=1"
    os.environ["TRITON_INTERPRET"] = "1"

from data.tokens import Encoder, write_meta, write_tokens  # noqa: E402

# A shell starts background commands (`cmd &`, nohup, a CI runner's job) with SIGINT ignored, and a child keeps an
# ignored signal across exec: the scripts the tests start and send Ctrl-C (SIGINT) to would then ignore it, and
# the tests that check what Ctrl-C leaves would wait out their deadline. A handler is reset to the default in a
# child, so with Python's own handler here each script starts with Ctrl-C as a user's terminal gives it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

END_TO_END = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(items):
    """Every test under tests/e2e (it trains, spawns processes or runs Triton's interpreter) is `slow`, so
    `-m "not slow"` runs tests/unit alone: the fast loop."""
    for item in items:
        if END_TO_END in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def gpt2():
    """GPT-2's BPE encoder, or a skip saying why tiktoken cannot load it."""
    try:
        return Encoder("gpt2")
    except OSError as e:  # offline without the BPE files: set TIKTOKEN_CACHE_DIR (see the README)
        pytest.skip(str(e))


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


@pytest.fixture
def prepared_corpus(tmp_path):
    """tiny_corpus's kind of text, prepared by data/prepare.py (train and val split by documents)."""
    from helpers import byte_corpus
    return str(byte_corpus(tmp_path / "corpus"))


@pytest.fixture
def tiny_gpt2(tmp_path):
    """(a tiny GPT-2 built by transformers, 'hf:PATH' to import it from): the path init_from='gpt2' takes."""
    if importlib.util.find_spec("transformers") is None:  # importorskip would import it outside its scope
        pytest.skip("transformers is not installed")
    from nanoaha.gpt2_weights import import_transformers
    transformers = import_transformers()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=256, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # biases and norms away from their 0 / 1 init, so a missed one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path / "tiny_gpt2"
    model.save_pretrained(path)
    return model, f"hf:{path}"
