"""The plan of a grid: one job per run and seed, in dependency order, each with its run folder
(OUT/GRID/RUN__seed_S), its train.py and evaluate.py commands, and its state (train, resume or skip;
evaluate or skip), read from the files the run folder holds."""
import ast
import dataclasses
import json
import os
import shlex
import sys

from model import GPTConfig
from nanoaha.configurator import ConfigError, parse_args, read_config_file
from nanoaha.formats import upgrade
from nanoaha.grid.gridfile import GridError, dependencies, format_value, run_order
from nanoaha.train_config import REPO as ROOT
from nanoaha.train_config import TrainConfig, corpus_dir
TRAIN_PY, EVALUATE_PY = os.path.join(ROOT, "train.py"), os.path.join(ROOT, "evaluate.py")
KEEP_TRAINING_KEYS = {"max_iters"}  # may change between launches of a run: resuming continues to the new value
MATCHED_RATE_TOLERANCE = 0.005  # a matched run is stale once a layer's source rate moved more than this


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
    eval_settings: dict = None  # the "settings" its eval.json must record: those of the grid's evaluate command
    matched_settings: dict = None  # for a "matched:NAME" run: NAME's eval_settings (its rates come from there)
    matched_window: int = 0  # ... and NAME's window (what key_window 0 resolves to)

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


def train_schemas():
    """The schemas train.py parses its arguments with."""
    return TrainConfig, GPTConfig


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
    if isinstance(value, str) and value.startswith(MATCHED):
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
            for dep in dict.fromkeys(dependencies(overrides)):  # a run named twice (its checkpoint and rates): once
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
            jobs.append(Job(run, seed, run_dir(out_root, grid, run, seed), overrides, deps, tcfg, mcfg,
                            grid_eval_settings(grid, tcfg, mcfg.window)))
    for job in jobs:
        dep = matched_run(job)
        target = next((j for j in jobs if j.run == dep), None)
        if target:
            job.matched_settings, job.matched_window = target.eval_settings, target.mcfg.window
        if target and ("R" not in target.mcfg.layer_letters or target.mcfg.n_layer != job.mcfg.n_layer):
            raise GridError(f"{grid.path}: run {job.run}: matched:{dep} needs {dep} to have routed layers and "
                            f"as many layers ({job.mcfg.n_layer})")
    return jobs


MATCHED = ("matched:", "matched_heads:")  # random routing at NAME's rates: per layer, or per head


def matched_per_head(job):
    """Whether a job's random rates are "matched_heads:NAME", each head's own."""
    return str(job.overrides.get("random_global_q")).startswith("matched_heads:")


def matched_run(job):
    """NAME of a job's "matched:NAME" (or "matched_heads:NAME") value, else None."""
    value = job.overrides.get("random_global_q")
    prefix = next((p for p in MATCHED if isinstance(value, str) and value.startswith(p)), None)
    return value[len(prefix):] if prefix else None


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_summary(out_dir):
    """The run's train_summary.json in the current format (nanoaha/formats.py); None where there is none."""
    return upgrade("train_summary", read_json(os.path.join(out_dir, "train_summary.json")))


def read_evaluation(out_dir):
    """The run's eval.json in the current format; None where there is none."""
    return upgrade("evaluation", read_json(eval_json(out_dir)))


def matched_rates(job, out_root, grid):
    """random_global_q for a "matched:NAME" run: NAME's per-layer global fractions (same seed), 0 for layers
    that are not routed (a random rate is used by routed layers only); for "matched_heads:NAME" each routed
    layer's per-head fractions (which heads, not only how many decisions). None until NAME's evaluation exists."""
    if matched_run(job) is None:
        return None
    result = evaluation_with(run_dir(out_root, grid, matched_run(job), job.seed), job.matched_settings,
                             job.matched_window)
    if result is None:
        return None  # not evaluated yet, or not by the grid (another evaluate.py wrote over it): not its rates
    if matched_per_head(job):
        return [0.0 if q is None else [round(h, 6) for h in q] for q in result["global_frac_per_head"]]
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


def eval_flags(grid):
    """The grid's evaluate dict as evaluate.py flags."""
    return [f"--{k}={format_value(v)}" for k, v in grid.evaluate.items()]


def eval_argv(job, grid):
    """The evaluation command the grid asks for (the runner adds --overwrite when it runs it: a run's eval.json
    is the grid's, and one with other settings is replaced)."""
    return [sys.executable, os.path.relpath(EVALUATE_PY), job.out_dir, *eval_flags(grid)]


def grid_eval_settings(grid, tcfg, window):
    """The settings (evaluate.eval_settings) the grid's evaluate command records for a run trained with tcfg:
    its data_dir, else the run's training corpus, as evaluate.py resolves it; key_window resolved (0 labels key
    tokens beyond the run's own window)."""
    from nanoaha.evaluation import EvalConfig, eval_settings
    try:
        (cfg,) = parse_args(eval_flags(grid), EvalConfig)
    except ConfigError as e:
        raise GridError(f"{grid.path}: evaluate: {e}") from None
    return resolved_key_window(eval_settings(cfg, cfg.data_dir or corpus_dir(tcfg.data_dir, tcfg.dataset)), window)


def resolved_key_window(settings, window):
    """Settings with key_window 0 ("each model's own window") as the window it labels by: an evaluation of a
    window-32 run at key_window 0 is the one the grid asks for at key_window 32."""
    return {**settings, "key_window": settings["key_window"] or window}


def evaluation_with(out_dir, settings, window):
    """out_dir's eval.json when it records these settings (None: any; key_window resolved with the run's window);
    else None: missing, unreadable, or written by another evaluate command (evaluate.py --overwrite)."""
    from nanoaha.evaluation import recorded_settings  # evaluate.py's settings (as grid_eval_settings)
    result = read_evaluation(out_dir)
    if not isinstance(result, dict):
        return None
    recorded = recorded_settings(result)
    if settings is not None and (recorded is None or resolved_key_window(recorded, window) != settings):
        return None
    return result


def grid_evaluation(job):
    """The run's eval.json when it is the evaluation the grid asks for (its recorded settings are the grid's)."""
    return evaluation_with(job.out_dir, job.eval_settings, job.mcfg.window)


def launches(out_dir):
    """The processes the runner started for this run folder: [{'step', 'argv', 'wall_s', 'returncode'}, ...]."""
    return read_json(os.path.join(out_dir, "launches.json")) or []


def comparable(argv, cwd, ignore=(), relative=False):
    """A train command as a set of settings that must not change between launches of one run: paths made
    absolute (the runner may be started from another directory), without resume, max_iters and `ignore`.
    relative: paths relative to cwd instead, for a run kept by a record, which trained in another checkout."""
    def path(value):
        value = os.path.normpath(os.path.join(cwd, value))
        return os.path.relpath(value, cwd) if relative else value
    settings = set()
    for arg in argv[2:]:
        key, _, value = arg.partition("=")
        if key.lstrip("-") in KEEP_TRAINING_KEYS or key.lstrip("-") in ignore:
            continue
        if arg.endswith(".py") and not arg.startswith("--"):
            arg = path(arg)
        elif key in ("--init_from", "--out_dir", "--data_dir"):
            arg = f"{key}={path(value)}"
        settings.add(arg)
    return settings


def train_state(job, grid, out_root):
    """What the run needs: 'skip' (complete), 'resume' (a checkpoint short of max_iters), 'train' (nothing yet).
    A complete run without its checkpoint (kept by a record, nanoaha/grid/kept.py) is 'skip' when its eval.json
    is the grid's evaluation. Refuses a run folder trained with another command (delete it to retrain)."""
    summary = read_summary(job.out_dir)
    has_ckpt = os.path.isfile(os.path.join(job.out_dir, "ckpt.pt"))
    complete = bool(summary and summary.get("complete") and summary.get("max_iters") == job.tcfg.max_iters)
    kept = complete and not has_ckpt and grid_evaluation(job) is not None
    planned = train_argv(job, grid, out_root)
    first = next((launch for launch in launches(job.out_dir) if launch["step"] == "train"), None)
    known = (has_ckpt or kept) and first is not None and "--init_from=resume" not in first["argv"] \
        and planned is not None
    ignore = ["random_global_q"] if matched_run(job) else []  # a re-evaluation may move matched rates a little
    ignore += ["out_dir"] if kept else []  # a kept run may come back under another --out
    differ = sorted(comparable(planned, os.getcwd(), ignore, kept) ^ comparable(first["argv"], first["cwd"], ignore, kept)) \
        if known else []
    if differ:
        raise GridError(f"{job.out_dir} was trained with another command (differs in {' '.join(differ)[:200]}): "
                        f"delete that folder to retrain it, or restore the grid")
    if known and matched_run(job):
        check_matched_rates(job, first["argv"], planned)
    if complete and (has_ckpt or kept):
        return "skip"
    return "resume" if has_ckpt else "train"


def check_matched_rates(job, trained_argv, planned_argv):
    """Refuses a "matched:NAME" run whose rates no longer match NAME's evaluation (NAME was retrained or
    re-evaluated since): it would be compared at a cost NAME no longer has."""
    def rates(argv):
        value = next((a.partition("=")[2] for a in argv if a.startswith("--random_global_q=")), None)
        return None if value is None else ast.literal_eval(value)
    def flat(rates):  # a layer's rate, or its heads' rates
        return [x for q in rates for x in (q if isinstance(q, list) else [q])]
    trained, now = rates(trained_argv), rates(planned_argv)
    if trained is not None and now is not None and (
            len(flat(trained)) != len(flat(now)) or
            max(abs(a - b) for a, b in zip(flat(trained), flat(now))) > MATCHED_RATE_TOLERANCE):
        raise GridError(f"{job.out_dir} trained at per-layer rates {trained}, but {matched_run(job)} seed "
                        f"{job.seed}'s evaluation now gives {now}: delete that folder to retrain it at the new rates "
                        f"(a layer moved more than {MATCHED_RATE_TOLERANCE})")


def eval_state(job, grid):
    """'skip' when eval.json is newer than the checkpoint, came from the same evaluate command and records the
    grid's settings (not another evaluation written over it), or when a run kept by a record (no checkpoint) has
    the grid's evaluation; else 'evaluate'."""
    path, ckpt = eval_json(job.out_dir), os.path.join(job.out_dir, "ckpt.pt")
    evaluated = [[a for a in launch["argv"] if a != "--overwrite"] for launch in launches(job.out_dir)
                 if launch["step"] == "evaluate"]
    if not os.path.isfile(ckpt) and grid_evaluation(job) is not None:
        return "skip"  # kept by a record (perhaps under another --out): nothing to evaluate again
    fresh = os.path.isfile(path) and os.path.isfile(ckpt) and os.path.getmtime(path) >= os.path.getmtime(ckpt)
    same = fresh and evaluated and evaluated[-1][1:] == eval_argv(job, grid)[1:]
    return "skip" if same and grid_evaluation(job) is not None else "evaluate"


def describe(job, grid, out_root):
    """The dry run's line for a job: what happens to it and the command."""
    state = train_state(job, grid, out_root)
    after = f" (after {', '.join(f'{r} seed {s}' for r, s in job.deps)})" if job.deps else ""
    per = "head" if matched_per_head(job) else "layer"
    argv = train_argv(job, grid, out_root, resume=state == "resume",
                      unresolved=f"<per-{per} global fractions of {matched_run(job)} seed {job.seed}, once evaluated>")
    if state == "skip" and not os.path.isfile(os.path.join(job.out_dir, "ckpt.pt")):
        what = "complete (kept by a record, no checkpoint), skipped"
    elif state == "skip":
        what = "complete, skipped" + ("" if eval_state(job, grid) == "skip" else "; will be evaluated")
    elif state == "resume":
        summary = read_summary(job.out_dir) or {}
        what = f"will resume from step {summary.get('iter_num', '?')} of {job.tcfg.max_iters}"
    else:
        what = "will train"
    return f"{job.label}{after}: {what}\n    {shlex.join(['python', *argv[1:]])}"


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
