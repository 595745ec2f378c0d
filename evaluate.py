"""Evaluate checkpoints on the same fixed validation tokens: val loss, perplexity or bits per byte, the loss on
key tokens (targets a copy could predict only from beyond the local window) and on the others, global
fraction (overall, per layer, per head), attention FLOPs (ideal and computed), KV-cache bytes, a router-
threshold sweep for learned routers, and on synthetic tasks answer accuracy and router precision/recall.

    python evaluate.py out/quickstart out/local [--data_dir=data/python_stdlib] [--out_dir=out/eval]
    python evaluate.py out/grid/ --thresholds=0.2,0.5,0.8 --context_length=8192 --dtype=bfloat16
    python evaluate.py out/recall_routed --data_dir=data/recall

A path is a checkpoint file, a run folder (its ckpt.pt) or a folder of run folders. With --out_dir, each run's
JSON goes to OUT_DIR/<run>.json and the table to OUT_DIR/eval.md; without it, each JSON goes next to its
checkpoint as eval.json and the table is only printed.

Each JSON records the settings that decide its numbers ("settings": data_dir, eval_tokens, thresholds,
router_threshold, context_length, batch_size, max_examples, key_k, key_window, dtype; one added later reads as
the value it was evaluated at). A JSON written with other settings is
never replaced silently: evaluate.py refuses, before evaluating anything, unless told --overwrite (or write the
new evaluation elsewhere with --out_dir). A grid run's eval.json belongs to its grid: compare.py re-evaluates a run
whose eval.json has other settings than the grid's (docs/evaluation.md).
"""
import json
import os
import sys

from data.atomic_files import atomic_write, write_json
from nanoaha.configurator import paths_and_settings
from nanoaha.formats import stamp
from nanoaha.key_tokens import check_key_k
from nanoaha.evaluation import (SETTINGS, EvalConfig, check_key_window, check_out_dir, check_thresholds,
                                eval_settings, evaluate_checkpoint, find_checkpoints, format_result, markdown_table,
                                recorded_settings, run_name, threshold_list, trained_data_dir)


def check_replace(path, settings, overwrite):
    """Refuse to replace the evaluation at path when it was written with other settings (unless overwrite)."""
    if overwrite or not os.path.exists(path):
        return
    try:
        with open(path) as f:
            old = recorded_settings(json.load(f))
    except (json.JSONDecodeError, UnicodeDecodeError):
        old = None
    if old == settings:
        return
    differ = "its settings are unrecorded" if not isinstance(old, dict) else "other " + ", ".join(
        f"{key} ({old.get(key)!r}, not {settings[key]!r})" for key in SETTINGS if old.get(key) != settings[key])
    raise ValueError(f"{path} holds an evaluation with {differ}: pass --overwrite to replace it, or write this "
                     f"one elsewhere with --out_dir=DIR")


def write_result(result, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_json(path, stamp("evaluation", result), indent=2)
    print(f"wrote {path}")


def main(argv):
    paths, cfg = paths_and_settings(argv, EvalConfig, usage=__doc__)
    if not paths:
        sys.exit("name at least one checkpoint: python evaluate.py CKPT_OR_DIR [CKPT_OR_DIR ...] [--key=value ...]")
    thresholds = threshold_list(cfg.thresholds)
    try:
        check_thresholds(thresholds)
        check_key_k(cfg.key_k)
        check_key_window(cfg.key_window)
        check_out_dir(cfg.out_dir)
        checkpoints = find_checkpoints(paths)
        names = [run_name(path) for path in checkpoints]
        if cfg.out_dir and len(set(names)) < len(names):
            raise ValueError(f"two checkpoints share a run name (their folder's name) in {names}: "
                             f"evaluate them into separate --out_dir folders")
        data_dir = cfg.data_dir or trained_data_dir(checkpoints[0])
        settings = eval_settings(cfg, data_dir)
        targets = [os.path.join(cfg.out_dir, f"{name}.json") if cfg.out_dir else
                   os.path.join(os.path.dirname(path), "eval.json") for name, path in zip(names, checkpoints)]
        for target in targets:  # before any evaluation: a refusal costs nothing
            check_replace(target, settings, cfg.overwrite)
        results = []
        for path, target in zip(checkpoints, targets):
            result = evaluate_checkpoint(
                path, data_dir, thresholds, context_length=cfg.context_length, eval_tokens=cfg.eval_tokens,
                batch_size=cfg.batch_size, device=cfg.device, dtype=cfg.dtype, router_threshold=cfg.router_threshold,
                max_examples=cfg.max_examples, key_k=cfg.key_k, key_window=cfg.key_window, log=print,
                progress=sys.stderr.isatty())
            print(format_result(result, cfg.dtype))
            write_result({**result, "settings": settings}, target)
            results.append(result)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    table = markdown_table(results, cfg.dtype)
    print(table)
    if cfg.out_dir:
        def write(tmp):
            with open(tmp, "w") as f:
                f.write(table)
        atomic_write(os.path.join(cfg.out_dir, "eval.md"), write)


if __name__ == "__main__":
    main(sys.argv[1:])
