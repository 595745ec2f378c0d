"""The embedded default corpus: the Python standard library's own source, one document per file.

Needs no download. Files are found through sysconfig; tests and site-packages are left out. Byte-level by
default (vocab 256, end-of-text = byte 0, which does not occur in the source files), as configs/quickstart.py
expects; --encoding=gpt2 (or another) gives a BPE corpus instead.

    python data/python_stdlib/prepare.py [--encoding=bytes] [--val_fraction=0.05] [--out_dir=...]
"""
import argparse
import os
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from data.prepare import add_options, options, prepare_files, report, run_preparer  # noqa: E402

EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def stdlib_files():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if EXCLUDED_DIRS.isdisjoint(parts) and not parts[-1].startswith("test_") and path.stat().st_size:
            files.append(path)
    if not files:
        raise FileNotFoundError(f"no Python source files found under {root}")
    return root, files


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    add_options(parser, encoding="bytes")
    args = parser.parse_args(argv)
    root, files = stdlib_files()
    meta = prepare_files(files, args.out_dir, source=f"Python {sys.version.split()[0]} standard library at {root}",
                         **options(args))
    report(meta, args.out_dir)
    return meta


if __name__ == "__main__":
    run_preparer(main, sys.argv[1:])
