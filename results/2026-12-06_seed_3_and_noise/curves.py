"""Same-seed differences to LG along training, copy curves and the two val samples' agreement, from a record of
grid stdlib_live (rows.json): python curves.py RECORD"""
import json
import statistics
import sys

ROWS = ("LR_one_global_head", "routed_head_budget_one_head_commit", "routed_head_budget_at_LG_deadline",
        "routed_head_budget_tokens_at_LG", "routed_per_head_at_LG")
STEPS = (500, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000)


def main(record):
    with open(f"{record}/rows.json") as f:
        rows = json.load(f)["rows"]
    runs = {(row["run"], r["seed"]): r for row in rows for r in row["results"] if r.get("val_loss") is not None}

    print("## Copy gain along training (the repeat probe, train.py's evaluations)\n")
    print("| run | seed | " + " | ".join(str(s) for s in STEPS) + " |")
    print("|---|---|" + "---|" * len(STEPS))
    for run in ("LG",) + ROWS:
        for seed in range(1, 6):
            history = dict((h[0], h[1]) for h in (runs.get((run, seed)) or {}).get("copy_history") or [])
            if history and (run == "LG" or seed == 3):
                print(f"| {run} | {seed} | " + " | ".join(f"{history[s]:.2f}" for s in STEPS) + " |")

    print("\n## Val loss minus LG's at the same seed along training (train.py's evaluations), the mean of the last "
          "five (4000-5000) and evaluate.py's at the end\n")
    print("| run | seed | " + " | ".join(str(s) for s in STEPS) + " | mean 4000-5000 | evaluate.py |")
    print("|---|---|" + "---|" * (len(STEPS) + 2))
    for run in ROWS:
        for seed in range(1, 6):
            mine, lg = runs.get((run, seed)), runs.get(("LG", seed))
            if mine is None or lg is None or not mine.get("val_history"):
                continue
            theirs = dict((h[0], h[1]) for h in lg["val_history"])
            diff = {s: v - theirs[s] for s, v in mine["val_history"] if s in theirs}
            late = statistics.mean(diff[s] for s in (4000, 4250, 4500, 4750, 5000))
            print(f"| {run} | {seed} | " + " | ".join(f"{diff[s]:+.3f}" for s in STEPS)
                  + f" | {late:+.3f} | {mine['val_loss'] - lg['val_loss']:+.3f} |")

    print("\n## How far the difference to LG moves between consecutive evaluations (250 steps apart, from step 500)\n")
    jumps = []
    for run in ROWS:
        for seed in range(1, 6):
            mine, lg = runs.get((run, seed)), runs.get(("LG", seed))
            if mine is None or lg is None or not mine.get("val_history"):
                continue
            theirs = dict((h[0], h[1]) for h in lg["val_history"])
            diff = [v - theirs[s] for s, v in mine["val_history"] if s in theirs and s >= 500]
            jumps.append((max(abs(b - a) for a, b in zip(diff, diff[1:])), run, seed))
    jumps.sort()
    print(f"{len(jumps)} runs: the largest move of each, median {statistics.median(j[0] for j in jumps):.3f}, "
          f"max {jumps[-1][0]:.3f} ({jumps[-1][1]} seed {jumps[-1][2]})")

    print("\n## Seed 3 at the end (evaluate.py), minus LG: all tokens, key tokens, the others\n")
    for run in ROWS:
        mine, lg = runs.get((run, 3)), runs.get(("LG", 3))
        if mine and lg:
            print(f"- {run}: {mine['val_loss'] - lg['val_loss']:+.3f}, {mine['key_loss'] - lg['key_loss']:+.3f}, "
                  f"{mine['other_loss'] - lg['other_loss']:+.3f}")

    print("\n## Two val samples, one difference: evaluate.py's (64 windows) against train.py's last evaluation "
          "(80 windows), every run of the record that ended at step 5000 against LG at its seed\n")
    gaps = []
    for (run, seed), mine in runs.items():
        lg = runs.get(("LG", seed))
        if run == "LG" or lg is None or not mine.get("val_history") or not lg.get("val_history"):
            continue
        last, theirs = dict(mine["val_history"]), dict(lg["val_history"])
        if 5000 in last and 5000 in theirs:
            gaps.append(abs((mine["val_loss"] - lg["val_loss"]) - (last[5000] - theirs[5000])))
    gaps.sort()
    print(f"{len(gaps)} differences: |evaluate.py's - train.py's| median {statistics.median(gaps):.4f}, "
          f"90th percentile {gaps[int(0.9 * len(gaps))]:.4f}, max {gaps[-1]:.4f}, "
          f"rms {(sum(g * g for g in gaps) / len(gaps)) ** 0.5:.4f}")


if __name__ == "__main__":
    main(sys.argv[1])
