"""The noise floor of a same-seed comparison on grid stdlib_live, and issue 39's four targets judged against it.

The floor: LG_other_data is LG trained from the same init on another data order (data_order=1), so its
difference to LG at a seed is training noise alone (evaluated on the same val windows). Printed: its same-seed
differences at the end (evaluate.py, all and key tokens), along training (train.py's evaluations), and their
spread. Then each target's candidates, per seed, against 0.02 (the target as worded) and against the floor (the
largest of the floor's five differences), with the copy head and the attention FLOPs in training over ideal.

    python results/2026-12-06_noise_floor/noise_floor.py results/2026-12-06_stdlib_live_11
"""
import json
import os
import sys

COPY_HEAD_GAIN = 0.1  # compare.py's level (nanoaha/grid/tables.py)
WORDED = 0.02         # "ties" as the issue words it
TARGETS = [  # (target, reference row, candidate rows)
    ("(1) at or below LG's cost, ties or beats LG on 5 of 5 seeds, copy head on 5 of 5", "LG",
     ["routed_head_budget_one_head_commit", "routed_head_budget_at_LG_deadline", "routed_head_budget_tokens_at_LG",
      "routed_per_head_at_LG", "routed_at_LG"]),
    ("(2) at one head's cost, ties LR_one_global_head on 5 of 5 seeds", "LR_one_global_head",
     ["routed_head_budget_one_head_commit", "routed_per_head_one_head"]),
    ("(3) per-token routing within 0.02 of LG on 5 of 5 seeds", "LG",
     ["routed_at_LG", "routed_head_budget_tokens_at_LG"]),
]


def main(record):
    with open(os.path.join(record, "rows.json")) as f:
        rows = {row["run"]: {r["seed"]: r for r in row["results"] if r["complete"]} for row in json.load(f)["rows"]}
    lg, again = rows["LG"], rows.get("LG_other_data", {})
    floor_diffs = {s: again[s]["val_loss"] - lg[s]["val_loss"] for s in again if s in lg}
    key_diffs = {s: again[s]["key_loss"] - lg[s]["key_loss"] for s in again if s in lg}
    floor = max(map(abs, floor_diffs.values())) if len(floor_diffs) >= 2 else None
    rms = (sum(d * d for d in floor_diffs.values()) / len(floor_diffs)) ** 0.5 if floor_diffs else None
    print("## The noise floor: LG_other_data - LG at the same seed\n")
    print(f"End of training (evaluate.py, 64 val windows): all tokens {fmt(floor_diffs)}; key tokens "
          f"{fmt(key_diffs)}.")
    if floor is not None:
        print(f"Largest |difference| {floor:.3f} (key tokens {max(map(abs, key_diffs.values())):.3f}); rms "
              f"{rms:.3f}, so the mean of five same-seed differences between equally good rows has a standard "
              f"error of about {rms / len(floor_diffs) ** 0.5:.3f}.")
    print("\nAlong training (train.py's evaluations on 80 val windows), all tokens, every 500 steps:\n")
    print("| seed | " + " | ".join(str(step) for step in range(500, 5001, 500)) + " | last five: mean [min, max] |")
    print("|---" * 12 + "|")
    for seed in sorted(floor_diffs):
        ref = {step: loss for step, loss, *_ in lg[seed]["val_history"]}
        along = {step: loss - ref[step] for step, loss, *_ in again[seed]["val_history"] if step in ref}
        late = [along[step] for step in sorted(along)[-5:]]
        print(f"| {seed} | " + " | ".join(f"{along[step]:+.3f}" if step in along else "-"
                                        for step in range(500, 5001, 500)) +
              f" | {sum(late) / len(late):+.3f} [{min(late):+.3f}, {max(late):+.3f}] |")
    print("\n## The targets, per seed\n\nEach candidate's val loss minus the target's row at the same seed; 'within "
          "L': |difference| <= L; 'better or within': difference <= L.")
    for target, reference, candidates in TARGETS:
        print(f"\n{target}\n")
        for run in candidates:
            runs = rows.get(run, {})
            diffs = {s: runs[s]["val_loss"] - rows[reference][s]["val_loss"] for s in runs if s in rows[reference]}
            if not diffs:
                continue
            copies = [copy_head(runs[s]) for s in runs]
            probed = [c for c in copies if c is not None]
            levels = [(name, level) for name, level in (("0.02", WORDED), (f"the floor {floor:.3f}" if floor else "",
                                                                            floor)) if level is not None]
            counts = [f"within {name}: {sum(abs(d) <= level for d in diffs.values())}, better or within: "
                      f"{sum(d <= level for d in diffs.values())} of {len(diffs)}" for name, level in levels]
            print(f"- {run}: {fmt(diffs)} (mean {sum(diffs.values()) / len(diffs):+.3f}); " + "; ".join(counts) +
                  f"; copy head {sum(probed)} of {len(probed)} probed; ideal FLOPs "
                  f"{fmt({s: runs[s]['flops_ideal'] for s in runs}, '.2f')}")
    print("\n(4) attention FLOPs in training over ideal, per seed\n")
    for run in TARGETS[0][2]:
        runs = rows.get(run, {})
        ratios = {s: r["flops_training"] / r["flops_ideal"] for s, r in runs.items() if r.get("flops_training")}
        if ratios:
            print(f"- {run}: {fmt(ratios, '.2f')} (within 1.2x on {sum(x <= 1.2 for x in ratios.values())} of {len(ratios)})")


def copy_head(result):
    history = result.get("copy_history") or []
    return None if not history else history[-1][1] >= COPY_HEAD_GAIN


def fmt(values, spec="+.3f"):
    return ", ".join(f"s{s} {v:{spec}}" for s, v in sorted(values.items())) or "-"


if __name__ == "__main__":
    main(sys.argv[1])
