"""Grids of training runs: the grid file, the plan (commands in dependency order, skip or resume), running it
with a job limit, and the results table (mean and range over seeds, ties, gap recovery). compare.py runs it.

A grid file (configs/grids/NAME.py) is plain Python; its docstring says what question the grid answers:

    base = ["configs/quickstart.py"]            # config files every run starts from, in order
    common = {"n_layer": 6, "max_iters": 600}   # overrides for every run
    seeds = [1, 2]
    runs = {                                    # name -> overrides; one training per run and seed
        "dense": {"schedule": "G"},
        "routed": {"schedule": "R"},
        "random": {"schedule": "R", "routing": "random", "random_global_q": "matched:routed"},
        "dense_half": {"schedule": "G", "max_iters": 300},
        "finetuned": {"schedule": "R", "max_iters": 300, "init_from": "run:dense_half"},
    }
    references = {"local": "local", "dense": "dense"}   # optional: the rows of gap recovery (default: so named)
    evaluate = {"eval_tokens": 65536}                   # optional: evaluate.py options for every run
    comparisons = {"learned vs random routing": ("routed", "random")}  # optional: question -> (run, other run)

"run:NAME" (init_from) is the checkpoint of run NAME with the same seed; "matched:NAME" (random_global_q) the
per-layer global fractions of NAME's evaluation, same seed. Either makes NAME run first. A run's "seeds" key
replaces the grid's seeds for that run. Run NAME at seed S trains in OUT/GRID/NAME__seed_S. Each of
"comparisons" becomes a line of the record's comparisons table: the first run's val loss minus the other's at
the same seed (the pairs the grid's conclusions rest on).
"""
import ast
import dataclasses
import difflib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from nanoaha.atomic_files import write_json
from nanoaha.configurator import ConfigError, parse_args, read_config_file
from model import GPTConfig
from nanoaha.train_config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
TRAIN_PY, EVALUATE_PY = os.path.join(ROOT, "train.py"), os.path.join(ROOT, "evaluate.py")
GRID_KEYS = {"base", "common", "seeds", "runs", "references", "evaluate", "comparisons"}
RUNNER_KEYS = {"out_dir", "seed"}  # the runner sets these for each run
SPECIAL = {"run:": "init_from", "matched:": "random_global_q"}  # prefix -> the one key it may be given to
KEEP_TRAINING_KEYS = {"max_iters"}  # may change between launches of a run: resuming continues to the new value
MATCHED_RATE_TOLERANCE = 0.005  # a matched run is stale once a layer's source rate moved more than this


class GridError(ValueError):
    pass


@dataclasses.dataclass
class Grid:
    name: str
    path: str
    doc: str
    base: list
    common: dict
    seeds: list
    runs: dict            # name -> overrides (with "run:" / "matched:" values unresolved)
    run_seeds: dict       # name -> seeds of that run
    references: dict      # {"local": run name, "dense": run name}, either may be missing
    evaluate: dict        # evaluate.py options
    comparisons: dict = dataclasses.field(default_factory=dict)  # question -> (run, other run)


@dataclasses.dataclass
class Job:
    """One training of one run at one seed, and its evaluation."""
    run: str
    seed: int
    out_dir: str
    overrides: dict       # common + the run's, special values unresolved
    deps: list            # (run, seed) of the jobs that must finish first
    tcfg: object          # the configs as train.py will see them (special values as placeholders)
    mcfg: GPTConfig

    @property
    def key(self):
        return (self.run, self.seed)

    @property
    def label(self):
        return f"{self.run} seed {self.seed}"

    @property
    def kind(self):
        """'fixed' (no routed layer), 'random' or 'routed' (learned routers): how the table and plots show it."""
        if "R" not in self.mcfg.layer_letters:
            return "fixed"
        return "random" if self.mcfg.routing == "random" else "routed"


# ---------------------------------------------------------------------------------------------- grid files

def train_schemas():
    """The schemas train.py parses its arguments with."""
    return TrainConfig, GPTConfig


def grid_doc(source):
    """The grid file's docstring, else its leading comment lines."""
    try:
        doc = ast.get_docstring(ast.parse(source))
    except SyntaxError:
        doc = None
    if doc:
        return doc.strip()
    lines = []
    for line in source.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return "\n".join(lines).strip()


def load_grid(path):
    """Read and check a grid file; every problem is a GridError with a one-line message."""
    if not os.path.isfile(path):
        raise GridError(f"grid file {path!r} does not exist; grids live in configs/grids/NAME.py")
    with open(path) as f:
        source = f.read()
    namespace = {}
    try:
        exec(compile(source, path, "exec"), namespace)
    except Exception as e:
        raise GridError(f"grid file {path} does not run: {type(e).__name__}: {e}") from None
    values = {k: v for k, v in namespace.items() if not k.startswith("_") and k in GRID_KEYS}
    unknown = sorted(k for k, v in namespace.items() if not k.startswith("_") and k not in GRID_KEYS
                     and not callable(v) and type(v).__name__ != "module")
    if unknown:
        raise GridError(f"{path}: unknown grid setting(s) {', '.join(unknown)}; a grid file sets "
                        f"{', '.join(sorted(GRID_KEYS))} (names starting with _ are private)")
    base, common, seeds, runs = (values.get(k) for k in ("base", "common", "seeds", "runs"))
    common = {} if common is None else common
    if isinstance(base, str):
        base = [base]
    if not isinstance(base, list) or not all(isinstance(b, str) and b.endswith(".py") for b in base):
        raise GridError(f"{path}: base must be a list of config files (e.g. base = ['configs/quickstart.py'])")
    if not isinstance(common, dict):
        raise GridError(f"{path}: common must be a dict of overrides, got {type(common).__name__}")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise GridError(f"{path}: seeds must be a non-empty list of ints (e.g. seeds = [1, 2])")
    if not isinstance(runs, dict) or not runs or not all(isinstance(v, dict) for v in runs.values()):
        raise GridError(f"{path}: runs must be a non-empty dict of run name -> dict of overrides")
    run_seeds = {}
    for name, overrides in runs.items():
        if not isinstance(name, str) or not name or "__seed_" in name or not name.replace("_", "").replace(
                "-", "").isalnum():
            raise GridError(f"{path}: run name {name!r}: use letters, digits, _ and - (and not '__seed_')")
        own = overrides.get("seeds", seeds)
        if not isinstance(own, list) or not own or not all(isinstance(s, int) for s in own):
            raise GridError(f"{path}: run {name}: seeds must be a non-empty list of ints")
        run_seeds[name] = own
    runs = {name: {k: v for k, v in o.items() if k != "seeds"} for name, o in runs.items()}
    for name, overrides in [("common", common), *runs.items()]:
        for key, value in overrides.items():
            check_override(path, name, key, value, runs)
    references = values.get("references") or {}
    if not isinstance(references, dict) or set(references) - {"local", "dense"}:
        raise GridError(f"{path}: references must be a dict with keys 'local' and/or 'dense' naming runs")
    for role in ("local", "dense"):
        if role in references and references[role] not in runs:
            raise GridError(f"{path}: references[{role!r}] = {references[role]!r} is not a run; runs: "
                            f"{', '.join(runs)}")
        if role not in references and role in runs:
            references[role] = role
    evaluate = values.get("evaluate") or {}
    if not isinstance(evaluate, dict):
        raise GridError(f"{path}: evaluate must be a dict of evaluate.py options (e.g. {{'eval_tokens': 65536}})")
    comparisons = values.get("comparisons") or {}
    pairs_ok = isinstance(comparisons, dict) and all(
        isinstance(q, str) and isinstance(pair, (tuple, list)) and len(pair) == 2 for q, pair in comparisons.items())
    if not pairs_ok:
        raise GridError(f"{path}: comparisons must be a dict of question -> (run, other run), e.g. "
                        f"{{'learned vs random routing': ('routed', 'random')}}")
    for question, pair in comparisons.items():
        missing = [name for name in pair if name not in runs]
        if missing or pair[0] == pair[1]:
            raise GridError(f"{path}: comparisons[{question!r}] = {tuple(pair)!r}: "
                            + (f"{', '.join(map(repr, missing))} is not a run" if missing else "name two runs"))
    grid = Grid(os.path.splitext(os.path.basename(path))[0], path, grid_doc(source), base, common, seeds, runs,
                run_seeds, references, evaluate, {q: tuple(pair) for q, pair in comparisons.items()})
    run_order(grid)  # reports cycles
    return grid


def check_override(path, run, key, value, runs):
    if key in RUNNER_KEYS:
        raise GridError(f"{path}: {run} sets {key}, which the runner sets for every run (--out, seeds); remove it")
    if isinstance(value, str):
        for prefix, allowed in SPECIAL.items():
            if value.startswith(prefix):
                if key != allowed:
                    raise GridError(f"{path}: {run}: {key}={value!r}: '{prefix}NAME' is a value of {allowed} only")
                target = value[len(prefix):]
                if target not in runs:
                    close = difflib.get_close_matches(target, runs, n=1)
                    hint = f"; did you mean {close[0]}?" if close else f"; runs: {', '.join(runs)}"
                    raise GridError(f"{path}: {run}: {key}={value!r} names no run of the grid{hint}")
                if run == "common":
                    raise GridError(f"{path}: common sets {key}={value!r}: give it to the runs that need it")


def dependencies(overrides):
    """Runs named by "run:" and "matched:" values."""
    found = []
    for value in overrides.values():
        for prefix in SPECIAL:
            if isinstance(value, str) and value.startswith(prefix):
                found.append(value[len(prefix):])
    return found


def run_order(grid):
    """Run names, each after the runs it depends on, otherwise in the grid file's order."""
    order, state = [], {}  # state: 'visiting' | 'done'

    def visit(name, path):
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            cycle = path[path.index(name):] + [name]
            raise GridError(f"{grid.path}: runs {' -> '.join(cycle)} form a cycle (run:/matched: values)")
        state[name] = "visiting"
        for dep in dependencies(grid.runs[name]):
            visit(dep, path + [name])
        state[name] = "done"
        order.append(name)

    for name in grid.runs:
        visit(name, [])
    return order


# ---------------------------------------------------------------------------------------------- the plan

def format_value(value):
    """A --key=VALUE text that configurator parses back to value: strings bare where that is unambiguous."""
    if isinstance(value, str):
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return repr(value)


def base_files(grid):
    """The base config files as paths from the current directory (a grid names them from the repo root)."""
    paths = []
    for b in grid.base:
        path = b if os.path.isabs(b) else os.path.join(ROOT, b)
        if not os.path.isfile(path):
            raise GridError(f"{grid.path}: base config {b!r} does not exist")
        paths.append(os.path.relpath(path))
    return paths


def run_dir(out_root, grid, run, seed):
    return os.path.join(out_root, grid.name, f"{run}__seed_{seed}")


def placeholder(value, out_root, grid, seed):
    """What a special value stands for while planning: a checkpoint path for "run:", a rate for "matched:"."""
    if isinstance(value, str) and value.startswith("run:"):
        return os.path.join(run_dir(out_root, grid, value[4:], seed), "ckpt.pt")
    if isinstance(value, str) and value.startswith("matched:"):
        return 0.0
    return value


def plan(grid, out_root):
    """Jobs in an order where every job comes after the jobs it depends on. Checks every run's config with
    train.py's schemas (unknown keys, wrong types, bad values) and that dependencies have the seed they need."""
    schemas, files = train_schemas(), base_files(grid)
    for i, f in enumerate(files):
        try:
            read_config_file(f, files[:i])
        except ConfigError as e:
            raise GridError(f"{grid.path}: {e}") from None
    jobs = []
    for run in run_order(grid):
        overrides = {**grid.common, **grid.runs[run]}
        for seed in grid.run_seeds[run]:
            deps = []
            for dep in dependencies(overrides):
                if seed not in grid.run_seeds[dep]:
                    raise GridError(f"{grid.path}: run {run} at seed {seed} needs {dep} at seed {seed}, which the "
                                    f"grid does not train; give {dep} that seed")
                deps.append((dep, seed))
            resolved = {k: placeholder(v, out_root, grid, seed) for k, v in overrides.items()}
            argv = files + [f"--{k}={format_value(v)}" for k, v in resolved.items()]
            try:
                tcfg, mcfg = parse_args(argv, *schemas)
            except ConfigError as e:
                raise GridError(f"{grid.path}: run {run}: {e}") from None
            jobs.append(Job(run, seed, run_dir(out_root, grid, run, seed), overrides, deps, tcfg, mcfg))
    for job in jobs:
        dep = matched_run(job)
        target = next((j for j in jobs if j.run == dep), None)
        if target and ("R" not in target.mcfg.layer_letters or target.mcfg.n_layer != job.mcfg.n_layer):
            raise GridError(f"{grid.path}: run {job.run}: matched:{dep} needs {dep} to have routed layers and "
                            f"as many layers ({job.mcfg.n_layer})")
    return jobs


def matched_run(job):
    """NAME of a job's "matched:NAME" value, else None."""
    value = job.overrides.get("random_global_q")
    return value[len("matched:"):] if isinstance(value, str) and value.startswith("matched:") else None


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def matched_rates(job, out_root, grid):
    """random_global_q for a "matched:NAME" run: NAME's per-layer global fractions (same seed), 0 for layers
    that are not routed (a random rate is used by routed layers only). None until NAME's evaluation exists."""
    if matched_run(job) is None:
        return None
    result = read_json(eval_json(run_dir(out_root, grid, matched_run(job), job.seed)))
    if result is None:
        return None
    return [0.0 if q is None else round(q, 6) for q in result["global_frac_per_layer"]]


def train_argv(job, grid, out_root, resume=False, unresolved=None):
    """The train.py command of a job. While a "matched:" value cannot be resolved yet: None, or with the text
    `unresolved` in its place (to show the plan)."""
    values = {}
    for key, value in job.overrides.items():
        if key == "random_global_q" and matched_run(job):
            value = matched_rates(job, out_root, grid)
            if value is None and unresolved is None:
                return None
            value = unresolved if value is None else value
        values[key] = placeholder(value, out_root, grid, job.seed)
    if resume:
        values["init_from"] = "resume"
    args = [f"--{k}={format_value(v)}" for k, v in values.items()]
    return [sys.executable, os.path.relpath(TRAIN_PY), *base_files(grid), *args, f"--seed={job.seed}",
            f"--out_dir={job.out_dir}"]


def eval_json(out_dir):
    return os.path.join(out_dir, "eval.json")


def eval_argv(job, grid):
    return [sys.executable, os.path.relpath(EVALUATE_PY), job.out_dir,
            *[f"--{k}={format_value(v)}" for k, v in grid.evaluate.items()]]


def launches(out_dir):
    """The processes the runner started for this run folder: [{'step', 'argv', 'wall_s', 'returncode'}, ...]."""
    return read_json(os.path.join(out_dir, "launches.json")) or []


def comparable(argv, cwd, ignore=()):
    """A train command as a set of settings that must not change between launches of one run: paths made
    absolute (the runner may be started from another directory), without resume, max_iters and `ignore`."""
    settings = set()
    for arg in argv[2:]:
        key, _, value = arg.partition("=")
        if key.lstrip("-") in KEEP_TRAINING_KEYS or key.lstrip("-") in ignore:
            continue
        if arg.endswith(".py") and not arg.startswith("--"):
            arg = os.path.normpath(os.path.join(cwd, arg))
        elif key in ("--init_from", "--out_dir", "--data_dir"):
            arg = f"{key}={os.path.normpath(os.path.join(cwd, value))}"
        settings.add(arg)
    return settings


def train_state(job, grid, out_root):
    """What the run needs: 'skip' (complete), 'resume' (a checkpoint short of max_iters), 'train' (nothing yet).
    Refuses a run folder trained with another command (delete it to retrain)."""
    summary = read_json(os.path.join(job.out_dir, "train_summary.json"))
    has_ckpt = os.path.isfile(os.path.join(job.out_dir, "ckpt.pt"))
    planned = train_argv(job, grid, out_root)
    first = next((launch for launch in launches(job.out_dir) if launch["step"] == "train"), None)
    known = has_ckpt and first is not None and "--init_from=resume" not in first["argv"] and planned is not None
    ignore = ["random_global_q"] if matched_run(job) else []  # a re-evaluation may move matched rates a little
    differ = sorted(comparable(planned, os.getcwd(), ignore) ^ comparable(first["argv"], first["cwd"], ignore)) \
        if known else []
    if differ:
        raise GridError(f"{job.out_dir} was trained with another command (differs in {' '.join(differ)[:200]}): "
                        f"delete that folder to retrain it, or restore the grid")
    if known and matched_run(job):
        check_matched_rates(job, first["argv"], planned)
    if has_ckpt and summary and summary.get("complete") and summary.get("max_iters") == job.tcfg.max_iters:
        return "skip"
    return "resume" if has_ckpt else "train"


def check_matched_rates(job, trained_argv, planned_argv):
    """Refuses a "matched:NAME" run whose rates no longer match NAME's evaluation (NAME was retrained or
    re-evaluated since): it would be compared at a cost NAME no longer has."""
    def rates(argv):
        value = next((a.partition("=")[2] for a in argv if a.startswith("--random_global_q=")), None)
        return None if value is None else ast.literal_eval(value)
    trained, now = rates(trained_argv), rates(planned_argv)
    if trained is not None and now is not None and (
            len(trained) != len(now) or max(abs(a - b) for a, b in zip(trained, now)) > MATCHED_RATE_TOLERANCE):
        raise GridError(f"{job.out_dir} trained at per-layer rates {trained}, but {matched_run(job)} seed "
                        f"{job.seed}'s evaluation now gives {now}: delete that folder to retrain it at the new rates")


def eval_state(job, grid):
    """'skip' when eval.json is newer than the checkpoint and came from the same evaluate command."""
    path, ckpt = eval_json(job.out_dir), os.path.join(job.out_dir, "ckpt.pt")
    evaluated = [launch["argv"] for launch in launches(job.out_dir) if launch["step"] == "evaluate"]
    fresh = os.path.isfile(path) and os.path.isfile(ckpt) and os.path.getmtime(path) >= os.path.getmtime(ckpt)
    return "skip" if fresh and evaluated and evaluated[-1][1:] == eval_argv(job, grid)[1:] else "evaluate"


def describe(job, grid, out_root):
    """The dry run's line for a job: what happens to it and the command."""
    state = train_state(job, grid, out_root)
    after = f" (after {', '.join(f'{r} seed {s}' for r, s in job.deps)})" if job.deps else ""
    argv = train_argv(job, grid, out_root, resume=state == "resume",
                      unresolved=f"<per-layer global fractions of {matched_run(job)} seed {job.seed}, once evaluated>")
    if state == "skip":
        what = "complete, skipped" + ("" if eval_state(job, grid) == "skip" else "; will be evaluated")
    elif state == "resume":
        summary = read_json(os.path.join(job.out_dir, "train_summary.json")) or {}
        what = f"will resume from step {summary.get('iter_num', '?')} of {job.tcfg.max_iters}"
    else:
        what = "will train"
    return f"{job.label}{after}: {what}\n    {shlex.join(['python', *argv[1:]])}"


# ---------------------------------------------------------------------------------------------- running

# Stopping a grid (compare.py's SIGINT/SIGTERM handler calls request_stop): no new job starts, and every running
# process gets one SIGTERM, on which train.py saves a checkpoint at its current step. Processes run in their own
# session, so a Ctrl-C reaches only the runner, which then signals each of them once.
stop_requested = threading.Event()
_running, _running_lock = set(), threading.Lock()
INTERRUPTED_CODES = (128 + signal.SIGINT, 128 + signal.SIGTERM)


def request_stop():
    stop_requested.set()
    with _running_lock:
        for proc in _running:
            proc.send_signal(signal.SIGTERM)


def launch(job, step, argv, log_name):
    """Run one process for a job (one thread: OMP_NUM_THREADS=1), output appended to OUT_DIR/<log_name>;
    record it in OUT_DIR/launches.json. Returns its exit code."""
    os.makedirs(job.out_dir, exist_ok=True)
    started = time.time()
    with open(os.path.join(job.out_dir, log_name), "a") as log:
        with _running_lock:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
            _running.add(proc)
            if stop_requested.is_set():
                proc.send_signal(signal.SIGTERM)
        code = proc.wait()
        with _running_lock:
            _running.discard(proc)
    record = launches(job.out_dir) + [{"step": step, "argv": argv, "cwd": os.getcwd(), "started": time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(started)), "wall_s": round(time.time() - started, 2), "returncode": code}]
    write_json(os.path.join(job.out_dir, "launches.json"), record)
    return code


def log_line(line):
    """One progress line, written whole: jobs log from several threads, and print() writes the text and the
    newline apart, so two lines could run together."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def execute(job, grid, out_root, log=log_line):
    """Train (or resume, or skip) and evaluate one job. Returns 'ok' or what went wrong."""
    state = train_state(job, grid, out_root)
    if state != "skip":
        argv = train_argv(job, grid, out_root, resume=state == "resume")
        if argv is None:
            return f"failed: no evaluation of {matched_run(job)} seed {job.seed} to match"
        log(f"[{time.strftime('%H:%M:%S')}] {job.label}: {'resuming' if state == 'resume' else 'training'}")
        code = launch(job, "train", argv, "train.log")
        summary = read_json(os.path.join(job.out_dir, "train_summary.json")) or {}
        if code in INTERRUPTED_CODES:
            return f"interrupted at step {summary.get('iter_num', '?')} (checkpoint saved): run again to resume"
        if code != 0 or not summary.get("complete"):
            return f"failed: train.py exited with {code}, see {os.path.join(job.out_dir, 'train.log')}"
    if eval_state(job, grid) != "skip":
        if stop_requested.is_set():
            return "interrupted before its evaluation: run again to evaluate"
        log(f"[{time.strftime('%H:%M:%S')}] {job.label}: evaluating")
        code = launch(job, "evaluate", eval_argv(job, grid), "eval.log")
        if code != 0 or read_json(eval_json(job.out_dir)) is None:
            return f"failed: evaluate.py exited with {code}, see {os.path.join(job.out_dir, 'eval.log')}"
    log(f"[{time.strftime('%H:%M:%S')}] {job.label}: done")
    return "ok"


def run_jobs(jobs, grid, out_root, n_jobs=1, log=log_line):
    """Every job, at most n_jobs at a time, each once its dependencies are done. Returns {(run, seed): status}:
    'ok', 'failed: ...' or 'blocked: ...' (a dependency failed)."""
    status, pending, running = {}, list(jobs), {}
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
                    running[pool.submit(execute, job, grid, out_root, log)] = job
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


# ---------------------------------------------------------------------------------------------- results

def collect(job, status=None):
    """One job's numbers: from its evaluation (eval.json), its train_summary.json and its launches. A
    number that does not exist is None."""
    result = read_json(eval_json(job.out_dir)) or {}
    summary = read_json(os.path.join(job.out_dir, "train_summary.json")) or {}
    complete = bool(summary.get("complete")) and summary.get("max_iters") == job.tcfg.max_iters and bool(result)
    train_wall = [launch["wall_s"] for launch in launches(job.out_dir) if launch["step"] == "train"]
    return {
        "run": job.run, "seed": job.seed, "complete": complete, "status": status or ("ok" if complete else "missing"),
        "val_loss": result.get("val_loss"), "global_frac": result.get("global_frac"),
        "flops_ideal": result.get("attention_flop_frac_ideal"),
        "flops_computed": result.get("attention_flop_frac_computed"),
        "kv_bytes": result.get("kv_cache_bytes"), "kv_bytes_dense": result.get("kv_cache_bytes_dense"),
        "per_layer": result.get("global_frac_per_layer"), "per_head": result.get("global_frac_per_head"),
        "sweep": result.get("threshold_sweep") or [],
        "tokens_per_s": summary.get("tokens_per_s"),
        "wall_s": sum(train_wall) if train_wall else summary.get("wall_s"),
        "val_history": summary.get("val_history") or [],
    }


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

    def losses(self):
        """{seed: val loss} of the seeds that completed."""
        return {r["seed"]: r["val_loss"] for r in self.results if r["complete"] and r["val_loss"] is not None}

    @property
    def complete(self):
        return all(r["complete"] for r in self.results)


def rows_of(jobs, status=None):
    rows = {}
    for job in jobs:
        row = rows.setdefault(job.run, Row(job.run, job.kind, job.mcfg.layer_letters, [], []))
        row.seeds.append(job.seed)
        row.results.append(collect(job, (status or {}).get(job.key)))
    return list(rows.values())


def best_fixed(rows, references=None):
    """The fixed-schedule row (no routed layer) with the lowest val loss, compared at equal seeds: by the mean
    same-seed difference to the local reference where it has results (a row with a third seed would otherwise
    be ranked on another set of seeds), else by the mean. None if no fixed row has a loss."""
    fixed = [row for row in rows if row.kind == "fixed" and row.stat("val_loss")]
    anchor = {row.run: row for row in rows}.get((references or {}).get("local"))
    versus_anchor = {row.run: spread(paired_differences(row, anchor)) for row in fixed} if anchor else {}
    if versus_anchor and all(versus_anchor.values()):
        return min(fixed, key=lambda row: versus_anchor[row.run][0])
    return min(fixed, key=lambda row: row.stat("val_loss")[0]) if fixed else None


def fmt_loss(s):
    return "missing" if s is None else f"{s[0]:.3f}" + (f" [{s[1]:.3f}-{s[2]:.3f}]" if s[2] > s[1] else "")


def fmt_pct(s, digits=0):
    return "missing" if s is None else f"{100 * s[0]:.{digits}f}%"


def fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


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
        return f"{100 * gap_recovery(means[0], means[1], means[2]):.0f}%"
    if row.run in (local_row.run, dense_row.run):
        return "reference"
    diffs = [paired_differences(row, ref) for ref in (local_row, dense_row)]
    if not all(diffs):
        return "no common seed"
    verdicts = [paired_verdict(d, min_seeds=1) for d in diffs]
    text = "beats both" if verdicts == ["better", "better"] else \
        "does not beat both" if verdicts[0] == "worse" else "ties the better reference"
    return text + (" (1 seed)" if min(map(len, diffs)) < 2 else "")


def versus_best_fixed(row, best):
    """The same-seed difference to the best fixed schedule (paired_text)."""
    if best is None:
        return "no fixed schedule"
    if row.run == best.run:
        return "best fixed"
    return paired_text(row, best)


def paired_by_seed(row, ref):
    """{seed: val loss minus ref's at that seed} (same backbone init, same data order), for each seed both
    completed. At equal init a seed's difference varies far less than either row's loss does over seeds."""
    ref_loss = ref.losses()
    return {seed: loss - ref_loss[seed] for seed, loss in row.losses().items() if seed in ref_loss}


def paired_differences(row, ref):
    """paired_by_seed's differences, in seed order of row's results."""
    return list(paired_by_seed(row, ref).values())


SMALLEST_DIFFERENCE = 0.0005  # a same-seed difference that prints as 0.000 is no difference


def paired_verdict(diffs, min_seeds=2):
    """'better' ('worse') where min_seeds or more same-seed differences all have that sign (each at least
    SMALLEST_DIFFERENCE), else 'tie'; None with fewer than min_seeds."""
    if len(diffs) < min_seeds:
        return None
    return "better" if max(diffs) <= -SMALLEST_DIFFERENCE else "worse" if min(diffs) >= SMALLEST_DIFFERENCE \
        else "tie"


def paired_text(row, ref):
    """The same-seed cell: mean [min, max] of the differences, and 'better (worse) on every seed' where two or
    more all have one sign, else 'tie'."""
    if ref is None:
        return "no reference"
    if row.run == ref.run:
        return "reference"
    diffs = paired_differences(row, ref)
    if not diffs:
        return "missing"
    mean, low, high = spread(diffs)
    verdict = paired_verdict(diffs)
    if verdict is None:
        return f"{mean:+.3f} (1 seed)"
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] " + (verdict if verdict == "tie" else f"{verdict} on every seed")


def seeds_text(row):
    done = [r["seed"] for r in row.results if r["complete"]]
    if len(done) == len(row.results):
        return str(len(done))
    missing = [f"seed {r['seed']} {r['status'] if r['status'] != 'ok' else 'missing'}" for r in row.results
               if not r["complete"]]
    return f"{len(done)} of {len(row.results)} ({'; '.join(missing)})"


def results_table(rows, references):
    """table.md: one line per run (mean and [min-max] over its seeds), then what the columns mean. Every
    comparison between rows is made at equal seeds (a row with a third seed is not compared on it)."""
    by_name = {row.run: row for row in rows}
    local_row, dense_row = (by_name.get(references.get(role)) for role in ("local", "dense"))
    best = best_fixed(rows, references)
    beats = dense_beats_local(local_row, dense_row)
    gap_header = "vs local and dense" if beats is False else "gap recovery"
    lines = [f"| run | layers | seeds | val loss mean [min-max] | global fraction | attention FLOPs ideal | "
             f"computed | KV bytes | training tokens/s | wall time | {gap_header} | vs best fixed, same seed | "
             f"vs {references.get('local', 'local')}, same seed | vs {references.get('dense', 'dense')}, same seed |",
             "|" + "---|" * 14]
    for row in rows:
        kv, kv_dense = row.stat("kv_bytes"), row.stat("kv_bytes_dense")
        kv_text = "missing" if kv is None else fmt_bytes(kv[0]) + (
            f" ({100 * kv[0] / kv_dense[0]:.0f}%)" if kv_dense and kv_dense[0] else "")
        tok, wall, frac = row.stat("tokens_per_s"), row.stat("wall_s"), row.stat("global_frac")
        frac_text = ("-" if row.kind == "fixed" else "missing") if frac is None else fmt_pct(frac, 1)
        lines.append(" | ".join([
            f"| {row.run}", row.layers, seeds_text(row), fmt_loss(row.stat("val_loss")), frac_text,
            fmt_pct(row.stat("flops_ideal")), fmt_pct(row.stat("flops_computed")), kv_text,
            "missing" if tok is None else f"{tok[0]:,.0f}", "missing" if wall is None else f"{wall[0] / 60:.1f} min",
            gap_text(row, local_row, dense_row), versus_best_fixed(row, best), paired_text(row, local_row),
            paired_text(row, dense_row)]) + " |")
    seed_counts = {len(row.losses()) for row in rows if row.losses()}
    notes = ["", "Val loss: the evaluator's fixed validation windows (evaluate.py), mean over the row's seeds with "
             "[min-max]" + ("; rows ran different numbers of seeds, so compare rows in the same-seed columns, not "
                            "by these means" if len(seed_counts) > 1 else "") + ". "
             "Global fraction: routed layers' global decisions. Attention FLOPs and KV-cache bytes: relative to "
             "an all-dense model of the same shape. Tokens/s: training steps only (the last process of the run); "
             "wall time: every training process of the run, mean over seeds."]
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
        notes.append(f"Best fixed: {best.run}, the schedule without routed layers with the lowest val loss at "
                     f"equal seeds (the mean same-seed difference to {local})." if local_row else
                     f"Best fixed: {best.run}, the schedule without routed layers with the lowest mean val loss.")
    notes.append("Same seed: val loss minus the reference's at each seed both ran (a seed fixes the backbone init "
                 "and the data order for every row), mean [min, max] over those seeds; better or worse only where "
                 "every seed differs in the same direction by 0.0005 or more (prints as 0.001 or more), else a tie.")
    incomplete = [row.run for row in rows if not row.complete]
    if incomplete:
        notes.append(f"**Incomplete**: {', '.join(incomplete)} (a seed failed or has not run); their numbers are over "
                     f"the seeds that finished, 'missing' where none did.")
    return "\n".join(lines + notes) + "\n"


def comparison_cell(by_name, run, other, absent):
    """run's val loss minus other's at the same seed (paired_text); absent where the grid lacks either."""
    return paired_text(by_name[run], by_name[other]) if run in by_name and other in by_name else absent


def comparisons_table(rows, comparisons):
    """The comparisons table: per question, the first run's val loss minus the other's at the same seed.
    '' without comparisons."""
    if not comparisons:
        return ""
    by_name = {row.run: row for row in rows}
    lines = ["| question | runs | val loss difference, same seed |", "|---|---|---|"]
    for question, (run, other) in comparisons.items():
        lines.append(f"| {question} | {run} - {other} | {comparison_cell(by_name, run, other, 'missing')} |")
    return "\n".join(lines) + "\n"


def save_rows(path, grid, rows):
    """rows.json of a record: the grid's name, references and comparisons and every row with its per-seed
    results, so that tables and plots can be drawn again from the record alone (load_rows)."""
    write_json(path, {"grid": grid.name, "references": grid.references,
                      "comparisons": {q: list(pair) for q, pair in grid.comparisons.items()},
                      "rows": [dataclasses.asdict(r) for r in rows]})


def load_rows(record):
    """(grid name, references, rows, comparisons) from a record folder that compare.py wrote (records written
    before comparisons existed have none)."""
    path = os.path.join(record, "rows.json")
    saved = read_json(path)
    if not saved:
        raise GridError(f"{path} not found or not JSON: name a record folder that compare.py wrote "
                        f"(results/<date>_<grid>)")
    return (saved["grid"], saved["references"], [Row(**row) for row in saved["rows"]],
            {q: tuple(pair) for q, pair in saved.get("comparisons", {}).items()})


def summary_comparisons(grids):
    """The comparisons of several grids in one table, a column per grid: every grid's questions, each answered
    by every grid that has both its runs ('-' where one lacks them; a record written before comparisons existed
    answers the others' questions too). grids: [(title, rows, comparisons)]."""
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
    names, layers = [], {}
    for _, rows, _ in grids:
        for row in rows:
            if row.run not in layers:
                names.append(row.run)
                layers[row.run] = row.layers
    header = ["run", "layers"] + [f"{title}: {column}" for title, _, _ in grids
                                  for column in ("val loss", "global", "attn FLOPs", "vs best fixed, same seed",
                                                 "vs local, same seed")]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_grid = []
    for _, rows, references in grids:
        by_name = {row.run: row for row in rows}
        by_grid.append((by_name, best_fixed(rows, references), by_name.get(references.get("local"))))
    for name in names:
        cells = [name, layers[name]]
        for by_name, best, local_row in by_grid:
            row = by_name.get(name)
            if row is None:
                cells += ["-"] * 5
                continue
            frac = row.stat("global_frac")
            cells += [fmt_loss(row.stat("val_loss")), "-" if frac is None else fmt_pct(frac, 1),
                      fmt_pct(row.stat("flops_ideal")), versus_best_fixed(row, best), paired_text(row, local_row)]
        lines.append("| " + " | ".join(cells) + " |")
    notes = ["", "Val loss on each grid's fixed validation windows, mean over the row's seeds with [min-max]; global: "
             "the routed layers' global decisions; attention FLOPs: ideal, vs an all-dense model of the same shape; "
             "same seed: val loss minus the reference's at each seed both ran, mean [min, max], better or worse "
             "only where every seed differs in the same direction by 0.0005 or more, else a tie. Best fixed: the "
             "schedule without routed layers with the lowest mean same-seed difference to local."]
    for (title, rows, _), (_, best, _) in zip(grids, by_grid):
        if best:
            notes.append(f"{title}: best fixed schedule {best.run} ({fmt_loss(best.stat('val_loss'))}).")
    return "\n".join(lines + notes) + "\n"


def window_groups(jobs):
    """Runs with routed layers that differ from each other only in window: [[(window, run), ...], ...], each
    group with at least two windows, sorted by window."""
    ignore = {"window", "out_dir", "seed", "init_from"}
    signatures, seen = {}, set()
    for job in jobs:
        if job.kind == "fixed" or job.run in seen:
            continue
        seen.add(job.run)
        config = {**dataclasses.asdict(job.tcfg), **dataclasses.asdict(job.mcfg)}
        key = json.dumps({k: v for k, v in sorted(config.items()) if k not in ignore}, default=str)
        signatures.setdefault(key, []).append((job.mcfg.window, job.run))
    return [sorted(group) for group in signatures.values() if len({w for w, _ in group}) >= 2]
