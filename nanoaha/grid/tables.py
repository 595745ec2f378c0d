"""A grid's results: one Row per run with its per-seed numbers (from each run folder's eval.json,
train_summary.json and launches.json), the spreads over seeds, same-seed differences and their verdicts, the
record's tables (table.md, the comparisons) and the summary's, and rows.json, from which a record's tables and
plots are drawn again."""
import dataclasses
import math
import os
import re

from data.atomic_files import write_json
from nanoaha.formatting import human_bytes, percent, signed
from nanoaha.grid.gridfile import GridError
from nanoaha.formats import stamp, upgrade
from nanoaha.grid.plan import grid_evaluation, launches, read_json, read_summary

SMALLEST_DIFFERENCE = 0.0005  # a same-seed difference that prints as 0.000 is no difference


def collect(job, status=None):
    """One job's numbers: from its evaluation (eval.json), its train_summary.json and its launches. A
    number that does not exist is None."""
    result = grid_evaluation(job) or {}  # only the evaluation the grid asked for, never another written over it
    summary = read_summary(job.out_dir) or {}
    complete = bool(summary.get("complete")) and summary.get("max_iters") == job.tcfg.max_iters and bool(result)
    train_wall = [launch["wall_s"] for launch in launches(job.out_dir) if launch["step"] == "train"]
    return {
        "run": job.run, "seed": job.seed, "complete": complete, "status": status or ("ok" if complete else "missing"),
        "val_loss": result.get("val_loss"), "global_frac": result.get("global_frac"),
        "key_loss": result.get("key_loss"), "other_loss": result.get("other_loss"), "key_frac": result.get("key_frac"),
        "flops_ideal": result.get("attention_flop_frac_ideal"),
        "flops_computed": result.get("attention_flop_frac_computed"),
        "flops_training": training_flop_frac(summary, job.out_dir),
        "kv_bytes": result.get("kv_cache_bytes"), "kv_bytes_dense": result.get("kv_cache_bytes_dense"),
        "per_layer": result.get("global_frac_per_layer"), "per_head": result.get("global_frac_per_head"),
        "sweep": result.get("threshold_sweep") or [],
        "tokens_per_s": summary.get("tokens_per_s"),
        # train.py's own clock, kept in the checkpoint over resumes, counts a process the runner lost with it
        # (killed at a session's end); where an old summary has none, the launches the runner saw finish
        "wall_s": summary.get("train_wall_s") or (sum(train_wall) if train_wall else summary.get("wall_s")),
        "val_history": summary.get("val_history") or [],
        "key_history": summary.get("key_history") or [],
        "copy_history": summary.get("copy_history") or [],  # train.py's repeat probe
        "decision_history": summary.get("decision_history") or [],  # how settled the routed decisions were
        "per_layer_routing": per_layer_routing(result),
    }


LOGGED_FLOPS = re.compile(r"^iter (\d+): .*attn-FLOPs ideal [\d.]+% computed ([\d.]+)%")


def training_flop_frac(summary, out_dir):
    """The attention FLOPs training computed, relative to dense: the mean over the run's logged steps
    (train_summary's attention_flop_frac_training); for a summary from before it was kept, the same mean read
    from train.log's step lines (whole percents; the last line of each step, as a resume trains some again).
    None where neither exists. It differs from the evaluation's 'computed' (the trained model's, at the end)
    where decisions changed what training computed: heads that committed."""
    kept = summary.get("attention_flop_frac_training")
    if kept:
        return kept["computed"]
    try:
        with open(os.path.join(out_dir, "train.log")) as f:
            steps = {int(m[1]): float(m[2]) / 100 for m in map(LOGGED_FLOPS.match, f) if m}
    except OSError:
        return None
    return sum(steps.values()) / len(steps) if steps else None


def knows_training_flops(rows):
    """Whether any seed has the attention computed over training (records before 2026-12-06 have none: their
    tables keep the columns they were written with)."""
    return any(r.get("flops_training") is not None for row in rows for r in row.results)


def per_layer_routing(result):
    """Per routed layer with learned routers, from an evaluation: [{'layer', 'decisions_global_frac',
    'global_frac', 'key_recall', 'key_precision', 'forced_local_val', 'forced_local_key'}]: the global fraction
    of the layer's head decisions (the evaluation's global_frac_per_layer), the fraction of tokens any head sent
    global, and the loss with only that layer's routers forced local, minus the trained loss; [] for evaluations
    without them (before 2026-12-03)."""
    forced = result.get("forced_routing") or {}
    layers = {row["layer"]: row for row in result.get("key_routing") or [] if row["head"] == "any"}
    per_layer = result.get("global_frac_per_layer") or []
    found = []
    for layer, row in sorted(layers.items()):
        local = forced.get(f"local_layer{layer}")
        if local is None:
            continue
        def minus(key):
            return None if local[key] is None or result.get(key) is None else local[key] - result[key]
        found.append({"layer": layer, "decisions_global_frac": per_layer[layer] if layer < len(per_layer) else None,
                      "global_frac": row["global_frac"], "key_recall": row["recall"],
                      "key_precision": row["precision"], "forced_local_val": minus("val_loss"),
                      "forced_local_key": minus("key_loss")})
    return found


def spread(values):
    """(mean, min, max) of the numbers that exist; None when none does."""
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return None
    return sum(values) / len(values), min(values), max(values)


def gap_recovery(loss, local, dense):
    """(loss_local - loss) / (loss_local - loss_dense): 0 at local, 1 at dense. None unless dense beats local."""
    if loss is None or local is None or dense is None or not dense < local:
        return None
    return (local - loss) / (local - dense)


@dataclasses.dataclass
class Row:
    """One run of the grid with its per-seed results (collect's dicts)."""
    run: str
    kind: str             # 'fixed' | 'random' | 'routed'
    layers: str
    seeds: list
    results: list

    def stat(self, key):
        return spread([r[key] for r in self.results if r["complete"]])

    def mean(self, key):
        """stat's mean; None where no complete seed has the number."""
        stat = self.stat(key)
        return None if stat is None else stat[0]

    def losses(self, metric="val_loss"):
        """{seed: val loss (or another loss: 'key_loss')} of the seeds that completed and have it."""
        return {r["seed"]: r.get(metric) for r in self.results if r["complete"] and r.get(metric) is not None}

    @property
    def complete(self):
        return all(r["complete"] for r in self.results)


def rows_of(jobs, status=None, taken=None):
    """One Row per run, its results in the jobs' order; taken: {job key: result} for jobs whose numbers come
    from a record's rows.json (nanoaha/grid/kept.py), not from a run folder."""
    rows = {}
    for job in jobs:
        row = rows.setdefault(job.run, Row(job.run, job.kind, job.mcfg.layer_letters, [], []))
        row.seeds.append(job.seed)
        row.results.append((taken or {}).get(job.key) or collect(job, (status or {}).get(job.key)))
    return list(rows.values())


def best_fixed(rows, references=None, exclude=None):
    """The fixed-schedule row (no routed layer) with the lowest val loss, compared at equal seeds: by the mean
    same-seed difference to the local reference where it has results (a row with a third seed would otherwise
    be ranked on another set of seeds), else by the mean. None if no fixed row has a loss. exclude: a run that is
    not a schedule of its own (the noise floor's rerun of the reference)."""
    fixed = [row for row in rows if row.kind == "fixed" and row.stat("val_loss") and row.run != exclude]
    anchor = {row.run: row for row in rows}.get((references or {}).get("local"))
    versus_anchor = {row.run: spread(paired_differences(row, anchor)) for row in fixed} if anchor else {}
    if versus_anchor and all(versus_anchor.values()):
        return min(fixed, key=lambda row: versus_anchor[row.run][0])
    return min(fixed, key=lambda row: row.stat("val_loss")[0]) if fixed else None


def fmt_loss(s):
    return "missing" if s is None else f"{s[0]:.3f}" + (f" [{s[1]:.3f}-{s[2]:.3f}]" if s[2] > s[1] else "")


def common_seed_means(rows):
    """Each row's mean val loss over the seeds that every one of them completed; None without a common seed."""
    losses = [row.losses() for row in rows]
    seeds = set.intersection(*map(set, losses))
    if not seeds:
        return None
    return [sum(by_seed[s] for s in seeds) / len(seeds) for by_seed in losses]


def dense_beats_local(local_row, dense_row):
    """Whether dense's val loss is below local's, on the mean over the seeds both completed (None: no reference
    or no common seed)."""
    means = common_seed_means([local_row, dense_row]) if local_row and dense_row else None
    return None if means is None else means[1] < means[0]


def gap_text(row, local_row, dense_row):
    """The gap-recovery cell, at equal seeds: where dense beats local, (loss_local - loss) / (loss_local -
    loss_dense) on the means over the seeds the run shares with both; where local beats dense, whether the run
    beats both on every seed (or is worse than local on every seed, or ties)."""
    if row.stat("val_loss") is None:
        return "missing"
    beats = dense_beats_local(local_row, dense_row)
    if beats is None:
        return "no reference"
    if beats:
        means = common_seed_means([row, local_row, dense_row])
        if means is None:
            return "no common seed"
        return percent(gap_recovery(means[0], means[1], means[2]), 0)
    if row.run in (local_row.run, dense_row.run):
        return "reference"
    diffs = [paired_differences(row, ref) for ref in (local_row, dense_row)]
    if not all(diffs):
        return "no common seed"
    verdicts = [paired_verdict(d, min_seeds=1) for d in diffs]
    text = "beats both" if verdicts == ["better", "better"] else \
        "does not beat both" if verdicts[0] == "worse" else "ties the better reference"
    return text + (" (1 seed)" if min(map(len, diffs)) < 2 else "")


def versus_best_fixed(row, best, floors=None):
    """The same-seed difference to the best fixed schedule (paired_text)."""
    if best is None:
        return "no fixed schedule"
    if row.run == best.run:
        return "best fixed"
    return paired_text(row, best, floors=floors)


def paired_by_seed(row, ref, metric="val_loss"):
    """{seed: val loss (or metric) minus ref's at that seed} (same backbone init, same data order), for each
    seed both completed. At equal init a seed's difference varies far less than either row's loss does over
    seeds."""
    ref_loss = ref.losses(metric)
    return {seed: loss - ref_loss[seed] for seed, loss in row.losses(metric).items() if seed in ref_loss}


def paired_differences(row, ref, metric="val_loss"):
    """paired_by_seed's differences, in seed order of row's results."""
    return list(paired_by_seed(row, ref, metric).values())


def has_key_losses(rows):
    """Whether any seed of any row has a key-token loss (evaluations before key tokens, 2026-12-02, have none:
    their records' tables have no key-token columns)."""
    return any(r.get("key_loss") is not None for row in rows for r in row.results)



def paired_verdict(diffs, min_seeds=2):
    """'better' ('worse') where min_seeds or more same-seed differences all have that sign (each at least
    SMALLEST_DIFFERENCE), else 'tie'; None with fewer than min_seeds."""
    if len(diffs) < min_seeds:
        return None
    return "better" if max(diffs) <= -SMALLEST_DIFFERENCE else "worse" if min(diffs) >= SMALLEST_DIFFERENCE \
        else "tie"


def paired_text(row, ref, metric="val_loss", floors=None):
    """The same-seed cell: mean [min, max] of the differences, and 'better (worse) on every seed' where two or
    more all have one sign, else 'tie'; with a noise floor for the metric (floors: {metric: floor}, record_floors),
    how many seeds are better, worse and within it instead (agreement_text)."""
    if ref is None:
        return "no reference"
    if row.run == ref.run:
        return "reference"
    diffs = paired_differences(row, ref, metric)
    if not diffs:
        return "missing"
    mean, low, high = spread(diffs)
    verdict = paired_verdict(diffs)
    if verdict is None:
        return f"{mean:+.3f} (1 seed)"
    floor = (floors or {}).get(metric)
    if floor:
        return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}], {agreement_text(diffs, floor)}"
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] " + (verdict if verdict == "tie" else f"{verdict} on every seed")


def seeds_text(row):
    done = [r["seed"] for r in row.results if r["complete"]]
    if len(done) == len(row.results):
        return str(len(done))
    missing = [f"seed {r['seed']} {r['status'] if r['status'] != 'ok' else 'missing'}" for r in row.results
               if not r["complete"]]
    return f"{len(done)} of {len(row.results)} ({'; '.join(missing)})"


def results_table(rows, references, floor=None):
    """table.md: one line per run (mean and [min-max] over its seeds), then what the columns mean. Every
    comparison between rows is made at equal seeds (a row with a third seed is not compared on it). floor: the
    grid's noise floor (record_floors), within which the same-seed columns count seeds as within, not better
    or worse."""
    by_name = {row.run: row for row in rows}
    local_row, dense_row = (by_name.get(references.get(role)) for role in ("local", "dense"))
    best = best_fixed(rows, references, exclude=floor and floor.run)
    floors = floor and floor.counted
    beats = dense_beats_local(local_row, dense_row)
    gap_header = "vs local and dense" if beats is False else "gap recovery"
    key = has_key_losses(rows)
    local_name, dense_name = references.get("local", "local"), references.get("dense", "dense")
    in_training = knows_training_flops(rows)
    header = ["run", "layers", "seeds", "val loss mean [min-max]", "global fraction", "attention FLOPs ideal",
              "computed (end / training mean)" if in_training else "computed", "KV bytes", "training tokens/s",
              "wall time", gap_header, "vs best fixed, same seed", f"vs {local_name}, same seed",
              f"vs {dense_name}, same seed"]
    if key:
        header[4:4] = ["key-token loss mean [min-max]"]
        header += [f"key-token loss vs {local_name}, same seed", f"key-token loss vs {dense_name}, same seed"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        kv, kv_dense = row.mean("kv_bytes"), row.mean("kv_bytes_dense")
        kv_text = "missing" if kv is None else human_bytes(kv) + (f" ({percent(kv / kv_dense, 0)})" if kv_dense else "")
        tok, wall = row.mean("tokens_per_s"), row.mean("wall_s")
        cells = [
            f"| {row.run}", row.layers, seeds_text(row), fmt_loss(row.stat("val_loss")),
            percent(row.mean("global_frac"), 1, missing="-" if row.kind == "fixed" else "missing"),
            percent(row.mean("flops_ideal"), 0, "missing"), percent(row.mean("flops_computed"), 0, "missing")
            + (f' / {percent(row.mean("flops_training"), 0)}' if in_training else ""), kv_text,
            "missing" if tok is None else f"{tok:,.0f}", "missing" if wall is None else f"{wall / 60:.1f} min",
            gap_text(row, local_row, dense_row), versus_best_fixed(row, best, floors),
            paired_text(row, local_row, floors=floors), paired_text(row, dense_row, floors=floors)]
        if key:
            cells[4:4] = [fmt_loss(row.stat("key_loss"))]
            cells += [paired_text(row, local_row, "key_loss", floors), paired_text(row, dense_row, "key_loss", floors)]
        lines.append(" | ".join(cells) + " |")
    seed_counts = {len(row.losses()) for row in rows if row.losses()}
    notes = ["", "Val loss: the evaluator's fixed validation windows (evaluate.py), mean over the row's seeds with "
             "[min-max]" + ("; rows ran different numbers of seeds, so compare rows in the same-seed columns, not "
                            "by these means" if len(seed_counts) > 1 else "") + ". "
             "Global fraction: routed layers' global decisions. Attention FLOPs and KV-cache bytes: relative to "
             "an all-dense model of the same shape" + ("; computed: what the kernels computed in the mode training "
             "runs, by the trained model at the end and as a mean over training's logged steps (they differ where "
             "heads committed to a path along the run)" if in_training else "") +
             ". Tokens/s: training steps only (the last process of the run); wall time: every training process "
             "of the run, mean over seeds."]
    local, dense = references.get("local"), references.get("dense")
    if beats:
        noise = f"; {dense} beats {local} on some seeds only, so these percentages are noise (the gap is a tie)" \
            if paired_verdict(paired_differences(dense_row, local_row)) != "better" else ""
        notes.append(f"Gap recovery: (loss_{local} - loss) / (loss_{local} - loss_{dense}), on the means over the "
                     f"seeds the run shares with both: 0% is {local}, 100% is {dense}{noise}.")
    elif beats is False:
        notes.append(f"{local} beats {dense}, so no gap to recover: the column says whether the run beats both "
                     f"on every seed they share, is worse than {local} on every seed, or ties.")
    else:
        notes.append("No local and dense reference rows with results at a common seed: no gap recovery.")
    if best:
        notes.append((f"Best fixed: {best.run}, the schedule without routed layers with the lowest val loss at "
                      f"equal seeds (the mean same-seed difference to {local})" if local_row else
                      f"Best fixed: {best.run}, the schedule without routed layers with the lowest mean val loss")
                     + (f"; {floor.run}, the noise floor's rerun of {floor.reference}, is not a candidate." if floor
                        else "."))
    if key:
        fractions = [r.get("key_frac") for row in rows for r in row.results if r.get("key_frac") is not None]
        notes.append("Key-token loss: the val loss on the targets a copy could predict only from beyond the local "
                     "window (nanoaha/key_tokens.py, docs/evaluation.md), "
                     + ("none here" if not fractions else
                        f"{percent(min(fractions), 1)} of the scored targets here" if min(fractions) == max(fractions)
                        else f"{percent(min(fractions), 1)}-{percent(max(fractions), 1)} of the scored targets here")
                     + "; its same-seed columns are read as the val loss's.")
    notes.append("Same seed: val loss minus the reference's at each seed both ran (a seed fixes the backbone init "
                 "and the data order for every row), mean [min, max] over those seeds; better or worse only where "
                 f"every seed differs in the same direction by {SMALLEST_DIFFERENCE:g} or more (prints as "
                 f"{SMALLEST_DIFFERENCE:.3f} or more), else a tie." if not floors else floor.note())
    incomplete = [row.run for row in rows if not row.complete]
    if incomplete:
        notes.append(f"**Incomplete**: {', '.join(incomplete)} (a seed failed or has not run); their numbers are over "
                     f"the seeds that finished, 'missing' where none did.")
    return "\n".join(lines + notes) + "\n"


def comparison_cell(by_name, run, other, absent, metric="val_loss", floors=None):
    """run's val loss (or metric) minus other's at the same seed (paired_text); absent where the grid lacks
    either."""
    return paired_text(by_name[run], by_name[other], metric, floors) if run in by_name and other in by_name \
        else absent


def comparisons_table(rows, comparisons, floor=None):
    """The comparisons table: per question, the first run's val loss minus the other's at the same seed, counted
    against the noise floor where the grid has one (record_floors). '' without comparisons."""
    if not comparisons:
        return ""
    by_name = {row.run: row for row in rows}
    floors = floor and floor.counted
    if not has_key_losses(rows):
        lines = ["| question | runs | val loss difference, same seed |", "|---|---|---|"]
        for question, (run, other) in comparisons.items():
            lines.append(f"| {question} | {run} - {other} | "
                         f"{comparison_cell(by_name, run, other, 'missing', floors=floors)} |")
        return "\n".join(lines) + "\n"
    lines = ["| question | runs | val loss difference, same seed | key-token loss difference, same seed |",
             "|---|---|---|---|"]
    for question, (run, other) in comparisons.items():
        lines.append(f"| {question} | {run} - {other} | "
                     f"{comparison_cell(by_name, run, other, 'missing', floors=floors)} | "
                     f"{comparison_cell(by_name, run, other, 'missing', 'key_loss', floors)} |")
    return "\n".join(lines) + "\n"


def history_differences(row, other, metric="val_loss"):
    """{seed: [[step, row's loss - other's], ...]} at the steps both runs evaluated during training (train.py's
    evaluations: val_history, or key_history for metric 'key_loss'), for the seeds both completed; step 0 (the
    untrained models) left out."""
    history, column = ("key_history", 1) if metric == "key_loss" else ("val_history", 1)
    def losses(result):
        return {entry[0]: entry[column] for entry in result.get(history) or [] if entry[column] is not None}
    theirs = {r["seed"]: losses(r) for r in other.results if r["complete"]}
    found = {}
    for result in row.results:
        if result["complete"] and result["seed"] in theirs:
            mine, ref = losses(result), theirs[result["seed"]]
            points = [[step, mine[step] - ref[step]] for step in sorted(set(mine) & set(ref)) if step > 0]
            if points:
                found[result["seed"]] = points
    return found


def below_zero_from(differences):
    """The first step from which the difference is below zero at every later evaluation of every seed (the
    seeds' common steps); None where the last evaluation is not below zero on every seed."""
    if not differences:
        return None
    steps = sorted(set.intersection(*({step for step, _ in points} for points in differences.values())))
    at = {seed: dict(map(tuple, points)) for seed, points in differences.items()}
    first = None
    for step in reversed(steps):
        if all(at[seed][step] < 0 for seed in at):
            first = step
        else:
            break
    return first


def comparison_curves_table(rows, comparisons, tokens_per_step):
    """Per question: from which step of training the first run's loss stays below the other's at every later
    evaluation of every seed, on all tokens and on key tokens, and the difference at the last common step.
    '' when no pair of runs has evaluations during training to compare."""
    by_name = {row.run: row for row in rows}
    metrics = ["val_loss", "key_loss"] if has_key_losses(rows) else ["val_loss"]
    lines = []
    for question, (run, other) in comparisons.items():
        if run not in by_name or other not in by_name:
            continue
        cells = []
        for metric in metrics:
            differences = history_differences(by_name[run], by_name[other], metric)
            if not differences:
                cells += ["-", "-"]
                continue
            step = below_zero_from(differences)
            cells.append("not at the last evaluation" if step is None else
                         f"step {step} ({step * tokens_per_step / 1e6:.1f}M tokens)")
            last = [points[-1] for points in differences.values()]
            cells.append(f"{sum(d for _, d in last) / len(last):+.3f} at step {min(s for s, _ in last)} "
                         f"({len(last)} seed{'s' if len(last) > 1 else ''})")
        if any(cell != "-" for cell in cells):
            lines.append(f"| {question} | {run} - {other} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    head = "| question | runs | all tokens: below 0 from | all tokens: last |"
    if len(metrics) == 2:
        head += " key tokens: below 0 from | key tokens: last |"
    return "\n".join([head, "|---|---|" + "---|" * 2 * len(metrics), *lines]) + "\n"


def per_layer_table(rows):
    """Per routed run and layer, means over its seeds: the global fraction of its heads' decisions and of its
    tokens (any head global), the key tokens the layer sends global (recall: of the key tokens, those any head
    of the layer sent global) and the precision of what it sends,
    and what its global attention buys (the loss with only its routers forced local, minus the trained loss, on
    all and on key tokens). '' where no run has these numbers."""
    lines = []
    for row in rows:
        per_seed = [r.get("per_layer_routing") or [] for r in row.results if r["complete"]]
        per_seed = [layers for layers in per_seed if layers]
        if not per_seed:
            continue
        for i, first in enumerate(per_seed[0]):
            def mean(key):
                values = [layers[i].get(key) for layers in per_seed if i < len(layers)]
                values = [v for v in values if v is not None]
                return sum(values) / len(values) if values else None
            lines.append(f"| {row.run} | {first['layer']} | {percent(mean('decisions_global_frac'))} / "
                         f"{percent(mean('global_frac'))} | "
                         f"{percent(mean('key_recall'))} / {percent(mean('key_precision'))} | "
                         f"{signed(mean('forced_local_val'))} | {signed(mean('forced_local_key'))} |")
    if not lines:
        return ""
    return "\n".join(["| run | layer | global: head decisions / tokens | key tokens: recall / precision | "
                      "layer forced local: val loss | ... key-token loss |", "|---|---|---|---|---|---|",
                      *lines]) + "\n"


COPY_HEAD_GAIN = 0.1  # nats of copy gain (train.py's repeat probe) that count as a copy head: 5x its noise (+-0.02)


def copy_head_step(result):
    """The first evaluation step at which the repeat probe's copy gain reached COPY_HEAD_GAIN, where it ends at or
    above it (a copy head grew); False where it ends below; None where the run was not probed during training."""
    history = result.get("copy_history") or []
    if not history:
        return None
    if history[-1][1] < COPY_HEAD_GAIN:
        return False
    return next(step for step, gain, *_ in history if gain >= COPY_HEAD_GAIN)


def copy_head_table(rows):
    """Where each run's copy head sits, per seed, from train.py's repeat probe at its last evaluation: the head of
    highest induction score (layer.head, counted from 0 as in the heatmaps) and, in each layer below it, the highest
    previous-token score (a copy head reads what a previous-token head below it wrote; Olsson et al., 2022), with
    the copy gain. '' where no run kept the probe's head scores (runs trained before it kept them)."""
    lines = []
    for row in rows:
        for result in row.results:
            history = result.get("copy_history") or []
            if not result["complete"] or not history or len(history[-1]) < 4 or not history[-1][3]:
                continue
            _, gain, _, heads = history[-1][:4]
            induction, previous = heads["induction"], heads["previous"]
            layer, head = max(((i, j) for i, layer_scores in enumerate(induction) for j in range(len(layer_scores))),
                              key=lambda ij: induction[ij[0]][ij[1]])
            if induction[layer][head] <= 0:  # local layers have no induction score: nothing reads beyond its window
                strongest, below = "-", "-"
            else:
                strongest = f"{layer}.{head}: {induction[layer][head]:.2f}"
                below = ", ".join(f"{i}.{previous[i].index(max(previous[i]))}: {max(previous[i]):.2f}"
                                  for i in range(layer)) or "-"
            lines.append(f"| {row.run} | {row.layers} | {result['seed']} | {gain:+.2f}"
                         f"{' (a copy head)' if copy_head_step(result) is not False else ''} | {strongest} | {below} |")
    if not lines:
        return ""
    return "\n".join(["| run | layers | seed | copy gain | strongest induction head (layer.head: score) | "
                      "strongest previous-token head of each layer below |", "|---|---|---|---|---|---|",
                      *lines]) + "\n"


def agreement_text(diffs, floor=None):
    """How many same-seed differences say better, worse or tie (within SMALLEST_DIFFERENCE), e.g. 'worse on 3 of
    3', 'better on 1, worse on 2 of 3'; with a noise floor, the differences within +-floor are counted as such
    ('better on 1, within +-0.020 on 3, worse on 1 of 5')."""
    inside = (lambda d: abs(d) <= floor) if floor else (lambda d: abs(d) < SMALLEST_DIFFERENCE)
    counts = {"better": sum(d < 0 and not inside(d) for d in diffs),
              "worse": sum(d > 0 and not inside(d) for d in diffs)}
    counts["tie" if not floor else f"within \u00b1{floor:.3f}"] = sum(inside(d) for d in diffs)
    said = [f"{word} on {n}" for word, n in counts.items() if n]
    return f"{', '.join(said)} of {len(diffs)}"


def noise_floor(floor_row, ref, metric="val_loss"):
    """(floor, differences): the same-seed differences of floor_row (the reference on another data order) to the
    reference row, and the largest of them in size, how far two equally good runs land at one seed; floor None
    below two seeds (or without floor_row)."""
    diffs = paired_differences(floor_row, ref, metric) if floor_row is not None else []
    return (max(abs(d) for d in diffs) if len(diffs) >= 2 else None), diffs


@dataclasses.dataclass
class NoiseFloor:
    """A grid's noise floor as its record's tables apply it: the run that is the reference on another data
    order, the reference, and the floor per metric (noise_floor; None where the floor row lacks two seeds)."""
    run: str
    reference: str
    values: dict

    @property
    def counted(self):
        """{metric: floor} for the tables to count against (paired_text), None until the floor row has two seeds."""
        return self.values if self.values["val_loss"] is not None else None

    def note(self):
        key = self.values.get("key_loss")
        return (f"Same seed: val loss minus the reference's at each seed both ran (a seed fixes the backbone init "
                f"and the data order for every row), mean [min, max] over those seeds, and on how many seeds the "
                f"difference is better, worse or within the noise floor: \u00b1{self.values['val_loss']:.3f}"
                + (f" (key tokens \u00b1{key:.3f})" if key else "") +
                f", the largest same-seed difference of `{self.run}` ({self.reference} on another data order, same "
                f"init) to {self.reference}, a difference two equally good runs also show.")


def record_floors(rows, headline):
    """The grid's noise floor for its record's tables (NoiseFloor), from the headline's noise_floor run against
    its reference; None where the grid names none. Its values are None where the floor row has fewer than two
    seeds: the tables then call a tie a difference under SMALLEST_DIFFERENCE."""
    floor_run = (headline or {}).get("noise_floor")
    by_name = {row.run: row for row in rows}
    if not floor_run or floor_run not in by_name or headline["reference"] not in by_name:
        return None
    values = {metric: noise_floor(by_name[floor_run], by_name[headline["reference"]], metric)[0]
              for metric in ("val_loss", "key_loss")}
    return NoiseFloor(floor_run, headline["reference"], values)


def noise_floor_text(floor_run, reference, floors):
    """The line under a headline table that says its noise floor. floors: {metric: noise_floor's (floor,
    differences)} for val_loss and key_loss."""
    (floor, diffs), (key_floor, key_diffs) = floors["val_loss"], floors["key_loss"]
    listed = ", ".join(map(signed, diffs))
    if floor is None:
        return (f"Noise floor: `{floor_run}` ({reference} on another data order, same init) has {len(diffs)} seed"
                f"{'' if len(diffs) == 1 else 's'}{f' ({listed})' if diffs else ''} against {reference}; until it "
                f"has two, a tie is a difference under {SMALLEST_DIFFERENCE}.\n")
    key = f" (key tokens {', '.join(map(signed, key_diffs))})" if key_floor is not None else ""
    key_within = f" (key tokens \u00b1{key_floor:.3f})" if key_floor is not None else ""
    return (f"Noise floor: `{floor_run}` ({reference} on another data order, same init) against {reference} at the "
            f"same seed: {listed}{key} over {len(diffs)} seeds; a difference within the largest, \u00b1{floor:.3f}"
            f"{key_within}, is one two equally good runs also show, and the table counts it as within.\n")


def headline_table(rows, runs, reference, floor_run=None):
    """The README's table: per run (runs: {run: what it is}), all-token and key-token val loss, the same-seed
    difference to `reference` on both with how many seeds agree, the copy-head count (the seeds whose repeat probe
    ends at COPY_HEAD_GAIN or more, of those probed during training), attention FLOPs ideal (the trained model's
    decisions) and as computed in training (the mean over the run's logged steps), KV-cache bytes and training
    tokens/s, each from the seeds the record has. floor_run: the reference on another data order, whose
    differences to it set the noise floor (noise_floor) within which the cells count ties, said under the table."""
    by_name = {row.run: row for row in rows}
    ref = by_name[reference]
    floors = {metric: noise_floor(by_name.get(floor_run), ref, metric) for metric in ("val_loss", "key_loss")}
    computed = "flops_training" if knows_training_flops(rows) else "flops_computed"  # older records: the end's
    lines = [f"| run | what it is | seeds | val loss | key-token loss | vs {reference}, same seed | key tokens vs "
             f"{reference} | copy head | attention FLOPs ideal / in training | KV cache | training tokens/s |",
             "|" + "---|" * 11]
    for run, what in runs.items():
        row = by_name.get(run)
        if row is None:
            lines.append(f"| {run} | {what} | 0 (not in this record) |" + " - |" * 8)
            continue
        done = [r for r in row.results if r["complete"]]
        cells = []
        for metric in ("val_loss", "key_loss"):
            diffs = paired_differences(row, ref, metric)
            stat = spread(diffs)
            cells.append("reference" if run == reference else "-" if stat is None else
                         f"{signed(stat[0])} [{signed(stat[1])}, {signed(stat[2])}], "
                         f"{agreement_text(diffs, floors[metric][0])}")
        probed = [copy_head_step(r) for r in done if copy_head_step(r) is not None]
        copy = f"{sum(step is not False for step in probed)} of {len(probed)}" if probed else "not probed"
        if probed and len(probed) < len(done):
            copy += f" ({len(done) - len(probed)} not probed)"
        kv = spread([r["kv_bytes"] / r["kv_bytes_dense"] for r in done if r.get("kv_bytes") and r.get("kv_bytes_dense")])
        tokens = row.mean("tokens_per_s")
        lines.append(f"| {run} | {what} | {len(done)} | {fmt_loss(row.stat('val_loss'))} | "
                     f"{fmt_loss(row.stat('key_loss'))} | {cells[0]} | {cells[1]} | {copy} | "
                     f"{percent(row.mean('flops_ideal'), 0)} / {percent(row.mean(computed), 0)} | "
                     f"{percent(kv and kv[0], 0)} | {'-' if tokens is None else f'{tokens:,.0f}'} |")
    return "\n".join(lines) + "\n" + (noise_floor_text(floor_run, reference, floors) if floor_run else "")


def record_table(rows, references, comparisons, floor=None):
    """A record's table.md: results_table, then the grid's comparisons table where it asks any; floor: the grid's
    noise floor (record_floors), which both count same-seed differences against."""
    table = results_table(rows, references, floor)
    if comparisons:
        floors = floor and floor.counted
        against = "" if not floors else f", counted against the noise floor (\u00b1{floors['val_loss']:.3f}" + (
            f", key tokens \u00b1{floors['key_loss']:.3f}" if floors.get("key_loss") else "") + ")"
        table += "\nComparisons (the grid file's): val loss of the first run minus the other's at the same seed" \
            f"{against}.\n\n" + comparisons_table(rows, comparisons, floor)
    return table


def save_rows(path, grid, rows):
    """rows.json of a record: the grid's name, references and comparisons and every row with its per-seed
    results, so that tables and plots can be drawn again from the record alone (load_rows)."""
    write_json(path, stamp("rows", {"grid": grid.name, "references": grid.references,
                                    "comparisons": {q: list(pair) for q, pair in grid.comparisons.items()},
                                    "rows": [dataclasses.asdict(r) for r in rows]}))


def load_rows(record):
    """(grid name, references, rows, comparisons) from a record folder that compare.py wrote, in the current
    format (nanoaha/formats.py)."""
    path = os.path.join(record, "rows.json")
    saved = upgrade("rows", read_json(path), path) if os.path.isdir(record) else None
    if not saved:
        raise GridError(f"{path} not found or not JSON: name a record folder that compare.py wrote "
                        f"(results/<date>_<grid>)")
    try:
        return (saved["grid"], saved["references"], [Row(**row) for row in saved["rows"]],
                {q: tuple(pair) for q, pair in saved["comparisons"].items()})
    except (KeyError, TypeError, ValueError) as e:
        raise GridError(f"{path} is not a rows.json that compare.py wrote ({type(e).__name__}: {e})") from None


def summary_comparisons(grids):
    """The comparisons of several grids in one table, a column per grid: every grid's questions, each answered
    by every grid that has both its runs, whether or not it asks that question itself ('-' where it lacks
    them). grids: [(title, rows, comparisons)]."""
    questions = list(dict.fromkeys((q, pair) for _, _, comparisons in grids for q, pair in comparisons.items()))
    if not questions:
        return ""
    lines = ["| question | runs | " + " | ".join(f"{title}: same seed" for title, _, _ in grids) + " |",
             "|" + "---|" * (2 + len(grids))]
    by_grid = [{row.run: row for row in rows} for _, rows, _ in grids]
    for question, (run, other) in questions:
        cells = [comparison_cell(by_name, run, other, "-") for by_name in by_grid]
        lines.append(f"| {question} | {run} - {other} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_table(grids):
    """One table over several grids with the same runs: per run, for each grid, the val loss (mean [min-max]),
    the routed global fraction, the ideal attention FLOPs vs dense, and the same-seed differences to the grid's
    best fixed schedule and to local. grids: [(title, rows, references)]."""
    key = [has_key_losses(rows) for _, rows, _ in grids]  # a grid evaluated with key tokens gets its columns
    names, layers = [], {}
    for _, rows, _ in grids:
        for row in rows:
            if row.run not in layers:
                names.append(row.run)
                layers[row.run] = row.layers
    columns = ("val loss", "global", "attn FLOPs", "vs best fixed, same seed", "vs local, same seed")
    key_columns = ("key-token loss", "key-token loss vs local, same seed")
    header = ["run", "layers"] + [f"{title}: {column}" for (title, _, _), has_key in zip(grids, key)
                                  for column in columns + (key_columns if has_key else ())]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_grid = []
    for _, rows, references in grids:
        by_name = {row.run: row for row in rows}
        by_grid.append((by_name, best_fixed(rows, references), by_name.get(references.get("local"))))
    for name in names:
        cells = [name, layers[name]]
        for (by_name, best, local_row), has_key in zip(by_grid, key):
            row = by_name.get(name)
            if row is None:
                cells += ["-"] * (len(columns) + (len(key_columns) if has_key else 0))
                continue
            cells += [fmt_loss(row.stat("val_loss")), percent(row.mean("global_frac"), 1),
                      percent(row.mean("flops_ideal"), 0, "missing"), versus_best_fixed(row, best),
                      paired_text(row, local_row)]
            if has_key:
                cells += [fmt_loss(row.stat("key_loss")), paired_text(row, local_row, "key_loss")]
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["", "Val loss on each grid's fixed validation windows, mean over the row's seeds with [min-max]; global: "
             "the routed layers' global decisions; attention FLOPs: ideal, vs an all-dense model of the same shape; "
             "same seed: val loss minus the reference's at each seed both ran, mean [min, max], better or worse "
             f"only where every seed differs in the same direction by {SMALLEST_DIFFERENCE:g} or more, else a tie. "
             "Best fixed: the schedule without routed layers with the lowest mean same-seed difference to local."
             + (" Key-token loss: the loss on the targets a copy could predict only from beyond the local window "
                "(docs/evaluation.md), for grids evaluated with key tokens." if any(key) else "")]
    for (title, rows, _), (_, best, _) in zip(grids, by_grid):
        if best:
            notes.append(f"{title}: best fixed schedule {best.run} ({fmt_loss(best.stat('val_loss'))}).")
    return "\n".join(lines + notes) + "\n"


def summary_record_table(grids):
    """A summary's table.md: summary_table, then summary_comparisons where any grid asks a question.
    grids: [(title, rows, references, comparisons)]."""
    table = summary_table([(title, rows, references) for title, rows, references, _ in grids])
    compared = summary_comparisons([(title, rows, comparisons) for title, rows, _, comparisons in grids])
    return table + ("\n" + compared if compared else "")
