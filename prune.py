"""Turn routed layers whose global fraction is below a level into local layers and save the pruned checkpoint;
report the loss change and the KV-cache bytes saved. The pruned checkpoint loads, evaluates and samples like
any other (evaluate.py, sample.py); fine-tune it with train.py --init_from=NEW_DIR/ckpt.pt.

    python prune.py out/quickstart --out_dir=out/quickstart_pruned [--min_global_frac=0.05] [--data_dir=...]
"""
import sys
from dataclasses import dataclass

from nanoaha.configurator import paths_and_settings
from nanoaha.evaluation import DEFAULT_EVAL_TOKENS
from nanoaha.formatting import percent
from nanoaha.pruning import DEFAULT_MIN_GLOBAL_FRAC, prune


@dataclass
class PruneConfig:
    out_dir: str = ""                       # where the pruned ckpt.pt goes: not the checkpoint's own folder
    min_global_frac: float = DEFAULT_MIN_GLOBAL_FRAC  # routed layers below this global fraction become local
    data_dir: str = ""                      # the corpus to measure on; "": the one the checkpoint was trained on
    context_length: int = 0                 # KV-cache bytes at this many positions; 0: block_size
    eval_tokens: int = DEFAULT_EVAL_TOKENS  # the fixed val windows, as evaluate.py's
    batch_size: int = 8
    device: str = "auto"
    dtype: str = "float32"                  # evaluation precision and the KV cache's element size
    overwrite: bool = False                 # replace a ckpt.pt already in out_dir (else refuse)


def format_report(r, dtype):
    """pruning.prune's result as printed lines."""
    fracs = ", ".join(f"{i} {percent(f)}" for i, f in enumerate(r["global_frac_per_layer"]) if f is not None)
    before, after = r["before"], r["after"]
    saved = before["kv_cache_bytes"] - after["kv_cache_bytes"]
    return "\n".join([
        f"global fraction per routed layer: {fracs}; level {percent(r['min_global_frac'])}",
        f"pruned layers {r['pruned_layers'] or 'none'}: {r['layers_before']} -> {r['layers_after']}",
        f"val loss {r['val_loss_before']:.4f} -> {r['val_loss_after']:.4f} "
        f"({r['val_loss_after'] - r['val_loss_before']:+.4f})",
        f"attention FLOPs vs dense: ideal {percent(before['attention_flop_frac_ideal'])} -> "
        f"{percent(after['attention_flop_frac_ideal'])}, computed "
        f"{percent(before['attention_flop_frac_computed'])} -> "
        f"{percent(after['attention_flop_frac_computed'])}",
        f"KV cache at {before['context_length']:,} positions ({dtype}): {before['kv_cache_bytes']:,} -> "
        f"{after['kv_cache_bytes']:,} bytes, {saved:,} saved ({percent(saved / before['kv_cache_bytes'])})",
        f"wrote {r['checkpoint']}"])


def main(argv):
    paths, cfg = paths_and_settings(argv, PruneConfig, usage=__doc__)
    if len(paths) != 1:
        sys.exit(f"name one checkpoint: python prune.py CKPT_DIR --out_dir=NEW_DIR "
                 f"[--min_global_frac={DEFAULT_MIN_GLOBAL_FRAC}]")
    try:
        report = prune(paths[0], cfg.out_dir, cfg.min_global_frac, data_dir=cfg.data_dir,
                       context_length=cfg.context_length, eval_tokens=cfg.eval_tokens, batch_size=cfg.batch_size,
                       device=cfg.device, dtype=cfg.dtype, overwrite=cfg.overwrite)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(format_report(report, cfg.dtype))


if __name__ == "__main__":
    main(sys.argv[1:])
