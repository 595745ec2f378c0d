"""Tiny Shakespeare at the character level (vocab 66: 65 characters and the end-of-text token).

    python data/shakespeare_char/prepare.py [--input=PATH_OR_URL]

Same file and split as data/shakespeare/prepare.py, which documents the options.
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from data.prepare import run_preparer  # noqa: E402
from data.shakespeare.prepare import main  # noqa: E402

if __name__ == "__main__":
    run_preparer(lambda argv: main(argv, "char", os.path.dirname(os.path.abspath(__file__))), sys.argv[1:])
