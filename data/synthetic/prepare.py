"""Write a synthetic long-range task (data/synthetic/tasks.py) as token files that train.py reads directly.

    python data/synthetic/prepare.py --task=recall --block_size=512 --window=32 --n_pairs=4 --n_queries=4 --out_dir=data/recall
    python data/synthetic/prepare.py --task=recall --window=32 --n_sink=4   # labels for a model with 4 sinks
    python data/synthetic/prepare.py --task=copy --block_size=256 --span_len=8 --min_distance=64
    python data/shakespeare_char/prepare.py && python data/synthetic/prepare.py --task=needle \\
        --text_dir=data/shakespeare_char --block_size=512 --value_len=3
    python data/synthetic/prepare.py --task=recall --text_dir=data/shakespeare --text_ratio=0.5   # mixed with text

Options: the fields of SyntheticConfig below and of the task's class in tasks.py, as --key=value (or a config
file of plain Python assignments). Output, in out_dir: train.bin and val.bin hold examples of block_size + 1
tokens back to back (meta.json 'example_len'), so a training window is exactly one example; beside each, uint8
arrays with one entry per token, described in meta.json 'token_arrays':
  <split>.answer.bin        1 where the token is an answer the task scores
  <split>.needs_global.bin  1 where predicting the token needs context beyond `window` tokens that is not one
                            of the first `n_sink` tokens (the sinks a local query also reads), 0 where not,
                            255 where unknown (real text)
  <split>.loss_mask.bin     1 where the token carries loss (loss_on='answers': answers and mixed-in text only)
With text_dir, a fraction text_ratio of the examples are plain windows of that corpus (the same split), and the
task's tokens get ids after the corpus's vocabulary.

A re-run replaces out_dir's files only when the new ones are complete (a failure or Ctrl-C leaves the previous
task data whole, see data/prepare.py). What a task corpus is: meta.json's 'task' and 'encoding' ('synthetic', or
the encoding of the text_dir it mixes in); a re-run may change every other option, but a folder that holds
another task or encoding (or a text corpus) is replaced only with --overwrite.
"""
import contextlib
import dataclasses
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from nanoaha.configurator import ConfigError, help_text, parse_args  # noqa: E402
from data.synthetic.tasks import TASKS, UNKNOWN, needs_global  # noqa: E402
from data.prepare import run_preparer  # noqa: E402
from data.tokens import (TokenWriter, check_replaceable, read_meta, replacing_corpus, token_dtype,  # noqa: E402
                         token_path, write_meta)

ARRAYS = {
    "answer": "1 where the token is an answer the task scores",
    "needs_global": "1 where predicting the token needs context beyond `window` tokens back that is not one of "
                    "the first `n_sink` tokens of the example, 0 where it does not, 255 where unknown (real text)",
    "loss_mask": "1 where the token carries loss, 0 where the loader sets its target to -1",
}


@dataclass
class SyntheticConfig:
    task: str = "recall"      # 'recall' (multi-query associative recall), 'copy', 'needle'
    out_dir: str = ""         # default: data/<task>
    block_size: int = 256     # examples are block_size + 1 tokens
    window: int = 32          # the needs_global labels are for this window ...
    n_sink: int = 0           # ... and this many attention sinks (the first positions, which local queries read)
    n_train: int = 20000      # examples
    n_val: int = 500
    seed: int = 0
    loss_on: str = "answers"  # 'answers': only answer tokens (and mixed-in text) carry loss; 'all': every token
    text_dir: str = ""        # a prepared corpus: the needle task's haystack, and the text mixed in
    text_ratio: float = 0.0   # fraction of examples that are plain text windows (needs text_dir)
    overwrite: bool = False   # replace a corpus of another task or encoding that out_dir holds


def text_windows(text_dir, split, length):
    """A function rng -> a random window of `length` tokens of the corpus's split."""
    tokens = np.memmap(token_path(text_dir, split), dtype=np.dtype(read_meta(text_dir)["dtype"]), mode="r")
    if len(tokens) < length:
        raise ValueError(f"{token_path(text_dir, split)} holds {len(tokens)} tokens, fewer than an example "
                         f"({length}): use a smaller block_size or a larger corpus")

    def window(rng):
        start = rng.integers(len(tokens) - length + 1)
        return np.asarray(tokens[start:start + length])
    return window


def array_names(cfg):
    return [name for name in ARRAYS if name != "loss_mask" or cfg.loss_on == "answers"]


def write_split(cfg, task, split, n_examples, offset, dtype, out_dir):
    """Writes the split's examples and arrays to out_dir; returns the number of plain text examples among them."""
    length = cfg.block_size + 1
    text = text_windows(cfg.text_dir, split, length) if cfg.text_dir else None
    rng = np.random.default_rng([cfg.seed, ["train", "val"].index(split)])
    n_text = 0
    with contextlib.ExitStack() as stack:
        tokens = stack.enter_context(TokenWriter(token_path(out_dir, split), dtype))
        writers = {name: stack.enter_context(TokenWriter(token_path(out_dir, split, name), np.uint8))
                   for name in array_names(cfg)}
        for _ in range(n_examples):
            if cfg.text_ratio and rng.random() < cfg.text_ratio:
                n_text += 1
                example_tokens, answer, source = text(rng), np.zeros(length), np.full(length, UNKNOWN)
                loss_mask = np.ones(length)
            else:
                example_tokens, answer, source = task.example(rng, length, offset, text(rng) if text else None)
                loss_mask = answer
            tokens.write(example_tokens)
            labels = needs_global(source, cfg.window, cfg.n_sink)
            values = {"answer": answer, "needs_global": labels, "loss_mask": loss_mask}
            for name, writer in writers.items():
                writer.write(values[name])
    return n_text


def generate(cfg, task):
    """Writes cfg.out_dir's token files and meta.json; returns the meta dict."""
    if cfg.task not in TASKS or not isinstance(task, TASKS[cfg.task]):
        raise ValueError(f"task={cfg.task!r}: choose one of {', '.join(TASKS)}")
    task.validate()
    if cfg.window < 1 or not 0 <= cfg.n_sink <= cfg.window:
        raise ValueError(f"need window >= 1 (window={cfg.window}) and 0 <= n_sink <= window (n_sink={cfg.n_sink}), "
                         f"as a model's local attention does")
    if cfg.loss_on not in ("answers", "all"):
        raise ValueError(f"loss_on={cfg.loss_on!r}: use 'answers' or 'all'")
    if not 0 <= cfg.text_ratio < 1 or (cfg.text_ratio and not cfg.text_dir):
        raise ValueError(f"text_ratio={cfg.text_ratio} must be in [0, 1), and above 0 only with text_dir")
    if cfg.task == "needle" and not cfg.text_dir:
        raise ValueError("the needle task needs text_dir: a prepared corpus for the haystack, e.g. "
                         "python data/shakespeare_char/prepare.py, then --text_dir=data/shakespeare_char")
    text_meta = read_meta(cfg.text_dir) if cfg.text_dir else {}
    offset = text_meta.get("vocab_size", 0)
    vocab_size = offset + task.vocab_size
    dtype = token_dtype(vocab_size)
    meta = {"encoding": text_meta.get("encoding", "synthetic"), "vocab_size": vocab_size,
            "dtype": np.dtype(dtype).name, "eot_token": text_meta.get("eot_token"), "example_len": cfg.block_size + 1,
            "task": cfg.task, "task_config": asdict(task), "window": cfg.window, "n_sink": cfg.n_sink,
            "loss_on": cfg.loss_on,
            "task_tokens": {name: [offset + a, offset + b] for name, (a, b) in task.token_ranges().items()},
            "text_dir": cfg.text_dir, "text_ratio": cfg.text_ratio, "seed": cfg.seed,
            "token_arrays": {name: ARRAYS[name] for name in array_names(cfg)}}
    if "chars" in text_meta:
        meta["chars"] = text_meta["chars"]
    for split, n_examples in (("train", cfg.n_train), ("val", cfg.n_val)):
        if n_examples < 1:
            raise ValueError(f"n_{split}={n_examples}: need at least one example")
    check_replaceable(cfg.out_dir, meta, cfg.overwrite)
    with replacing_corpus(cfg.out_dir) as staging:
        for split, n_examples in (("train", cfg.n_train), ("val", cfg.n_val)):
            n_text = write_split(cfg, task, split, n_examples, offset, dtype, staging)
            meta.update({f"{split}_tokens": n_examples * (cfg.block_size + 1), f"{split}_examples": n_examples,
                         f"{split}_text_examples": n_text})
        write_meta(staging, meta)
    return meta


def parse(argv):
    """(SyntheticConfig, the chosen task) from --key=value arguments; a key of another task is an error."""
    cfg, *tasks = parse_args(argv, SyntheticConfig, *TASKS.values())
    if cfg.task not in TASKS:
        raise ConfigError(f"task={cfg.task!r}: choose one of {', '.join(TASKS)}")
    task = tasks[list(TASKS).index(cfg.task)]
    own = [f.name for f in dataclasses.fields(task)]
    for other in tasks:
        for f in dataclasses.fields(other):
            if f.name not in own and getattr(other, f.name) != f.default:
                raise ConfigError(f"{f.name} is not an option of task {cfg.task!r} (its options: {', '.join(own)})")
    cfg.out_dir = cfg.out_dir or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), cfg.task)
    return cfg, task


def main(argv):
    if any(arg in ("--help", "-h") for arg in argv):
        sys.exit(print(help_text(__doc__, SyntheticConfig, *TASKS.values())))
    config, chosen = parse(argv)
    result = generate(config, chosen)
    print(f"wrote {result['train_examples']:,} train and {result['val_examples']:,} val examples of "
          f"{result['example_len']} tokens ({config.task}, vocab {result['vocab_size']}, labels for window "
          f"{config.window}, {config.n_sink} sinks) to {config.out_dir}")


if __name__ == "__main__":
    run_preparer(main, sys.argv[1:])
