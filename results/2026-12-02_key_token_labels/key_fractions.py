"""The share of key tokens (nanoaha/key_tokens.py) in a corpus' val split, by local window and k: no model.

    python results/2026-12-02_key_token_labels/key_fractions.py data/python_stdlib --block_size 1024
    python results/2026-12-02_key_token_labels/key_fractions.py data/python_stdlib_gpt2 --block_size 512
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.loader import TokenData  # noqa: E402
from data.tokens import read_meta  # noqa: E402
from nanoaha.evaluation import distinct_val_windows  # noqa: E402
from nanoaha.key_tokens import batch_key_labels, default_key_k  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir")
    parser.add_argument("--block_size", type=int, default=1024)
    parser.add_argument("--windows", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--ks", type=int, nargs="+", default=None, help="default: the corpus' k, half and double")
    args = parser.parse_args()
    vocab = read_meta(args.data_dir)["vocab_size"]
    data = TokenData(args.data_dir, args.block_size, vocab)
    n = distinct_val_windows(data)
    x, y = data.batch("val", data.val_starts(n))  # every distinct window of the val split
    k0 = default_key_k(vocab)
    ks = args.ks or [max(1, k0 // 2), k0, 2 * k0]
    print(f"{args.data_dir}: {n} val windows of {args.block_size} tokens ({y.numel():,} targets); default k {k0}\n")
    print("| k | " + " | ".join(f"window {w}" for w in args.windows) + " |\n|---|" + "---|" * len(args.windows))
    for k in ks:
        shares = [batch_key_labels(x, y, k, w).float().mean().item() for w in args.windows]
        print(f"| {k} | " + " | ".join(f"{s:.1%}" for s in shares) + " |")


if __name__ == "__main__":
    main()
