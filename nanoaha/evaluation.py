"""Evaluate checkpoints on fixed validation tokens: val loss, perplexity (bits per byte on byte-level corpora),
the loss on key tokens and on the others (nanoaha/key_tokens.py), where routing went, attention FLOPs, KV-cache
bytes, a router-threshold sweep, and on synthetic tasks answer accuracy and the routers' precision and recall
against the needs_global labels. evaluate.py and compare.py report through here, prune.py measures with it.

Every checkpoint is scored on the same windows: ceil(eval_tokens / block_size) windows of block_size tokens,
evenly spaced over the val split (data/loader.py), under an RNG seeded 0 (random routing draws from it), so
two evaluations of a checkpoint give the same numbers to the last digit, and checkpoints of one block_size
see the same tokens.
"""
import copy
import dataclasses
import json
import math
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from model import Routing, trained_mode
from nanoaha.checkpoint import checkpoint_path, load_checkpoint, load_model
from data.loader import TokenData
from data.synthetic.tasks import UNKNOWN_LABEL
from data.tokens import read_meta
from nanoaha.device import autocast_context, pick_device, pick_dtype
from nanoaha.formats import portable_corpus_path, upgrade
from nanoaha.formatting import fixed, human_bytes, percent, signed
from nanoaha.key_tokens import batch_key_labels, check_key_k, resolve_key_k
from nanoaha.train_config import corpus_dir
from nanoaha.routing_stats import (kv_cache_bytes, label_counts, mean_stats, precision_recall, ratio, routing_stats,
                           routing_summary)

DEFAULT_THRESHOLDS = (0.1, 0.3, 0.5, 0.7, 0.9)
DEFAULT_EVAL_TOKENS = 65536  # 64 windows at block_size 1024 (python_stdlib's val split holds 404,002 tokens)


@dataclass
class EvalConfig:
    data_dir: str = ""                      # the corpus for every checkpoint; "": the first one's training corpus
    out_dir: str = ""                       # OUT_DIR/<run>.json + OUT_DIR/eval.md; "": eval.json beside each ckpt
    thresholds: tuple | list | float = DEFAULT_THRESHOLDS  # the sweep, for models with learned routers; () none
    context_length: int = 0                 # KV-cache bytes at this many positions; 0: each model's block_size
    eval_tokens: int = DEFAULT_EVAL_TOKENS  # ceil(eval_tokens / block_size) fixed val windows
    batch_size: int = 8
    max_examples: int = 500                 # synthetic tasks: the accuracy report's val examples
    key_k: int = 0                          # key tokens: k-gram length of a copy; 0: 8 byte-level, 4 BPE
    key_window: int = 0                     # key tokens: copies from beyond this window; 0: each model's own
    router_threshold: float | None = None   # evaluate at this threshold instead of the trained one
    device: str = "auto"
    dtype: str = "float32"                  # evaluation precision and the KV cache's element size
    overwrite: bool = False                 # replace a JSON written with other settings (else refuse)


SETTINGS = ("data_dir", "eval_tokens", "thresholds", "router_threshold", "context_length", "batch_size",
            "max_examples", "key_k", "key_window", "dtype")  # what decides the numbers; device and out_dir do not


def recorded_settings(result):
    """The settings an evaluation JSON records, in the current format (nanoaha/formats.py); None where it
    records none (or is not an evaluation)."""
    if not isinstance(result, dict) or not isinstance(result.get("settings"), dict):
        return None
    return upgrade("evaluation", copy.deepcopy(result))["settings"]


def eval_settings(cfg, data_dir):
    """The settings an evaluation records in its JSON ("settings"), as JSON reads them back: data_dir resolved
    ("" is the first checkpoint's training corpus) and portable (formats.portable_corpus_path), eval_tokens as asked for (the JSON's eval_tokens
    is what was used), thresholds as a list of floats."""
    values = {**{key: getattr(cfg, key) for key in SETTINGS}, "data_dir": portable_corpus_path(data_dir),
              "thresholds": [float(t) for t in threshold_list(cfg.thresholds)]}
    return json.loads(json.dumps(values))


def check_out_dir(out_dir):
    """Before any work: an --out_dir that names a file would fail only when the results are written."""
    if out_dir and os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out_dir={out_dir} is a file: name a folder (a missing one is created)")


def check_key_window(key_window):
    if key_window < 0:
        raise ValueError(f"key_window={key_window}: give the window key tokens lie beyond (>= 1), or 0 for each "
                         f"model's own")


def threshold_list(thresholds):
    """--thresholds as given (one number, or several) -> a list."""
    return [thresholds] if isinstance(thresholds, (int, float)) else list(thresholds)


def check_thresholds(thresholds):
    bad = [t for t in thresholds if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 1]
    if bad:
        raise ValueError(f"router threshold(s) {', '.join(map(repr, bad))} outside [0, 1]: a threshold is "
                         f"compared with a router probability; pass e.g. --thresholds=0.1,0.5,0.9")


def find_checkpoints(paths):
    """Checkpoint files from paths that are a checkpoint file, a run folder (holding ckpt.pt) or a folder of
    run folders (each of its sub-folders that holds a ckpt.pt, in name order)."""
    found = []
    for path in paths:
        if os.path.isdir(path) and not os.path.exists(checkpoint_path(path)):
            runs = sorted(d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, "ckpt.pt")))
            if not runs:
                raise FileNotFoundError(f"no checkpoint at {path}: neither {checkpoint_path(path)} nor a "
                                        f"sub-folder with a ckpt.pt; train one first (python train.py configs/NAME.py)")
            found += [os.path.join(path, d, "ckpt.pt") for d in runs]
        elif not os.path.isfile(checkpoint_path(path)):
            raise FileNotFoundError(f"no checkpoint at {checkpoint_path(path)}: train one first "
                                    f"(python train.py configs/NAME.py) or check the path")
        else:
            found.append(checkpoint_path(path))
    return found


def run_name(path):
    """A run is named after the folder its checkpoint lives in."""
    return os.path.basename(os.path.dirname(os.path.abspath(checkpoint_path(path))))


def trained_data_dir(path):
    """The corpus a checkpoint was trained on: train.py's data_dir, or data/<dataset>."""
    train_config = load_checkpoint(path, "cpu")["train_config"]
    return train_config["data_dir"] or corpus_dir("", train_config["dataset"])


def eval_data(data_dir, config, source):
    """The corpus as TokenData for a model of `config`, refusing one whose tokens the model cannot embed."""
    vocab = read_meta(data_dir)["vocab_size"]
    if vocab > config.vocab_size:
        raise ValueError(f"the corpus {data_dir} has vocab_size {vocab} but {source} only {config.vocab_size}: "
                         f"evaluate it on a corpus of its own tokenizer (--data_dir=...)")
    return TokenData(data_dir, config.block_size, config.vocab_size)


def distinct_val_windows(data):
    """How many distinct windows the val split holds: non-overlapping block_size windows (each also needs
    the next token as its last target), or its examples on a task with window starts."""
    starts = data.starts["val"]
    return max(1, (len(data.tokens("val")) - 1) // data.block_size if starts is None else len(starts))


def fixed_val_batches(data, eval_tokens, batch_size):
    """The fixed val windows: ceil(eval_tokens / block_size) of them, capped at the split's distinct windows
    (more would score overlapping windows, the same tokens again), in equal batches (routing_stats are averaged
    per batch)."""
    if eval_tokens < 1 or batch_size < 1:
        raise ValueError(f"eval_tokens={eval_tokens}, batch_size={batch_size}: both must be at least 1")
    n = min(-(-eval_tokens // data.block_size), distinct_val_windows(data))
    batch_size = min(batch_size, n)
    return data.val_batches(batch_size, n // batch_size)


def rng_devices(model):
    device = next(model.parameters()).device
    return [device] if device.type == "cuda" else []


def label_key_tokens(batches, config, vocab_size, key_k=0, key_window=0):
    """The key-token labels of the batches' targets ((B, T) bool per batch) for a model of config, its window
    (or key_window, when not 0: one label set for models of several windows) and sinks (a dense model's config
    has a window too: the labels are the text's), and the k used (key_k 0: the corpus' default, from its
    vocab_size)."""
    k = resolve_key_k(key_k, vocab_size)
    return [batch_key_labels(x, y, k, key_window or config.window, config.n_sink) for x, y in batches], k


def target_losses(logits, targets):
    """Each target's cross entropy (B, T), 0 where it is -1, from the logits (the model returns only the mean);
    one window at a time, so the float32 copy of the logits is one window's."""
    return torch.stack([F.cross_entropy(l.float(), t, ignore_index=-1, reduction="none")
                        for l, t in zip(logits, targets)])


def ratio_or_nan(total, count):
    return total / count if count else math.nan


def position_edges(block_size, window):
    """Where the loss-by-position buckets start, and block_size: [0, window) first, where each target's whole
    prefix lies inside the window (a local layer sees what a dense one sees, so a gap there is not long
    context), then doublings of the window up to block_size."""
    edges, edge = [0], max(1, window)
    while edge < block_size:
        edges.append(edge)
        edge *= 2
    return edges + [block_size]


def loss_by_position(sums, counts, edges):
    """The mean loss of each position bucket (positions from..to, inclusive) and its number of scored targets."""
    return [{"from": a, "to": b - 1, "loss": ratio_or_nan(total, n), "targets": n}
            for a, b, total, n in zip(edges, edges[1:], sums, counts)]


@torch.no_grad()
def evaluate_losses(model, batches, autocast=None, routing=None, key_labels=None, key_counts=None,
                    progress=None, decisions=None, edges=None):
    """The losses over the scored targets of the batches and their mean routing_stats, as ({'val_loss',
    'key_loss', 'other_loss', 'key_frac'}, stats). key_labels: a (B, T) bool per batch (label_key_tokens()); the
    loss over the key targets and over the others comes from the same forward passes as val_loss (nan for
    both without labels, and for a group without targets). Random routing draws from a forked RNG seeded 0:
    the same gates on every call, and the caller's RNG does not move. The model's train/eval mode is left as
    it was. Routed layers run 'sparse' here (no gradient): 'computed' FLOPs count the mode the model trains
    in, 'model_inference_flop_frac' what this evaluation computed. routing: a model.Routing for this evaluation
    (None: the model as trained; a threshold sweep, routers forced local or global). key_counts: a dict that gets,
    per (layer, head or 'any'), the routed gates' label_counts against the key labels (key_routing reads it).
    progress: called after each batch (a progress bar's update). decisions: a list that gets each batch's
    (gates, probs) (routing_stats.decision_stability reads it). edges: position_edges(); the result then has
    'loss_by_position' too (loss_by_position())."""
    device, training = next(model.parameters()).device, model.training
    model.eval()
    loss_sum, scored, key_sum, n_key, other_sum, stats = 0.0, 0, 0.0, 0, 0.0, []
    n_buckets = len(edges) - 1 if edges else 0
    position_sums, position_counts = [0.0] * n_buckets, [0] * n_buckets
    with torch.random.fork_rng(devices=rng_devices(model)):
        torch.manual_seed(0)
        for i, (x, y) in enumerate(batches):
            x, y = x.to(device), y.to(device)
            with autocast or nullcontext():
                out = model(x, y, routing)
            n = int((y != -1).sum())
            loss_sum, scored = loss_sum + out.lm_loss.item() * n, scored + n
            losses = target_losses(out.logits, y) if key_labels is not None or edges else None
            if edges:
                for j, (a, b) in enumerate(zip(edges, edges[1:])):  # unscored targets add 0
                    position_sums[j] += losses[:, a:b].sum().item()
                    position_counts[j] += int((y[:, a:b] != -1).sum())
            if key_labels is not None:
                is_key = key_labels[i].to(device)
                key_sum, n_key = key_sum + losses[is_key].sum().item(), n_key + int(is_key.sum())
                other_sum += losses[~is_key].sum().item()  # unscored targets add 0
                if key_counts is not None:
                    count_gates(key_counts, out.gates, torch.where(y.cpu() == -1, UNKNOWN_LABEL,
                                                                   key_labels[i].long()))
            stats.append(routing_stats(out, model.config, mode=trained_mode(model.config)))
            if decisions is not None:
                decisions.append((out.gates, out.probs))
            if progress:
                progress()
    model.train(training)
    labelled = key_labels is not None
    by_position = {"loss_by_position": loss_by_position(position_sums, position_counts, edges)} if edges else {}
    return {"val_loss": ratio_or_nan(loss_sum, scored),
            "key_loss": ratio_or_nan(key_sum, n_key) if labelled else math.nan,
            "other_loss": ratio_or_nan(other_sum, scored - n_key) if labelled else math.nan,
            "key_frac": ratio_or_nan(n_key, scored) if labelled else math.nan, **by_position}, mean_stats(stats)


def count_gates(counts, gates, labels):
    """Adds each routed layer's label_counts (the layer: a token any head sent global; and each head) against
    labels (B, T), aligned with the query positions that predict them, where the routers decide."""
    for layer, layer_gates in enumerate(gates):
        if layer_gates is None:
            continue
        layer_gates = layer_gates.cpu()
        for head, gate in [("any", layer_gates.any(1))] + list(enumerate(layer_gates.unbind(1))):
            counts[layer, head] = counts.get((layer, head), 0) + label_counts(gate, labels)


def routing_report(counts):
    """Per (layer, head or 'any') of summed label_counts: global fraction, precision and recall."""
    return [dict(layer=layer, head=head, **dict(zip(("global_frac", "precision", "recall"), precision_recall(c))))
            for (layer, head), c in counts.items()]


def evaluate_loss(model, batches, autocast=None, routing=None):
    """Mean LM loss over the scored targets of the batches and their mean routing_stats (evaluate_losses
    without key labels)."""
    losses, stats = evaluate_losses(model, batches, autocast, routing)
    return losses["val_loss"], stats


def finite(value):
    """A float for JSON: nan -> None."""
    return None if math.isnan(value) else value


def has_learned_router(config):
    return config.routing == "learned" and "routed" in config.kinds


def threshold_sweep(model, batches, thresholds, autocast=None, key_labels=None, progress=None):
    """Loss (and with key_labels the key and other loss), global fraction and attention FLOPs of one trained
    model at each router threshold; [] for a model without learned routers."""
    check_thresholds(thresholds)
    if not has_learned_router(model.config):
        return []
    rows = []
    for threshold in thresholds:
        losses, stats = evaluate_losses(model, batches, autocast, Routing(threshold=threshold), key_labels,
                                        progress=progress)
        summary = routing_summary(stats, model.config.kinds)
        split = {key: losses[key] for key in ("key_loss", "other_loss")} if key_labels is not None else {}
        rows.append({"threshold": float(threshold), "val_loss": losses["val_loss"], **split,
                     "global_frac": summary["global_frac"],
                     "attention_flop_frac_ideal": summary["attention_flop_frac_ideal"],
                     "attention_flop_frac_computed": summary["attention_flop_frac_computed"]})
    return rows


def forced_routing(model, batches, key_labels, autocast=None, progress=None):
    """The losses of a model with learned routers with every routed head forced global, and forced local (a
    threshold above every router probability): how much the key tokens gain from global attention; and with
    one routed layer at a time forced local, the others as trained ('local_layer{i}'): what each layer's global
    attention buys. Two passes and one per layer with a learned router; None for other models (as the
    threshold sweep)."""
    config = model.config
    if not has_learned_router(config):
        return None
    ways = [("global", Routing(force="global")), ("local", Routing(force="local"))]
    for layer, kind in enumerate(config.kinds):
        if kind == "routed" and config.routing == "learned":
            ways.append((f"local_layer{layer}", Routing(force="local", layers=frozenset({layer}))))
    forced = {}
    for name, how in ways:
        losses, _ = evaluate_losses(model, batches, autocast, how, key_labels, progress=progress)
        forced[name] = {key: losses[key] for key in ("val_loss", "key_loss", "other_loss")}
    return forced


def kv_cache_summary(config, context_length, bytes_per_element, window_heads=None):
    """KV-cache bytes of the model and of the all-dense model of its shape, at context_length positions;
    window_heads: the model's GPT.window_heads."""
    dense = config.with_schedule("G")
    return {"kv_cache_bytes": kv_cache_bytes(config, context_length, bytes_per_element, window_heads),
            "kv_cache_bytes_dense": kv_cache_bytes(dense, context_length, bytes_per_element),
            "context_length": context_length}


@torch.no_grad()
def evaluate_routing(model, data, split="val", max_examples=500, batch_size=16):
    """Answer loss (train.py's val loss, over these examples), answer accuracy (all, and split by whether the
    answer needs global context), the model's attention FLOPs vs dense (ideal and computed, nanoaha/routing_stats.py)
    and per routed layer the global fraction, precision and recall of its routing, for the layer ('any' head)
    and each head.

    A token counts as routed global in a layer when any head of the layer attended globally for it. Precision:
    of the tokens routed global, the fraction that need it; recall: of the tokens that need it, the fraction
    routed global. Tokens whose need is unknown (mixed-in real text) count in neither, but in the global
    fraction. Labels describe the prediction of a target, so they are aligned with the query position that
    makes it, where the router decides."""
    if "needs_global" not in data.arrays or "answer" not in data.arrays:
        raise ValueError(f"{data.data_dir} has no answer/needs_global labels: evaluate on a task written by "
                         f"data/synthetic/prepare.py")
    device = next(model.parameters()).device
    starts = data.starts[split][:max_examples].tolist()
    answers = torch.zeros(3, 2, dtype=torch.float64)  # rows: within window, needs global, unknown; (correct, all)
    loss_sum, scored = 0.0, 0  # over the targets that carry loss (y != -1: the answers)
    counts, stats = {}, []
    model.eval()
    with torch.random.fork_rng(devices=rng_devices(model)):  # random routing: the same draws each run
        torch.manual_seed(0)
        for i in range(0, len(starts), batch_size):
            batch = starts[i:i + batch_size]
            x, y = data.batch(split, batch)
            targets = data.windows(split, batch, 1)
            is_answer = data.token_array(split, "answer", batch) == 1
            labels = data.token_array(split, "needs_global", batch)
            out = model(x.to(device), y.to(device))
            stats.append(routing_stats(out, model.config, mode=trained_mode(model.config)))
            n_scored = int((y != -1).sum())
            loss_sum, scored = loss_sum + out.lm_loss.item() * n_scored, scored + n_scored
            correct = out.logits.argmax(-1).cpu() == targets
            for row, label in enumerate((0, 1, UNKNOWN_LABEL)):
                chosen = is_answer & (labels == label)
                answers[row] += torch.tensor([(correct & chosen).sum(), chosen.sum()])
            count_gates(counts, out.gates, labels)
    total, stats = answers.sum(0), mean_stats(stats)
    return {
        "examples": len(starts), "answers": int(total[1]), "answer_loss": loss_sum / scored if scored else math.nan,
        "accuracy": ratio(total[0], total[1]),
        "accuracy_within_window": ratio(*answers[0]), "accuracy_needs_global": ratio(*answers[1]),
        "answers_needs_global": int(answers[1, 1]),
        "routed_mode": model.config.routed_mode,
        "attention_flop_frac_ideal": stats["model_ideal_flop_frac"].item(),
        "attention_flop_frac_computed": stats["model_computed_flop_frac"].item(),
        "routing": routing_report(counts),
    }


def format_synthetic(report):
    """The synthetic-task report (evaluate_routing's dict, or its JSON form with None for nan) as lines."""
    lines = [f"{report['examples']} examples, {report['answers']} answer tokens "
             f"({report['answers_needs_global']} need context beyond the window)",
             f"answer loss {math.nan if report['answer_loss'] is None else report['answer_loss']:.4f}",
             f"answer accuracy {percent(report['accuracy']):>6}: "
             f"needs global {percent(report['accuracy_needs_global']):>6}, "
             f"within window {percent(report['accuracy_within_window']):>6}",
             f"attention FLOPs vs dense: ideal {percent(report['attention_flop_frac_ideal']):>6}, "
             f"computed {percent(report['attention_flop_frac_computed']):>6} (routed_mode {report['routed_mode']})"]
    if not report["routing"]:
        return "\n".join(lines + ["no routed layers: nothing to compare with the labels"])
    lines.append("layer  head  global  precision  recall")
    for row in report["routing"]:
        lines.append(f"{row['layer']:5}  {row['head']:>4}  {percent(row['global_frac']):>6}     "
                     f"{percent(row['precision']):>6}  {percent(row['recall']):>6}")
    return "\n".join(lines)


def data_notes(config, trained_on, meta):
    """Warnings about evaluating on data the model was not made for: synthetic labels prepared for another
    window or number of sinks, another task or corpus, another tokenizer."""
    notes = []
    if "task" in meta:
        label_local = (meta.get("window"), meta.get("n_sink", 0))
        if label_local != (config.window, config.n_sink):
            notes.append(f"note: the labels are for window {label_local[0]} and {label_local[1]} sinks, the model "
                         f"has window {config.window} and {config.n_sink} sinks; prepare the task with "
                         f"--window={config.window} --n_sink={config.n_sink} for matching labels")
    if (trained_on.get("task"), trained_on.get("source")) != (meta.get("task"), meta.get("source")):
        notes.append(f"note: the checkpoint was trained on {trained_on.get('task') or trained_on.get('source')}")
    if trained_on.get("encoding") != meta.get("encoding"):
        notes.append(f"note: the checkpoint's encoding is {trained_on.get('encoding')}, this corpus' "
                     f"{meta.get('encoding')}: its loss here means little")
    return notes


def json_ready(value):
    """nan -> None, recursively, so json.dump writes valid JSON."""
    if isinstance(value, float):
        return finite(value)
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def evaluate_checkpoint(path, data_dir="", thresholds=DEFAULT_THRESHOLDS, context_length=0,
                        eval_tokens=DEFAULT_EVAL_TOKENS, batch_size=8, device="cpu", dtype="float32",
                        router_threshold=None, max_examples=500, key_k=0, key_window=0, log=None, progress=False):
    """Everything evaluate.py reports about one checkpoint, as the JSON-ready dict it writes (README:
    "Evaluating and pruning"). data_dir "": the corpus the checkpoint was trained on. context_length 0: the
    model's block_size. dtype: the evaluation's precision and the KV cache's element size. key_k: the key-token
    rule's k (0: the corpus' default; nanoaha/key_tokens.py); key_window: the window the key tokens lie beyond
    (0: the model's). log: called with
    each line worth printing (what was evaluated on what, and warnings). progress: a progress bar on stderr over
    every pass's batches (the loss, each threshold of the sweep, the forced routings), gone when done."""
    check_thresholds(thresholds)
    if router_threshold is not None:
        check_thresholds([router_threshold])
    check_key_k(key_k)
    check_key_window(key_window)
    device = pick_device(device)
    torch_dtype = pick_dtype(dtype, device)
    autocast = autocast_context(device, torch_dtype)
    data_dir = data_dir or trained_data_dir(path)
    model, trained_on = load_model(path, device, router_threshold)
    config = model.config
    if key_window >= config.block_size:
        raise ValueError(f"key_window={key_window} is not below the block_size={config.block_size} of "
                         f"{checkpoint_path(path)}: no target of a window lies beyond it; give a smaller "
                         f"--key_window (0: the model's window, {config.window})")
    data = eval_data(data_dir, config, f"checkpoint {checkpoint_path(path)}")
    batches = fixed_val_batches(data, eval_tokens, batch_size)
    n_windows = sum(len(x) for x, _ in batches)
    context_length = context_length or config.block_size
    if context_length < 1:
        raise ValueError(f"context_length={context_length}: give a number of positions >= 1 (0: block_size)")
    if log:
        log(f"checkpoint {checkpoint_path(path)}: layers {config.layer_letters}, window {config.window}, "
            f"{config.n_sink} sinks, threshold {config.router_threshold}; data {data_dir}: "
            f"{data.meta.get('task') or data.meta.get('encoding')}, {n_windows} windows of {config.block_size} tokens")
        distinct = distinct_val_windows(data)
        if -(-eval_tokens // config.block_size) > distinct:
            log(f"note: eval_tokens={eval_tokens:,} is more than the val split holds: evaluating its {distinct:,} "
                f"distinct windows of {config.block_size} tokens ({n_windows * config.block_size:,} tokens)")
        for note in data_notes(config, trained_on, data.meta):
            log(note)
    labels, k = label_key_tokens(batches, config, data.meta["vocab_size"], key_k, key_window)
    if log and not any(label.any() for label in labels):
        log(no_key_tokens_note(k, key_window or config.window, config.block_size))
    key_counts = {}
    learned = has_learned_router(config)  # the sweep and the forced routings: a pass each, one per routed layer
    passes = 1 + (len(thresholds) + 2 + config.kinds.count("routed") if learned else 0)
    bar = tqdm(total=passes * len(batches), desc=f"evaluating {run_name(path)}", unit="batch", file=sys.stderr,
               disable=not progress, leave=False, dynamic_ncols=True)
    losses, stats = evaluate_losses(model, batches, autocast, key_labels=labels, key_counts=key_counts,
                                    progress=bar.update,
                                    edges=position_edges(config.block_size, key_window or config.window))
    loss = losses["val_loss"]
    byte_level = data.meta.get("encoding") == "bytes" and "task" not in data.meta
    result = {
        "checkpoint": checkpoint_path(path), "run": run_name(path), "layers": config.layer_letters,
        "model_config": dataclasses.asdict(config), "data_dir": data_dir, "encoding": data.meta.get("encoding"),
        "eval_tokens": n_windows * config.block_size,
        "val_loss": loss, "perplexity": math.exp(loss), "bits_per_byte": loss / math.log(2) if byte_level else None,
        **losses, "key_tokens": {"k": k, "window": key_window or config.window, "n_sink": config.n_sink},
        **routing_summary(stats, config.kinds),
        **kv_cache_summary(config, context_length, torch.finfo(torch_dtype).bits // 8, model.window_heads()),
        "threshold_sweep": threshold_sweep(model, batches, thresholds, autocast, labels, progress=bar.update),
        "forced_routing": forced_routing(model, batches, labels, autocast, progress=bar.update),
        # the routers against the key tokens, as the synthetic tasks' report against their labels
        "key_routing": routing_report(key_counts) if learned else [],
    }
    bar.close()
    if "task" in data.meta:
        result["synthetic"] = evaluate_routing(model, data, "val", max_examples, batch_size)
    return json_ready(result)


def no_key_tokens_note(k, window, block_size):
    """Why an evaluation found no key tokens (their loss is then blank)."""
    why = (f"a key token needs k + window < block_size, and {k} + {window} >= {block_size}"
           if k + window >= block_size else
           f"no {k}-token sequence of a window recurs, followed by the same token, from beyond {window} tokens back")
    return f"note: no key tokens (k {k}, window {window}): {why}; a smaller --key_k or --key_window finds some"


def minus(a, b):
    """a - b; None where either is missing (a loss over no targets)."""
    return None if a is None or b is None else a - b


def format_result(result, dtype="float32"):
    """The printed summary of one evaluate_checkpoint result (its threshold sweep is in markdown_table)."""
    r = result
    score = f"{r['bits_per_byte']:.4f} bits per byte" if r["bits_per_byte"] is not None else \
        f"perplexity {r['perplexity']:.3f}"
    lines = [f"val loss {r['val_loss']:.4f} | {score} | {r['eval_tokens']:,} tokens", key_token_line(r),
             position_line(r)]
    if r["forced_routing"]:
        every = {name: f for name, f in r["forced_routing"].items() if name in ("global", "local")}
        lines.append("forced " + " | forced ".join(f"{name}: val loss {fixed(f['val_loss'])}, key "
                                                   f"{fixed(f['key_loss'])}, other {fixed(f['other_loss'])}"
                                                   for name, f in every.items()))
        layers = [(int(name[len("local_layer"):]), f) for name, f in r["forced_routing"].items()
                  if name.startswith("local_layer")]
        if layers:
            lines.append("one layer's routers forced local, loss minus trained (what its global attention buys): " +
                         " | ".join(f"layer {i}: val {signed(minus(f['val_loss'], r['val_loss']))}, key "
                                    f"{signed(minus(f['key_loss'], r['key_loss']))}" for i, f in layers))
    if r["global_frac"] is not None:
        layers = ", ".join(f"{i} {percent(f)}" for i, f in enumerate(r["global_frac_per_layer"]) if f is not None)
        lines.append(f"global {percent(r['global_frac'])} of the routed decisions (per layer: {layers})")
    inference = r.get("attention_flop_frac_inference")
    lines.append(f"attention FLOPs vs dense: ideal {percent(r['attention_flop_frac_ideal'])}, computed in training "
                 f"{percent(r['attention_flop_frac_computed'])} (routed_mode {r['model_config']['routed_mode']})"
                 + (f", at inference {percent(inference)}" if inference is not None else ""))
    lines.append(f"KV cache at {r['context_length']:,} positions ({dtype}): {r['kv_cache_bytes']:,} bytes, "
                 f"{percent(r['kv_cache_bytes'] / r['kv_cache_bytes_dense'])} of dense "
                 f"({r['kv_cache_bytes_dense']:,})")
    if r.get("key_routing"):
        lines.append(format_key_routing(r["key_routing"]))
    if "synthetic" in r:
        lines.append(format_synthetic(r["synthetic"]))
    return "\n".join(lines)


def format_key_routing(rows):
    """The routers against the key tokens: per layer ('any' head) and head, global fraction, precision (of the
    tokens routed global, the fraction that are key tokens) and recall (of the key tokens, the fraction routed
    global)."""
    lines = ["routers against key tokens: layer  head  global  precision  recall"]
    for row in rows:
        lines.append(f"{'':27}{row['layer']:5}  {row['head']:>4}  {percent(row['global_frac']):>6}     "
                     f"{percent(row['precision']):>6}  {percent(row['recall']):>6}")
    return "\n".join(lines)


def position_label(bucket):
    return f"{bucket['from']}-{bucket['to']}"


def position_line(r):
    """The printed line of the loss by context position (position_edges())."""
    buckets = r["loss_by_position"]
    return (f"loss by context position (at {position_label(buckets[0])} the window holds the whole prefix): " +
            " | ".join(f"{position_label(b)} {fixed(b['loss'])}" for b in buckets))


def position_tables(results):
    """The loss by context position as markdown, a table per distinct set of buckets (one per window)."""
    groups = {}
    for r in results:
        groups.setdefault(tuple(position_label(b) for b in r["loss_by_position"]), []).append(r)
    lines = []
    for labels, rows in groups.items():
        lines += ["", f"Loss by context position (positions {labels[0]}: the window holds the whole prefix, so "
                  "every layer, local or global, sees the same context):", "",
                  "| run | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
        lines += [f"| {r['run']} | " + " | ".join(fixed(b["loss"]) for b in r["loss_by_position"]) + " |"
                  for r in rows]
    return lines


def key_token_line(r):
    """The printed line of the key-token split (nanoaha/key_tokens.py)."""
    rule = r["key_tokens"]
    return (f"key tokens (copies from beyond the window; k {rule['k']}, window {rule['window']}, {rule['n_sink']} "
            f"sinks): {percent(r['key_frac'])} of the targets, loss {fixed(r['key_loss'])} | other tokens "
            f"{fixed(r['other_loss'])}")


def sweep_table(rows):
    """A threshold_sweep as a markdown table."""
    lines = ["| threshold | val loss | key / other loss | global | attn FLOPs ideal / computed |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['threshold']:g} | {row['val_loss']:.4f} | {fixed(row.get('key_loss'))} / "
                     f"{fixed(row.get('other_loss'))} | {percent(row['global_frac'])} | "
                     f"{percent(row['attention_flop_frac_ideal'])} / {percent(row['attention_flop_frac_computed'])} |")
    return "\n".join(lines)


def forced_table(forced):
    """forced_routing's losses as a markdown table."""
    lines = ["| forced | val loss | key / other loss |", "|---|---|---|"]
    for name, f in forced.items():
        what = f"layer {name[len('local_layer'):]}'s routers local" if name.startswith("local_layer") else \
            f"every routed head {name}"
        lines.append(f"| {what} | {fixed(f['val_loss'])} | {fixed(f['key_loss'])} / {fixed(f['other_loss'])} |")
    return "\n".join(lines)


def markdown_table(results, dtype="float32"):
    """One row per checkpoint, the loss by context position (a table per window), then a threshold-sweep table
    per model with learned routers (and its losses forced global and forced local)."""
    lines = ["| run | layers | val loss | ppl / bpb | key / other loss (key tokens) | global | "
             f"attn FLOPs ideal / computed | KV cache ({dtype}) |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        score = f"bpb {r['bits_per_byte']:.4f}" if r["bits_per_byte"] is not None else f"ppl {r['perplexity']:.3f}"
        lines.append(f"| {r['run']} | {r['layers']} | {r['val_loss']:.4f} | {score} | {fixed(r['key_loss'])} / "
                     f"{fixed(r['other_loss'])} ({percent(r['key_frac'])}) | "
                     f"{percent(r['global_frac'])} | {percent(r['attention_flop_frac_ideal'])} / "
                     f"{percent(r['attention_flop_frac_computed'])} | {human_bytes(r['kv_cache_bytes'])} at "
                     f"{r['context_length']} ({percent(r['kv_cache_bytes'] / r['kv_cache_bytes_dense'])} "
                     f"of dense) |")
    lines += position_tables(results)
    for r in results:
        if r["threshold_sweep"]:
            lines += ["", f"Threshold sweep of {r['run']} (trained at {r['model_config']['router_threshold']:g}):",
                      "", sweep_table(r["threshold_sweep"])]
        if r["forced_routing"]:
            lines += ["", f"{r['run']} with every routed head forced global or local, and one layer's routers at a "
                      "time forced local:", "",
                      forced_table(r["forced_routing"])]
    return "\n".join(lines) + "\n"
