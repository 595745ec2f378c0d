"""The one-head-cost diagnosis from a stdlib_live record's rows.json: per run and seed, the copy gain along
training (steps counted from the start of the run it continues), the end's losses, and for runs with learned
routers how settled their decisions were (flicker: share of val decisions changed since the previous
evaluation; margin: mean |p - threshold|; both averaged over each layer's heads).

    python results/2026-12-06_one_head_diagnosis/diagnose.py results/<date>_stdlib_live
"""
import json
import os
import sys

RUNS = {  # run -> steps before its own (a run that continues another's checkpoint)
    "LR_one_global_head": 0, "routed_per_head_one_head": 0, "per_head_one_head_first_800": 0,
    "fixed_layout_from_800": 800, "LR_one_global_head_first_800": 0, "LR_one_global_head_from_800": 800,
    "routed_head_budget_one_head": 0, "routed_head_budget_one_head_commit": 0,
}
STEPS = (250, 500, 800, 1000, 1500, 2000, 2500, 3000, 4000, 5000)


def gain_at(history, step, offset):
    points = {entry[0] + offset: entry[1] for entry in history}
    return f"{points[step]:+.3f}" if step in points else "-"


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def main(record):
    with open(os.path.join(record, "rows.json")) as f:
        rows = {row["run"]: row for row in json.load(f)["rows"]}
    print(f"record: {record}\n")
    print("copy gain (nats) at step (counted from the start of the run a continuation starts from)\n")
    print("| run | seed | " + " | ".join(str(s) for s in STEPS) + " | val loss | key-token loss |")
    print("|---|---|" + "---|" * (len(STEPS) + 2))
    for run, offset in RUNS.items():
        for result in rows.get(run, {}).get("results", []):
            if not result.get("complete"):
                continue
            cells = [gain_at(result.get("copy_history") or [], step, offset) for step in STEPS]
            print(f"| {run} | {result['seed']} | " + " | ".join(cells) +
                  f" | {result['val_loss']:.3f} | {result['key_loss']:.3f} |")
    print("\nlearned routers: per evaluation, per layer, flicker / margin (means over the layer's heads)\n")
    for run in ("per_head_one_head_first_800", "routed_head_budget_one_head", "routed_head_budget_one_head_commit"):
        for result in rows.get(run, {}).get("results", []):
            if not result.get("complete"):
                continue
            history = [entry for entry in result.get("decision_history") or [] if entry[1] is not None]
            cells = []
            for step, flicker, margin, *_ in history:
                if step in (250, 500, 750, 800, 1000, 2000, 3000, 5000):
                    layers = "; ".join(f"L{i} {mean(f):.3f} / {mean(m):.4f}" for i, (f, m) in
                                       enumerate(zip(flicker, margin)) if f is not None)
                    cells.append(f"step {step}: {layers}")
            print(f"- {run} seed {result['seed']}: " + " | ".join(cells))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
