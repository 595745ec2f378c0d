"""What a checkpoint's attention does with long context: the repeat probe (nanoaha/copy_probe.py). Each probe
sequence is a val span followed by itself, longer than the window; the probe reports the copy gain (how much
better the model predicts the second copy than the first) and, per layer and head, the induction score (weight on
the token after the earlier occurrence, beyond the window), the previous-token score, the attention mass beyond
the window on ordinary text and the global share.

    python probe.py out/grids/stdlib_live/LG__seed_2 out/grids/stdlib_live/routed_at_LG__seed_2 [--span=256]
    python probe.py out/grids/stdlib_live/ --out=out/probe.json
"""
import os
import sys
from dataclasses import dataclass

from data.atomic_files import write_json
from nanoaha.configurator import paths_and_settings, run_main
from nanoaha.copy_probe import DEFAULT_N_SPANS, DEFAULT_SPAN, probe_checkpoint
from nanoaha.device import pick_device
from nanoaha.evaluation import find_checkpoints, run_name
from nanoaha.formatting import fixed, percent


@dataclass
class ProbeConfig:
    data_dir: str = ""            # the corpus whose val split gives the spans; "": each checkpoint's own
    span: int = DEFAULT_SPAN      # tokens a copy; longer than the window, at most block_size / 2
    n_spans: int = DEFAULT_N_SPANS  # spans probed, evenly spaced over the val split
    batch_size: int = 8
    device: str = "auto"
    dtype: str = "float32"        # the model's forward pass (the attention weights are recomputed in fp32)
    out: str = ""                 # write every result to this JSON file (its folder is created if missing)

    def __post_init__(self):
        if self.batch_size < 1:  # the parser turns this into one line, as evaluate.py's and prune.py's
            raise ValueError(f"batch_size={self.batch_size} must be at least 1")


def format_probe(r):
    """One checkpoint's result as lines: the copy gain, then one line per layer and head (routed heads also
    with their previous-token score when local and when global, and their induction score when global)."""
    lines = [f"{run_name(r['checkpoint'])} ({r['layers_kinds']}, window {r['window']}): copy gain "
             f"{r['copy_gain']:+.3f} nats (first copy {r['first_loss']:.3f}, second {r['second_loss']:.3f}; "
             f"{r['n_spans']} spans of {r['span']})",
             "  layer head kind     induction  previous    far  global | previous: local  global | induction: global"]
    for i, layer in enumerate(r["layers"]):
        for h in range(len(layer["induction"])):
            line = (f"  {i:>5} {h:>4} {layer['kind']:<8} {layer['induction'][h]:>9.3f} {layer['previous'][h]:>9.3f} "
                    f"{layer['far'][h]:>6.3f} {percent(layer['global'][h], 0):>7}")
            if "previous_when_local" in layer:
                line += (f" | {fixed(layer['previous_when_local'][h], 3):>15} "
                         f"{fixed(layer['previous_when_global'][h], 3):>7} | "
                         f"{fixed(layer['induction_when_global'][h], 3):>17}")
            lines.append(line)
    return "\n".join(lines)


def summary_table(results):
    """A markdown table, one row per checkpoint: copy gain and, per layer, its strongest head's induction and
    previous-token scores."""
    n_layers = max(len(r["layers"]) for r in results)
    head = ["run", "copy gain"] + [f"L{i} {name}" for i in range(n_layers) for name in ("induction", "previous")]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [run_name(r["checkpoint"]), f"{r['copy_gain']:+.3f}"]
        for i in range(n_layers):
            layer = r["layers"][i] if i < len(r["layers"]) else None
            cells += ["-", "-"] if layer is None else [f"{max(layer['induction']):.3f}",
                                                       f"{max(layer['previous']):.3f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv):
    paths, cfg = paths_and_settings(argv, ProbeConfig, usage=__doc__)
    if not paths:
        sys.exit("name at least one checkpoint: python probe.py CKPT_OR_DIR [CKPT_OR_DIR ...] [--key=value ...]")
    if cfg.out and os.path.isdir(cfg.out):  # before any probing: the JSON is written at the end
        raise ValueError(f"--out={cfg.out} is a folder: name a JSON file, e.g. --out={os.path.join(cfg.out, 'probe.json')}")
    device = pick_device(cfg.device)
    results = []
    for path in find_checkpoints(paths):
        result = probe_checkpoint(path, cfg.data_dir, cfg.span, cfg.n_spans, cfg.batch_size, device, cfg.dtype)
        print(format_probe(result), flush=True)
        results.append(result)
    print(summary_table(results))
    if cfg.out:
        os.makedirs(os.path.dirname(cfg.out) or ".", exist_ok=True)
        write_json(cfg.out, results, indent=2)
        print(f"wrote {cfg.out}")


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
