"""The restart control of the one-head diagnosis, from the run folders a stdlib_live grid trains (or the runs/
folder a record of it keeps): per run, the copy gain along training at steps counted from the start of the run
a continuation starts from, and the evaluation's losses at the end.

    python results/2026-12-06_restart_control/control.py out/grids/stdlib_live
    python results/2026-12-06_restart_control/control.py results/<date>_stdlib_live/runs
"""
import json
import os
import sys

RUNS = [  # (run folder, steps before its own: a run that continues another's checkpoint at step 800)
    ("LR_one_global_head__seed_1", 0), ("LR_one_global_head_first_800__seed_1", 0),
    ("LR_one_global_head_from_800__seed_1", 800), ("per_head_one_head_first_800__seed_1", 0),
    ("fixed_layout_from_800__seed_1", 800), ("per_head_one_head_first_800__seed_2", 0),
    ("fixed_layout_from_800__seed_2", 800), ("LR_one_global_head__seed_2", 0),
]
STEPS = (500, 800, 1000, 1250, 1500, 1750, 2000, 2250, 2500, 3000, 4000, 5000)
LATE = 50  # a continuation from step 800 evaluates 50 steps after a straight run's steps (1050, 1300, ...)


def main(folder):
    print(f"runs: {folder}\n")
    print("copy gain (nats, train.py's repeat probe) at step, counted from the start of the run a continuation "
          f"starts from (a continuation's evaluation at that step or up to {LATE} after it)\n")
    print("| run | " + " | ".join(str(s) for s in STEPS) + " | val loss | key-token loss |")
    print("|---|" + "---|" * (len(STEPS) + 2))
    for run, offset in RUNS:
        path = os.path.join(folder, run)
        if not os.path.isdir(path):
            print(f"| {run} | (not in {folder}) |")
            continue
        with open(os.path.join(path, "train_summary.json")) as f:
            summary = json.load(f)
        gains = {entry[0] + offset: entry[1] for entry in summary.get("copy_history") or []}
        found = [next((gains[s + late] for late in range(LATE + 1) if s + late in gains), None) for s in STEPS]
        cells = ["-" if gain is None else f"{gain:+.3f}" for gain in found]
        losses = "- | -"
        if os.path.isfile(os.path.join(path, "eval.json")):
            with open(os.path.join(path, "eval.json")) as f:
                result = json.load(f)
            losses = f"{result['val_loss']:.4f} | {result['key_loss']:.4f}"
        print(f"| {run} | " + " | ".join(cells) + f" | {losses} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
