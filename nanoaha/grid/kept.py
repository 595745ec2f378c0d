"""A grid over several sessions: what a record keeps of each finished run, and how a later runner takes it back.

A record keeps, for every run that finished and was evaluated, the run folder's small files (KEPT_FILES) under
RECORD/runs/RUN__seed_S/, not its checkpoint. `compare.py GRID --from_record=RECORD` copies them into the run
folders that do not exist yet; the plan then counts such a run complete (its train_summary.json says so at the
grid's max_iters and its eval.json is the grid's evaluation) although it has no checkpoint, so a grid grown by
rows or seeds in a later session (on a machine whose out/ is gone) trains only what is new, and its record
holds every row.
"""
import os
import shutil

from nanoaha.grid.gridfile import GridError, dependencies

KEPT_FILES = ("train_summary.json", "eval.json", "launches.json", "train.log")
KEPT_DIR = "runs"


def keep_runs(record, jobs, finished):
    """Copy each finished job's KEPT_FILES into RECORD/runs/<its folder name>/. finished: the jobs' keys that
    completed and were evaluated."""
    for job in jobs:
        if job.key not in finished:
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
    if not os.path.isdir(source_root):
        raise GridError(f"--from_record={record}: no {KEPT_DIR}/ folder there; name a record written by compare.py "
                        f"since 2026-12-03 (results/<date>_<grid>)")
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
    for job in jobs:  # a run still to train from a restored run's checkpoint cannot: the record has none
        summary = os.path.join(job.out_dir, "train_summary.json")
        if dry_run or job in restored or (os.path.isfile(summary) and '"complete": true' in open(summary).read()):
            continue
        for dep in dependencies({k: v for k, v in job.overrides.items() if k == "init_from"}):
            source = next((j for j in restored if j.key == (dep, job.seed)), None)
            if source is not None:
                raise GridError(f"run {job.label} starts from {source.label}'s checkpoint, which the record does not "
                                f"keep: delete {source.out_dir} to retrain it here, or keep {job.label} in the record")
    return [job.label for job in restored]
