"""FineWeb-Edu (educational web pages), streamed from the Hugging Face hub: no full download, stop at --max_tokens.

    pip install datasets    # optional dependency, only this corpus needs it
    python data/fineweb_edu/prepare.py --max_tokens=100_000_000 [--encoding=gpt2] [--num_proc=8]
    python data/fineweb_edu/prepare.py --local=shard.parquet      # files already on disk (.parquet, .jsonl)

Rows are documents (the 'text' field). The hub streams rows in a fixed order, so the same --max_tokens and --seed
give the same corpus.
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from data.prepare import add_options, options, prepare, prepare_files, report, run_preparer  # noqa: E402

DATASET, CONFIG = "HuggingFaceFW/fineweb-edu", "sample-10BT"


def hub_documents(dataset, config):
    try:
        import datasets
    except ImportError:
        raise ImportError("streaming from the hub needs the datasets package: pip install datasets "
                          "(or pass files already on disk with --local)") from None
    for row in datasets.load_dataset(dataset, name=config, split="train", streaming=True):
        yield row["text"]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=DATASET)
    parser.add_argument("--config", default=CONFIG, help="the dataset's subset, e.g. sample-10BT, sample-100BT")
    parser.add_argument("--local", nargs="+", default=None, help="read these .parquet/.jsonl files or folders instead")
    parser.add_argument("--out_dir", default=os.path.dirname(os.path.abspath(__file__)))
    add_options(parser)
    parser.set_defaults(max_tokens=100_000_000, val_fraction=0.005)
    args = parser.parse_args(argv)
    if args.local:
        meta = prepare_files(args.local, args.out_dir, **options(args))
    else:
        meta = prepare(lambda: hub_documents(args.dataset, args.config), args.out_dir,
                       source=f"{args.dataset} ({args.config}) on the Hugging Face hub", **options(args))
    report(meta, args.out_dir)
    return meta


if __name__ == "__main__":
    run_preparer(main, sys.argv[1:])
