import numpy as np
import pytest

from data.tokens import write_meta, write_tokens


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
