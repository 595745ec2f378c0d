"""Per-token routing at LG's cost, head by head along training: for each run (a folder with train_summary.json),
at every evaluation, each head's global share on the repeat probe's tokens, its previous-token score and (layer
1) its induction score, from the copy_history train.py writes; then, per run, where and when the previous-token
heads and the copy head formed.

    python heads.py RUN_DIR [RUN_DIR ...]
"""
import json
import os
import sys


def fmt(values, digits=2):
    return " ".join(f"{v:.{digits}f}" for v in values)


def main(paths):
    for path in paths:
        summary = json.load(open(os.path.join(path, "train_summary.json")))
        history = [e for e in summary["copy_history"] if len(e) > 3 and e[3]]
        print(f"## {path}\n")
        print("| step | copy gain | layer 0 global | layer 0 previous | layer 1 global | layer 1 previous | "
              "layer 1 induction |")
        print("|---|---|---|---|---|---|---|")
        for step, gain, _, heads in history:
            if step % 500 and step != history[-1][0]:
                continue
            print(f"| {step} | {gain:+.3f} | {fmt(heads['global'][0])} | {fmt(heads['previous'][0])} | "
                  f"{fmt(heads['global'][1])} | {fmt(heads['previous'][1])} | {fmt(heads['induction'][1], 3)} |")
        last = history[-1][3]
        best = max(((layer, h, last["previous"][layer][h]) for layer in (0, 1) for h in range(len(last["previous"][0]))),
                   key=lambda x: x[2])
        copy_step = next((s for s, g, _, _ in history if g >= 0.1), None)
        print(f"\nend: strongest previous-token head layer {best[0]} head {best[1]} ({best[2]:.2f}), its global "
              f"share {last['global'][best[0]][best[1]]:.2f}; layer 0's best {max(last['previous'][0]):.2f}; copy "
              f"gain first >= 0.1 at step {copy_step}; strongest induction head "
              f"{max(range(len(last['induction'][1])), key=lambda h: last['induction'][1][h])} "
              f"({max(last['induction'][1]):.3f})\n")


if __name__ == "__main__":
    main(sys.argv[1:])
