"""A grid over several sessions: what a record keeps of each finished run, and how a later runner takes it back.

A record keeps, for every run that finished and was evaluated, the run folder's small files (KEPT_FILES) under
RECORD/runs/RUN__seed_S/, not its checkpoint. `compare.py GRID --from_record=RECORD` copies them into the run
folders that do not exist yet; the plan then counts such a run complete (its train_summary.json says so at the
grid's max_iters and its eval.json is the grid's evaluation) although it has no checkpoint, so a grid grown by
rows or seeds in a later session (on a machine whose out/ is gone) trains only what is new, and its record
holds every row.

A record whose runs/ lost a run (those written before 2026-12-04 lost all on a fresh clone: .gitignore matched
them) still has that run's numbers in rows.json, the ones its table was drawn from: take_results takes them for
the run folders that do not exist when the record's copy of the grid file trained that run at that seed with the
same settings and evaluated it the same way, so the new record's table and rows.json hold them again.
"""
import os
import shutil

from nanoaha.grid.gridfile import GridError, dependencies, load_grid
from nanoaha.grid.plan import read_summary, resolved_key_window
from nanoaha.grid.tables import load_rows

KEPT_FILES = ("train_summary.json", "eval.json", "launches.json", "train.log")
KEPT_DIR = "runs"


def keep_runs(record, jobs, finished):
    """Copy each finished job's KEPT_FILES into RECORD/runs/<its folder name>/. finished: the jobs' keys that
    completed and were evaluated."""
    for job in jobs:
        if job.key not in finished or not os.path.isdir(job.out_dir):  # numbers taken from a record: no files
            continue
        target = os.path.join(record, KEPT_DIR, os.path.basename(job.out_dir))
        os.makedirs(target, exist_ok=True)
        for name in KEPT_FILES:
            if os.path.isfile(os.path.join(job.out_dir, name)):
                shutil.copyfile(os.path.join(job.out_dir, name), os.path.join(target, name))


def restore_runs(record, jobs, dry_run=False):
    """Copy the runs RECORD kept into the jobs' run folders that do not exist yet; returns the labels of the jobs
    restored (dry_run: that would be, copying nothing). A run folder that exists is left as it is (its own files
    are newer than any record's)."""
    source_root = os.path.join(record, KEPT_DIR)
    if not os.path.isdir(source_root) and not os.path.isfile(os.path.join(record, "rows.json")):
        raise GridError(f"--from_record={record}: neither {KEPT_DIR}/ nor rows.json there; name a record written by "
                        f"compare.py (results/<date>_<grid>)")
    restored = []
    for job in jobs:
        source = os.path.join(source_root, os.path.basename(job.out_dir))
        if not os.path.isdir(source) or os.path.exists(job.out_dir):
            continue
        restored.append(job)
        if dry_run:
            continue
        os.makedirs(job.out_dir)
        for name in KEPT_FILES:
            if os.path.isfile(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(job.out_dir, name))
    if not dry_run:
        refuse_checkpoint_needs(jobs, restored, "does not keep")
    return [job.label for job in restored]


def refuse_checkpoint_needs(jobs, sources, what, needs=("init_from",)):
    """A run still to train from the checkpoint of a run taken from a record cannot: the record has none (nor,
    where its numbers alone were taken, the evaluation a "matched:" run takes its rates from)."""
    for job in jobs:
        if job in sources or (read_summary(job.out_dir) or {}).get("complete"):
            continue
        for dep in dependencies({k: v for k, v in job.overrides.items() if k in needs}):
            source = next((j for j in sources if j.key == (dep, job.seed)), None)
            if source is not None:
                raise GridError(f"run {job.label} starts from {source.label}'s checkpoint or evaluation, which the record {what}: "
                                f"delete {source.out_dir} to retrain it here, or keep {job.label} in the record")


def run_settings(grid, run, window):
    """What a run's numbers depend on in a grid file: base configs, the run's settings over common's, the
    evaluation (key_window resolved: 0 labels beyond the run's own window)."""
    evaluate = resolved_key_window({"key_window": 0, **grid.evaluate}, window)
    return {"base": list(grid.base), "settings": {**grid.common, **grid.runs[run]}, "evaluate": evaluate}


def take_results(record, grid, jobs):
    """({job key: result} taken from RECORD's rows.json, [why a job's numbers there were not taken]) for the jobs
    whose run folder does not exist and that RECORD does not keep under runs/ (restore_runs copies those): a
    complete result of the same run and seed, trained and evaluated with the same settings by the record's copy
    of the grid file. A taken job trains nothing; it cannot resume, be evaluated again, or be the checkpoint
    another run starts from."""
    path = os.path.join(record, "rows.json")
    if not os.path.isfile(path):
        return {}, []
    name, _, rows, _ = load_rows(record)
    if name != grid.name:
        raise GridError(f"--from_record={record} is a record of grid {name}, not {grid.name}: name one of "
                        f"{grid.name}'s records")
    grid_copy = os.path.join(record, os.path.basename(grid.path))
    if not os.path.isfile(grid_copy):
        raise GridError(f"--from_record={record}: its copy of the grid file ({os.path.basename(grid.path)}) is "
                        f"missing, so its numbers cannot be matched to this grid's settings")
    recorded_grid = load_grid(grid_copy)
    results = {(row.run, result["seed"]): result for row in rows for result in row.results if result["complete"]}
    taken, refused = {}, []
    for job in jobs:
        if os.path.exists(job.out_dir) or os.path.isdir(os.path.join(record, KEPT_DIR, os.path.basename(job.out_dir))):
            continue
        if job.key not in results:
            continue
        if job.run not in recorded_grid.runs or job.seed not in recorded_grid.run_seeds[job.run] or \
                run_settings(recorded_grid, job.run, job.mcfg.window) != \
                run_settings(grid, job.run, job.mcfg.window):
            refused.append(f"{job.label}: the record trained or evaluated it with other settings; it trains here")
            continue
        taken[job.key] = {**results[job.key], "status": "ok", "taken_from": results[job.key].get("taken_from") or record}
    refuse_checkpoint_needs(jobs, [job for job in jobs if job.key in taken], "has only as numbers",
                            needs=("init_from", "random_global_q"))
    return taken, refused
