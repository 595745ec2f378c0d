"""Tiny Shakespeare (1.1 MB, the classic of char-rnn and nanoGPT), GPT-2 BPE by default.

Downloads the file once to <out_dir>/input.txt, or reads a local copy given with --input. Each speech (text
between blank lines) is a document, so the split into train and val is by speech.

    python data/shakespeare/prepare.py [--input=PATH_OR_URL] [--encoding=gpt2]
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from data.prepare import add_options, fetch, options, prepare_files, report, run_preparer  # noqa: E402

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def main(argv, encoding, out_dir):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", default=URL, help="a local copy of the file, or the URL to download it from")
    parser.add_argument("--out_dir", default=out_dir)
    add_options(parser, encoding)
    parser.set_defaults(val_fraction=0.1)
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    path = fetch(args.input, os.path.join(args.out_dir, "input.txt"))
    meta = prepare_files([path], args.out_dir, doc_separator="\n\n", source=args.input, **options(args))
    report(meta, args.out_dir)
    return meta


if __name__ == "__main__":
    run_preparer(lambda argv: main(argv, "gpt2", os.path.dirname(os.path.abspath(__file__))), sys.argv[1:])
