"""Running a plan: each job's processes (train.py, then evaluate.py, `threads` threads each), at most n_jobs at a time,
each job once the jobs it depends on are done; stopping them on request (compare.py's signal handler)."""
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from data.atomic_files import write_json
from nanoaha.grid.plan import (eval_argv, eval_json, eval_state, grid_evaluation, launches, matched_run, read_json,
                               read_summary, train_argv, train_state)


# Stopping a grid (compare.py's SIGINT/SIGTERM handler calls request_stop): no new job starts, and every running
# process gets one SIGTERM, on which train.py saves a checkpoint at its current step. Processes run in their own
# session, so a Ctrl-C reaches only the runner, which then signals each of them once.
stop_requested = threading.Event()
_running, _running_lock = set(), threading.Lock()
INTERRUPTED_CODES = (128 + signal.SIGINT, 128 + signal.SIGTERM)  # train.py saved a checkpoint and stopped
# A process stopped by the runner's own signal: the codes above, or killed by it (-15, -2) while it was starting
# or exiting, before or after its handler: "interrupted", not "failed", when the runner asked for the stop.
STOPPED_CODES = INTERRUPTED_CODES + (-signal.SIGINT, -signal.SIGTERM)


def threads_per_process(n_jobs, cores=None):
    """The cores shared among the jobs running at once: OMP_NUM_THREADS of every process they start."""
    return max(1, (cores or os.cpu_count() or 1) // n_jobs)


child_hook = None  # called with the pids of the running processes whenever they change (compare.py's GridLock)


def _children_changed():
    if child_hook is not None:
        child_hook(sorted(proc.pid for proc in _running))


def request_stop():
    stop_requested.set()
    with _running_lock:
        for proc in _running:
            proc.send_signal(signal.SIGTERM)


def launch(job, step, argv, log_name, threads=1):
    """Run one process for a job (`threads` threads), output appended to OUT_DIR/<log_name>;
    record it in OUT_DIR/launches.json. Returns its exit code."""
    os.makedirs(job.out_dir, exist_ok=True)
    started = time.time()
    with open(os.path.join(job.out_dir, log_name), "a") as log:
        with _running_lock:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "OMP_NUM_THREADS": str(threads)},
                                    start_new_session=True)
            _running.add(proc)
            _children_changed()
            if stop_requested.is_set():
                proc.send_signal(signal.SIGTERM)
        code = proc.wait()
        with _running_lock:
            _running.discard(proc)
            _children_changed()
    record = launches(job.out_dir) + [{"step": step, "argv": argv, "cwd": os.getcwd(), "started": time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(started)), "wall_s": round(time.time() - started, 2), "returncode": code}]
    write_json(os.path.join(job.out_dir, "launches.json"), record)
    return code


def log_line(line):
    """One progress line, written whole: jobs log from several threads, and print() writes the text and the
    newline apart, so two lines could run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def execute(job, grid, out_root, log=log_line, threads=1):
    """Train (or resume, or skip) and evaluate one job. Returns 'ok' or what went wrong."""
    state = train_state(job, grid, out_root)
    if state != "skip":
        argv = train_argv(job, grid, out_root, resume=state == "resume")
        if argv is None:
            return f"failed: no evaluation of {matched_run(job)} seed {job.seed} to match"
        log(f"[{time.strftime('%H:%M:%S')}] {job.label}: {'resuming' if state == 'resume' else 'training'}")
        code = launch(job, "train", argv, "train.log", threads)
        summary = read_summary(job.out_dir) or {}
        if code in INTERRUPTED_CODES:
            return f"interrupted at step {summary.get('iter_num', '?')} (checkpoint saved): run again to resume"
        if stop_requested.is_set() and code in STOPPED_CODES:
            return f"interrupted while train.py started or exited (code {code}; last checkpoint at step " \
                   f"{summary.get('iter_num', 'none')}): run again to resume"
        if code != 0 or not summary.get("complete"):
            return f"failed: train.py exited with {code}, see {os.path.join(job.out_dir, 'train.log')}"
    if eval_state(job, grid) != "skip":
        if stop_requested.is_set():
            return "interrupted before its evaluation: run again to evaluate"
        log(f"[{time.strftime('%H:%M:%S')}] {job.label}: evaluating")
        code = launch(job, "evaluate", eval_argv(job, grid) + ["--overwrite"], "eval.log", threads)
        if stop_requested.is_set() and code in STOPPED_CODES:
            return "interrupted during its evaluation: run again to evaluate"
        if code != 0 or read_json(eval_json(job.out_dir)) is None:
            return f"failed: evaluate.py exited with {code}, see {os.path.join(job.out_dir, 'eval.log')}"
        if grid_evaluation(job) is None:
            return f"failed: {eval_json(job.out_dir)} does not record the grid's evaluation settings " \
                   f"(another evaluate.py wrote over it?): run again to re-evaluate"
    log(f"[{time.strftime('%H:%M:%S')}] {job.label}: done")
    return "ok"


def run_jobs(jobs, grid, out_root, n_jobs=1, log=log_line, threads=1, done=None):
    """Every job, at most n_jobs at a time (each process with `threads` threads), each once its dependencies are
    done. done: {(run, seed): status} of jobs not to run (taken from a record). Returns {(run, seed): status}:
    'ok', 'failed: ...' or 'blocked: ...' (a dependency failed)."""
    status, pending, running = dict(done or {}), list(jobs), {}
    with ThreadPoolExecutor(max_workers=n_jobs) as pool:
        while pending or running:
            for job in list(pending):
                failed = [d for d in job.deps if d in status and status[d] != "ok"]
                if failed:
                    status[job.key] = f"blocked: {failed[0][0]} seed {failed[0][1]} did not finish"
                    pending.remove(job)
                elif stop_requested.is_set():
                    status[job.key] = "interrupted before it started"
                    pending.remove(job)
                elif len(running) < n_jobs and all(status.get(d) == "ok" for d in job.deps):
                    running[pool.submit(execute, job, grid, out_root, log, threads)] = job
                    pending.remove(job)
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                job = running.pop(future)
                try:
                    status[job.key] = future.result()
                except Exception as e:  # a job's bookkeeping failed: the others go on
                    status[job.key] = f"failed: {type(e).__name__}: {e}"
                if status[job.key] != "ok":
                    log(f"{job.label}: {status[job.key]}")
    return status
