"""Pruning: routed layers that (almost) never go global become local layers, which read only the window and
the sinks and keep only those in the KV cache. prune.py is the command.

The pruned checkpoint has the dict structure of train.py's, with the per-layer schedule (every letter spelled
out, L where a layer was pruned), without the pruned layers' router weights and without optimizer state (so
it is fine-tuned with init_from=PATH, not resumed), and a 'pruned' entry saying what was done.
"""
import os

import torch

from nanoaha.checkpoint import BEST_NAME, checkpoint_path, load_checkpoint, load_model, save_checkpoint
from nanoaha.device import autocast_context, pick_device, pick_dtype
from nanoaha.formatting import percent
from nanoaha.evaluation import (DEFAULT_EVAL_TOKENS, check_out_dir, eval_data, evaluate_loss, fixed_val_batches,
                                kv_cache_summary, routing_summary, trained_data_dir)
from model import GPTConfig

DEFAULT_MIN_GLOBAL_FRAC = 0.05  # prune.py's default level (routed layers global less often than this go local)


def layers_to_prune(global_frac_per_layer, kinds, min_global_frac):
    """The routed layers whose global fraction is below min_global_frac."""
    return [i for i, (kind, frac) in enumerate(zip(kinds, global_frac_per_layer))
            if kind == "routed" and frac < min_global_frac]


def prune_checkpoint(ckpt, layers, record=None):
    """The checkpoint with `layers` turned local: schedule letter L, router weights dropped. A budget of heads
    (router_global_heads) keeps its count where routed heads are left for it (a pruned layer had almost none of
    the budget's heads), and goes where none are."""
    config = GPTConfig(**ckpt["model_config"])
    letters = list(config.layer_letters)
    for i in layers:
        letters[i] = "L"
    pruned = config.with_schedule("".join(letters))
    dropped = tuple(f"blocks.{i}.attn.router." for i in layers)
    return {**ckpt, "model": {k: v for k, v in ckpt["model"].items() if not k.startswith(dropped)},
            "model_config": {**ckpt["model_config"], "schedule": pruned.schedule,
                             "router_global_heads": pruned.router_global_heads},
            "optimizer": None, "pruned": {"layers": list(layers), **(record or {})}}


REPLACED_RUN_FILES = (BEST_NAME, "train_summary.json", "eval.json")  # another run's, in a replaced out_dir


def prune(path, out_dir, min_global_frac=DEFAULT_MIN_GLOBAL_FRAC, data_dir="", context_length=0,
          eval_tokens=DEFAULT_EVAL_TOKENS, batch_size=8, device="cpu", dtype="float32", overwrite=False):
    """Measure each routed layer's global fraction on the fixed val tokens, write the pruned checkpoint to
    out_dir/ckpt.pt and return what changed: layers pruned, val loss and KV-cache bytes before and after.
    Refuses, before measuring, an out_dir that is a file or holds another run's files (its checkpoints, summary,
    evaluation) unless overwrite."""
    if min_global_frac < 0:
        raise ValueError(f"min_global_frac={min_global_frac}: give a global fraction >= 0 "
                         f"({DEFAULT_MIN_GLOBAL_FRAC}: below {percent(DEFAULT_MIN_GLOBAL_FRAC, 0)})")
    source, target = checkpoint_path(path), os.path.join(out_dir, "ckpt.pt")
    if not out_dir or os.path.abspath(source) == os.path.abspath(target):
        raise ValueError("pass --out_dir=NEW_DIR, a folder other than the checkpoint's: pruning never overwrites it")
    check_out_dir(out_dir)
    held = [os.path.join(out_dir, name) for name in ("ckpt.pt", *REPLACED_RUN_FILES)
            if os.path.exists(os.path.join(out_dir, name))]
    if held and not overwrite:
        raise ValueError(f"{', '.join(held)} exist{'s' if len(held) == 1 else ''} (another run's): choose another "
                         f"--out_dir, or replace {'it' if len(held) == 1 else 'them'} with --overwrite")
    device = pick_device(device)
    torch_dtype = pick_dtype(dtype, device)
    autocast = autocast_context(device, torch_dtype)
    model, _ = load_model(source, device)
    if "routed" not in model.config.kinds:
        raise ValueError(f"{source} has no routed layers (layers {model.config.layer_letters}): nothing to prune")
    data_dir = data_dir or trained_data_dir(source)
    batches = fixed_val_batches(eval_data(data_dir, model.config, f"checkpoint {source}"), eval_tokens, batch_size)
    context_length = context_length or model.config.block_size
    element = torch.finfo(torch_dtype).bits // 8
    loss, stats = evaluate_loss(model, batches, autocast)
    before = routing_summary(stats, model.config.kinds)
    layers = layers_to_prune(before["global_frac_per_layer"], model.config.kinds, min_global_frac)
    record = {"from": source, "min_global_frac": min_global_frac, "data_dir": data_dir,
              "global_frac_per_layer": before["global_frac_per_layer"]}
    os.makedirs(out_dir, exist_ok=True)
    for old in held:  # with --overwrite (else refused above): what described the replaced run would mislead
        if old != target:  # ckpt.pt itself is replaced atomically below
            os.remove(old)
    save_checkpoint(target, prune_checkpoint(load_checkpoint(source, "cpu"), layers, record))
    pruned, _ = load_model(target, device)
    pruned_loss, pruned_stats = evaluate_loss(pruned, batches, autocast)
    after = routing_summary(pruned_stats, pruned.config.kinds)
    return {"checkpoint": target, "layers_before": model.config.layer_letters,
            "layers_after": pruned.config.layer_letters, "pruned_layers": layers, "min_global_frac": min_global_frac,
            "global_frac_per_layer": before["global_frac_per_layer"],
            "val_loss_before": loss, "val_loss_after": pruned_loss,
            "before": {**before, **kv_cache_summary(model.config, context_length, element)},
            "after": {**after, **kv_cache_summary(pruned.config, context_length, element)}}
