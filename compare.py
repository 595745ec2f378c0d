"""Run a grid of trainings and compare them at equal budget: one command from grid file to record.

    python compare.py configs/grids/NAME.py [--jobs=2] [--threads=1] [--out=out/grids] [--record_dir=results] [--dry_run]
                      [--from_record=results/DATE_NAME]
    python compare.py --summary=NAME RECORD [RECORD ...]

Trains every run of the grid file at every seed as train.py would (one process each, --jobs at a time, by
default one per CPU core with one thread each, which trains more tokens per hour than fewer jobs with more
threads: bench/grid_cores.py; each writes OUT/NAME/RUN__seed_S/train.log and TensorBoard events), skips complete runs, resumes
interrupted ones, evaluates each checkpoint with evaluate.py, and writes the record RECORD_DIR/<date>_NAME/
(a record is written once: if that folder exists, <date>_NAME_2/ and so on):
README.md (question, command, budget, table, final log lines), table.md, rows.json (every number of the table
and the plots, per seed), the grid file and the plots.
--dry_run prints the plan: each run's command and whether it will be trained, resumed or skipped.
--partial writes the record of the runs finished so far and trains nothing (a grid that spans sessions: stop
the runner, record, commit; the same command without --partial resumes); the table names the others.
A record keeps each finished run's small files (runs/RUN__seed_S/: summary, evaluation, launches, log; no
checkpoint); --from_record=RECORD takes them back into run folders that do not exist, so a grid grown in a
later session trains only its new runs (nanoaha/grid/kept.py); a run the record did not keep as files but has in
rows.json, trained with the same settings, comes back as its numbers (it trains nothing).
--summary=NAME puts several records (grids with the same runs, e.g. one per corpus) side by side in one table
and one plot: RECORD_DIR/<date>_NAME/ with README.md, table.md and pareto.png, drawn from their rows.json.
Exit code 0 only when every run of the grid finished and was evaluated. The grid file format: nanoaha/grid/gridfile.py.
"""
import os
import platform
import shlex
import shutil
import signal
import sys
import time
from dataclasses import dataclass

from nanoaha.configurator import paths_and_settings, run_main
from nanoaha.grid import plots, runner
from nanoaha.grid.gridfile import GridError, load_grid
from nanoaha.grid.kept import KEPT_DIR, keep_runs, restore_runs, take_results
from nanoaha.grid.lock import GridLock
from nanoaha.grid.plan import describe, launches, plan, train_state, window_groups
from nanoaha.grid.tables import (COPY_HEAD_GAIN, comparison_curves_table, copy_head_table, has_key_losses,
                                 headline_table, history_differences, load_rows, per_layer_table, record_floors,
                                 record_table, rows_of, save_rows, summary_record_table)


@dataclass
class CompareConfig:
    jobs: int = 0                 # trainings at a time; 0: one per CPU core (bench/grid_cores.py: the faster)
    threads: int = 0              # threads of each training and evaluation; 0: the cores shared among the jobs
    out: str = "out/grids"        # runs train in OUT/<grid>/<run>__seed_<seed>
    record_dir: str = "results"   # the record goes to RECORD_DIR/<date>_<grid>/
    dry_run: bool = False         # print the plan, run nothing
    summary: str = ""             # NAME: the records named on the command line side by side, in RECORD_DIR/<date>_NAME
    from_record: str = ""         # a record of this grid: its kept runs fill the run folders that do not exist
    headline: str = ""            # a record of this grid: print its headline table (the grid file's headline rows)
    redraw: str = ""              # a record: draw its plots again from its rows.json and its copy of the grid file
    partial: bool = False         # record the runs finished so far, training nothing (a grid that spans sessions)


def log_tail(path, n=3):
    """The last n non-empty lines of a log."""
    try:
        with open(path) as f:
            lines = [line.rstrip() for line in f if line.strip()]
    except FileNotFoundError:
        return ["(no train.log)"]
    return lines[-n:]


def budget_lines(grid, jobs, cfg, started, elapsed, taken=None):
    """The record's budget: trainings, steps, tokens, and the process hours the runs took."""
    taken = taken or {}
    sources = sorted({result["taken_from"] for result in taken.values()})
    tokens = sum(j.tcfg.max_iters * j.tcfg.batch_size * j.tcfg.grad_accum * j.mcfg.block_size for j in jobs)
    wall = {step: sum(run["wall_s"] for j in jobs for run in launches(j.out_dir) if run["step"] == step)
            for step in ("train", "evaluate")}
    steps = sorted({j.tcfg.max_iters for j in jobs})
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))  # launches.json's format
    launched = sum(run["started"] >= since for j in jobs for run in launches(j.out_dir))
    return [f"- {len(grid.runs)} runs, {len(jobs)} trainings (seeds {', '.join(map(str, grid.seeds))}"
            f"{'; some runs set their own' if any(s != grid.seeds for s in grid.run_seeds.values()) else ''}); "
            f"steps per run: {', '.join(map(str, steps))}; {tokens / 1e6:.1f}M training tokens in all.",
            f"- Process time: training {wall['train'] / 3600:.2f} h, evaluation {wall['evaluate'] / 3600:.2f} h "
            f"(summed over every process the runner started for these runs, earlier invocations included); "
            + (f"this invocation: {launched} processes, {elapsed / 3600:.2f} h wall with --jobs={cfg.jobs} --threads={cfg.threads}." if launched
               else "this invocation started no process (" + ("--partial: the finished runs, the others named below"
                                                               if cfg.partial else "every run was complete and evaluated")
               + "): the record is drawn from the runs' files."),
            *([f"- {len(taken)} training(s) came as numbers from an earlier record's rows.json (their run folders "
               f"are gone; trained and evaluated with this grid's settings): {', '.join(sorted(j.label for j in jobs if j.key in taken))}"
               f" from {', '.join(sources)}; their process time is not counted above."] if taken else []),
            f"- Machine: {platform.machine()}, {os.cpu_count()} CPU cores, OMP_NUM_THREADS="
            f"{cfg.threads} in every process; Python {platform.python_version()}."]


def new_record_dir(record_dir, name):
    """RECORD_DIR/<date>_NAME, or <date>_NAME_2, _3, ... when that exists: a record is written once, so a
    second run of a finished grid (more rows, more seeds) makes a new record beside the old one."""
    base = os.path.join(record_dir, f"{time.strftime('%Y-%m-%d')}_{name}")
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}_{n}"
    os.makedirs(path)
    return path


def val_curves(jobs, rows, history="val_history"):
    """(label, [[step, loss], ...]) of each row's first seed; a run that starts from another run's checkpoint
    is drawn after that run's steps, so that every curve's step axis counts all the steps behind it.
    history='key_history': the loss on key tokens instead (None where the windows held none);
    'copy_history': the repeat probe's copy gain, from the row's first seed that has it (runs trained before
    the probe have none), its label naming that seed."""
    checkpoints = {os.path.join(job.out_dir, "ckpt.pt"): job for job in jobs}
    first = {}
    for job in jobs:
        first.setdefault(job.run, job)
    curves = []
    for row in rows:
        source = checkpoints.get(first[row.run].tcfg.init_from)
        offset = source.tcfg.max_iters if source else 0
        label = f"{row.run} (after {source.run})" if source else row.run
        result = row.results[0]
        if history == "copy_history":
            result = next((r for r in row.results if r.get(history)), result)
        label += f", seed {result['seed']}"
        points = result.get(history) or []  # records before key tokens have no key_history
        curves.append((label, [[entry[0] + offset, entry[1]] for entry in points]))
    return curves


def along_training(record, grid, jobs, rows):
    """The comparisons along training (train.py's evaluations, same seed): comparison_curves.png and the README
    lines that show it and its table; [] where no compared pair has evaluations during training."""
    if not grid.comparisons:
        return []
    tokens_per_step = jobs[0].tcfg.batch_size * jobs[0].tcfg.grad_accum * jobs[0].mcfg.block_size
    table = comparison_curves_table(rows, grid.comparisons, tokens_per_step)
    if not table:
        return []
    by_name = {row.run: row for row in rows}
    pairs = [(f"{run} - {other}", by_name[run], by_name[other]) for run, other in grid.comparisons.values()
             if run in by_name and other in by_name]
    panels = [(title, [(label, history_differences(a, b, metric)) for label, a, b in pairs
                       if history_differences(a, b, metric)])
              for title, metric in (("all tokens", "val_loss"), ("key tokens", "key_loss"))
              if metric == "val_loss" or has_key_losses(rows)]
    plots.comparison_curves(os.path.join(record, "comparison_curves.png"), panels)
    return ["## Along training", "",
            "The comparisons at every evaluation during training (train.py's, on its fixed val windows), same "
            "seed: the first step from which the first run's loss stays below the other's at every later "
            "evaluation of every seed, and the difference at the last one (mean over seeds).", "",
            table, "![loss differences along training, same seed](comparison_curves.png)", ""]


def per_layer_lines(rows):
    """The README's per-layer routing section (tables.per_layer_table); [] where no run has it."""
    table = per_layer_table(rows)
    return ["## Per layer", "",
            "Where each routed run spends global attention and what it buys, per layer (evaluate.py's, means over "
            "the seeds): the global fraction of the layer's head decisions and of its tokens (a token any head sent "
            "global counts); of the key tokens, those any head of the layer sent global (recall) "
            "and of what it sent, the key tokens (precision; picked at random it would be the key share); and "
            "the loss with only that layer's routers forced local, minus the trained loss.", "",
            table] if table else []


def copy_head_lines(rows):
    """The README's section on where the copy heads sit (tables.copy_head_table); [] where no run has it."""
    table = copy_head_table(rows)
    return ["## Where the copy head sits", "",
            "train.py's repeat probe at each run's last evaluation (a val span read twice; "
            "[evaluation.md](../../docs/evaluation.md#the-repeat-probe-copying-from-beyond-the-window)): the head that reads most from the token after the earlier "
            f"copy (induction score), and how strongly a head of each layer below attends to the previous token; a "
            f"copy head: copy gain {COPY_HEAD_GAIN} nats or more.", "", table] if table else []


def headline_lines(grid, rows):
    """The record's first table, where the grid file names its headline rows."""
    if not grid.headline:
        return []
    return ["## Headline", "", f"Against {grid.headline['reference']} at the same seed; a copy head: the repeat "
            f"probe's copy gain ends at {COPY_HEAD_GAIN} nats or more.", "",
            headline_table(rows, grid.headline["runs"], grid.headline["reference"], grid.headline.get("noise_floor")),
            ""]


def draw_plots(record, grid, jobs, rows):
    """The record's plots, from its rows and the grid's plan (no run folder needed); returns the README lines of
    the comparisons along training and the file names of the heatmaps and head-score plots."""
    plots.pareto(os.path.join(record, "pareto.png"), rows, grid.references)
    if has_key_losses(rows):
        plots.pareto(os.path.join(record, "pareto_key_tokens.png"), rows, grid.references, metric="key_loss")
    by_name = {row.run: row for row in rows}
    plots.window(os.path.join(record, "window.png"),
                 [[(w, by_name[run]) for w, run in group] for group in window_groups(jobs)])
    plots.val_curves(os.path.join(record, "val_curves.png"), val_curves(jobs, rows))
    key_curves = val_curves(jobs, rows, "key_history")
    if any(loss is not None for _, points in key_curves for _, loss in points):
        plots.val_curves(os.path.join(record, "key_curves.png"), key_curves, "key-token loss (train.py's eval)")
    copy_curves = val_curves(jobs, rows, "copy_history")
    if any(points for _, points in copy_curves):
        plots.val_curves(os.path.join(record, "copy_curves.png"), copy_curves,
                         "copy gain (nats; train.py's repeat probe)", seeds="a seed with the probe")
    along = along_training(record, grid, jobs, rows)
    heatmaps = []
    for row in rows:
        first = row.results[0]
        if row.kind == "routed" and first["per_head"]:
            name = f"heatmap_{row.run}.png"
            plots.heatmap(os.path.join(record, name), f"{row.run} seed {first['seed']}", first["per_head"], row.layers)
            heatmaps.append(name)
    for row in rows:  # where routing or a random layout decides the heads: which head does what, and when
        by_seed = {r["seed"]: r["copy_history"] for r in row.results
                   if r["complete"] and any(len(entry) > 3 and entry[3] for entry in r.get("copy_history") or [])}
        if row.kind != "fixed" and by_seed:
            name = f"heads_{row.run}.png"
            plots.head_scores(os.path.join(record, name), row.run, by_seed, row.layers)
            heatmaps.append(name)
    return along, heatmaps


def write_record(grid, jobs, rows, table, cfg, argv, started, elapsed, taken=None):
    """RECORD_DIR/<date>_<grid>/ with README.md, table.md, the grid file and the plots; returns its path."""
    record = new_record_dir(cfg.record_dir, grid.name)
    with open(os.path.join(record, "table.md"), "w") as f:
        f.write(table)
    save_rows(os.path.join(record, "rows.json"), grid, rows)
    keep_runs(record, jobs, {(row.run, result["seed"]) for row in rows for result in row.results if result["complete"]})
    shutil.copyfile(grid.path, os.path.join(record, os.path.basename(grid.path)))
    along, heatmaps = draw_plots(record, grid, jobs, rows)
    command = shlex.join(["python", "compare.py", *argv])
    lines = [f"# Grid {grid.name}", "", f"Date: {time.strftime('%Y-%m-%d')}. Written by compare.py.", "",
             "## Question", "", grid.doc or "(the grid file has no docstring)", "",
             "## Command", "", "```bash", command, "```", "",
             f"Grid file: [{os.path.basename(grid.path)}]({os.path.basename(grid.path)}) (a copy). Each run trains "
             f"in `{os.path.join(cfg.out, grid.name)}/RUN__seed_S/` (train.log, TensorBoard events under tb/, "
             f"ckpt.pt, train_summary.json, eval.json).", "",
             "## Budget", "", *budget_lines(grid, jobs, cfg, started, elapsed, taken), "",
             *headline_lines(grid, rows),
             "## Results", "", "[table.md](table.md):", "", table, "", *per_layer_lines(rows), *copy_head_lines(rows),
             *along, "## Plots", "",
             "![val loss against attention FLOPs](pareto.png)", "",
             *(["![key-token loss against attention FLOPs](pareto_key_tokens.png)", ""] if has_key_losses(rows)
               else []),
             *(["![global fraction against window](window.png)", ""]
               if os.path.exists(os.path.join(record, "window.png")) else []),
             "![val loss curves](val_curves.png)", "",
             *(["![key-token loss curves](key_curves.png)", ""]
               if os.path.exists(os.path.join(record, "key_curves.png")) else []),
             *(["![copy gain curves: how much better each run predicts a val span the second time it reads it, "
                "from beyond the window](copy_curves.png)", ""]
               if os.path.exists(os.path.join(record, "copy_curves.png")) else []),
             *[f"![{name}]({name})" for name in heatmaps], "",
             "## Final log lines", ""]
    for job in jobs:
        tail = [f"(numbers from {taken[job.key]['taken_from']}/rows.json: no run folder)"] if job.key in (taken or {}) \
            else log_tail(os.path.join(job.out_dir, "train.log"))
        lines += [f"{job.label}:", "", "```text", *tail, "```", ""]
    with open(os.path.join(record, "README.md"), "w") as f:
        f.write("\n".join(lines))
    return record


def write_summary(records, cfg, argv):
    """RECORD_DIR/<date>_NAME/: the records' rows in one table (tables.summary_record_table) and one plot (one Pareto
    panel per record); returns its path and the table."""
    grids = [(os.path.basename(os.path.normpath(path)), *load_rows(path)) for path in records]
    table = summary_record_table([(name, rows, references, comparisons) for _, name, references, rows, comparisons
                                  in grids])
    record = new_record_dir(cfg.record_dir, cfg.summary)
    with open(os.path.join(record, "table.md"), "w") as f:
        f.write(table)
    plots.pareto_panels(os.path.join(record, "pareto.png"), [(name, rows, refs) for _, name, refs, rows, _ in grids])
    sources = [f"- [{folder}](../{folder}/): grid {name}" for folder, name, _, _, _ in grids]
    lines = [f"# Summary {cfg.summary}", "", f"Date: {time.strftime('%Y-%m-%d')}. Written by compare.py from the "
             "records below (their rows.json); the runs, budgets and commands are in each record.", "",
             "## Command", "", "```bash", shlex.join(["python", "compare.py", *argv]), "```", "",
             "## Records", "", *sources, "", "## Table", "", table, "", "## Plot", "",
             "![val loss against attention FLOPs, one panel per grid](pareto.png)", ""]
    with open(os.path.join(record, "README.md"), "w") as f:
        f.write("\n".join(lines))
    return record, table


def warn_oversubscribed(jobs, threads, cores=None):
    """One warning line when the jobs' threads outnumber the CPU cores: they then take turns, and every run
    (and its tokens/s in the record) is slower than the grid's budget assumes."""
    cores = cores or os.cpu_count() or 1
    if jobs * threads > cores:
        print(f"WARNING: --jobs={jobs} x --threads={threads} = {jobs * threads} threads on {cores} CPU cores: the "
              f"runs share the cores and each is slower; use jobs x threads <= {cores}", file=sys.stderr)


stopped_by = None  # the signal that stopped the grid: the exit status is 128 + its number, as a shell's


def stop_grid(signum, frame):
    """First signal: start no new training, let the running ones save a checkpoint and stop; then exit."""
    global stopped_by
    if not runner.stop_requested.is_set():
        stopped_by = signum
        print(f"\n{signal.Signals(signum).name}: stopping the running trainings (each saves a checkpoint)",
              file=sys.stderr, flush=True)
        runner.request_stop()


PARTIAL_STATES = {"resume": "stopped short of its steps: a later run of the grid resumes it",
                  "train": "not started"}


def run_grid(grid, jobs, cfg, argv, taken=None):
    """Train and evaluate the jobs (but those whose numbers are taken from a record), write the record; the exit
    code."""
    taken = taken or {}
    to_run = [job for job in jobs if job.key not in taken]
    states = {job.key: train_state(job, grid, cfg.out) for job in to_run}  # refuses run folders trained with
    not_run = {}                                                             # another command, before any run
    if cfg.partial:  # finished runs only (the runner evaluates any not evaluated yet); the others are listed
        not_run = {job.key: f"not finished ({PARTIAL_STATES[states[job.key]]})" for job in to_run
                   if states[job.key] != "skip"}
        to_run = [job for job in to_run if job.key not in not_run]
    started = time.time()
    previous = {sig: signal.signal(sig, stop_grid) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = runner.run_jobs(to_run, grid, cfg.out, cfg.jobs, threads=cfg.threads,
                                 done={**{key: "ok" for key in taken}, **not_run})
    finally:  # a caller in this process (a test, a notebook) keeps its own handlers afterwards
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if runner.stop_requested.is_set():
        print("interrupted: run the same command again to resume (complete runs are skipped)", file=sys.stderr)
        return 128 + (stopped_by or signal.SIGINT)
    rows = rows_of(jobs, status, taken)
    table = record_table(rows, grid.references, grid.comparisons, record_floors(rows, grid.headline))
    record = write_record(grid, jobs, rows, table, cfg, argv, started, time.time() - started, taken)
    print(table)
    print(f"record: {record}")
    unfinished = [job.label for job in jobs if status.get(job.key) != "ok"]
    if unfinished:
        print(f"grid incomplete: {len(unfinished)} of {len(jobs)} trainings did not finish ({', '.join(unfinished)})",
              file=sys.stderr)
        return 1
    return 0


def main(argv):
    paths, cfg = paths_and_settings(argv, CompareConfig, usage=__doc__)
    if cfg.summary:
        if not paths:
            sys.exit("--summary=NAME: name the record folders to put side by side (results/<date>_<grid> ...)")
        try:
            record, table = write_summary(paths, cfg, argv)
        except GridError as e:
            sys.exit(f"error: {e}")
        print(table)
        print(f"summary: {record}")
        return 0
    if cfg.redraw:
        try:
            name, _, rows, _ = load_rows(cfg.redraw)
            grid = load_grid(os.path.join(cfg.redraw, f"{name}.py"))
            draw_plots(cfg.redraw, grid, plan(grid, cfg.out), rows)
        except GridError as e:
            sys.exit(f"grid error: {e}")
        print(f"plots drawn again in {cfg.redraw}")
        return 0
    if len(paths) != 1:
        sys.exit("name one grid file: python compare.py configs/grids/NAME.py [--jobs=2] [--dry_run]")
    if cfg.headline:
        try:
            grid, (_, _, rows, _) = load_grid(paths[0]), load_rows(cfg.headline)
            if not grid.headline:
                raise GridError(f"{paths[0]} names no headline rows: add headline = {{'reference': RUN, 'runs': ...}}")
            print("\n".join(headline_lines(grid, rows)), end="")
        except (GridError, KeyError) as e:
            sys.exit(f"grid error: {e}")
        return 0
    if cfg.jobs < 0 or cfg.threads < 0:
        sys.exit(f"--jobs={cfg.jobs} --threads={cfg.threads}: use a positive number, or 0 for the default")
    cfg.jobs = cfg.jobs or os.cpu_count() or 1
    cfg.threads = cfg.threads or runner.threads_per_process(cfg.jobs)
    warn_oversubscribed(cfg.jobs, cfg.threads)
    try:
        grid = load_grid(paths[0])
        jobs = plan(grid, cfg.out)
        taken, restored = {}, []
        if cfg.from_record:
            restored = restore_runs(cfg.from_record, jobs, dry_run=cfg.dry_run)
            print(f"{'would take' if cfg.dry_run else 'took'} {len(restored)} finished run(s) from "
                  f"{cfg.from_record}{': ' + ', '.join(restored) if restored else ''}")
            taken, refused = take_results(cfg.from_record, grid, jobs)
            if taken or refused:
                labels = [job.label for job in jobs if job.key in taken]
                print(f"{'would take' if cfg.dry_run else 'took'} the numbers of {len(taken)} run(s) from its "
                      f"rows.json{': ' + ', '.join(labels) if labels else ''}" + "".join(f"\n  not {r}" for r in refused))
        if cfg.dry_run:
            print(f"grid {grid.name}: {len(grid.runs)} runs, {len(jobs)} trainings, {cfg.jobs} at a time "
                  f"({cfg.threads} thread(s) each), "
                  f"in {os.path.join(cfg.out, grid.name)}")
            for job in jobs:
                if job.key in taken:
                    print(f"{job.label}: numbers taken from {cfg.from_record}/rows.json, not trained")
                elif job.label in restored:
                    print(f"{job.label}: kept run taken from {cfg.from_record}/{KEPT_DIR}/, not trained")
                else:
                    print(describe(job, grid, cfg.out))
            return 0
        with GridLock(os.path.join(cfg.out, grid.name)) as lock:  # one runner per grid, released on any exit
            runner.child_hook = lock.record_children
            try:
                return run_grid(grid, jobs, cfg, argv, taken)
            finally:
                runner.child_hook = None
    except GridError as e:
        sys.exit(f"grid error: {e}")


if __name__ == "__main__":
    sys.exit(run_main(main, sys.argv[1:]))
