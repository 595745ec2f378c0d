"""The loss's pull on each head's decision along a run: per evaluation and head, the mean gradient of the head's
router bias since the last evaluation (decision_history's bias gradients, x 1e4; negative: towards global), the
share of steps whose decision changed (flips), the distance of p from the threshold (margin: under Adam the heads
whose pull keeps its sign move alike), commits and the repeat probe's copy gain.

    python results/2026-12-06_router_pull/pull.py RUN [RUN ...]

RUN: a run's out_dir, or its train_summary.json.
"""
import json
import sys
from pathlib import Path


def main(dirs):
    for run in map(Path, dirs):
        summary = json.loads((run / "train_summary.json" if run.is_dir() else run).read_text())
        commits = {(layer, head): (step, path) for step, layer, head, path in summary["commit_history"]}
        copy = {entry[0]: entry[1] for entry in summary["copy_history"]}
        heads = [(layer, head) for layer, per_layer in enumerate(summary["decision_history"][1][5])
                 if per_layer is not None for head in range(len(per_layer))]
        print(f"## {run.name}: {summary['iter_num']} steps, val loss {summary['val_loss']:.4f}")
        print("commits (step, path 0 local / 1 global): "
              + ", ".join(f"L{layer}H{head} {step}/{path}" for (layer, head), (step, path) in sorted(commits.items())))
        print()
        print("| step | copy gain | " + " | ".join(f"L{layer}H{head}" for layer, head in heads) + " |")
        print("|---|---|" + "---|" * len(heads))
        for step, _, margin, _, flips, grads in summary["decision_history"][1:]:
            cells = []
            for layer, head in heads:
                committed = commits.get((layer, head))
                if committed is not None and committed[0] < step - 250:  # committed before these steps began
                    cells.append("global" if committed[1] else "local")
                    continue
                cells.append(f"{grads[layer][head] * 1e4:+.1f} ({flips[layer][head]:.0%} flips, "
                             f"margin {margin[layer][head]:.3f})")
            print(f"| {step} | {copy.get(step, float('nan')):+.3f} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
