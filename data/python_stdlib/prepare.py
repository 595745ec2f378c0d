"""The embedded default corpus: the Python standard library's own source, byte-level (vocab 256).

Needs no download. Files are found through sysconfig; tests and site-packages are left out. The split is by
file, deterministic: a file goes to val when the SHA-1 of its relative path falls in the val fraction.
Documents are separated by byte 0 (NUL), which does not occur in the source files.

    python data/python_stdlib/prepare.py [--val_fraction=0.05]
"""
import argparse
import hashlib
import os
import sys
import sysconfig
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from data.tokens import write_meta, write_tokens  # noqa: E402

EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
EOT = 0


def stdlib_files():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if EXCLUDED_DIRS.isdisjoint(parts) and not parts[-1].startswith("test_"):
            files.append(path)
    return root, files


def is_val(relative_path, val_fraction):
    digest = hashlib.sha1(str(relative_path).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64 < val_fraction


def prepare(out_dir, val_fraction=0.05):
    root, files = stdlib_files()
    if not files:
        raise RuntimeError(f"no Python source files found under {root}")
    splits = {"train": [], "val": []}
    for path in files:
        data = path.read_bytes().replace(b"\0", b"")
        splits["val" if is_val(path.relative_to(root), val_fraction) else "train"].append(data)
    meta = {"encoding": "bytes", "vocab_size": 256, "dtype": "uint16", "eot_token": EOT,
            "source": f"Python {sys.version.split()[0]} standard library at {root}"}
    for split, docs in splits.items():
        n_tokens, n_docs = write_tokens(out_dir, split, (np.frombuffer(d, dtype=np.uint8) for d in docs),
                                        np.uint16, EOT)
        meta[f"{split}_tokens"], meta[f"{split}_documents"] = n_tokens, n_docs
    write_meta(out_dir, meta)
    return meta


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--val_fraction", type=float, default=0.05)
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    meta = prepare(args.out_dir, args.val_fraction)
    print(f"wrote {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens "
          f"({meta['train_documents']} + {meta['val_documents']} files) to {args.out_dir}")
