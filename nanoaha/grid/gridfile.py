"""The grid file format: a grid file (configs/grids/NAME.py) is plain Python; its docstring says what question
the grid answers:

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
    headline = {"reference": "dense", "runs": {"routed": "learned routing"}}  # optional: the record's first table
    # headline may also name "noise_floor": a run that is the reference again on another data order (data_order=1)

"run:NAME" (init_from) is the checkpoint of run NAME with the same seed; "matched:NAME" (random_global_q) the
per-layer global fractions of NAME's evaluation, same seed, "matched_heads:NAME" its per-head ones. Either makes NAME run first. A run's "seeds" key
replaces the grid's seeds for that run. Run NAME at seed S trains in OUT/GRID/NAME__seed_S. Each of
"comparisons" becomes a line of the record's comparisons table: the first run's val loss minus the other's at
the same seed (the pairs the grid's conclusions rest on). "headline" names the core rows (run -> what it is) of
the record's first table (tables.headline_table), each against the reference run at the same seed; its optional
"noise_floor" run measures how far two equally good runs land at one seed, and the table counts the differences
inside that as ties.

load_grid reads a grid file and checks it (every problem a GridError with a one-line message); run_order puts
each run after the runs it depends on. compare.py runs a grid: the plan is plan.py, running it runner.py, its
tables tables.py and its plots plots.py.
"""
import ast
import dataclasses
import difflib
import os

GRID_KEYS = {"base", "common", "seeds", "runs", "references", "evaluate", "comparisons", "headline"}
RUNNER_KEYS = {"out_dir", "seed"}  # the runner sets these for each run
RUNNER_EVAL_KEYS = {"out_dir", "overwrite"}  # the runner's evaluation writes the run's eval.json, replacing it
SPECIAL = {"run:": "init_from", "matched:": "random_global_q",
           "matched_heads:": "random_global_q"}  # prefix -> the one key it may be given to
GRID_WIDE_KEYS = {"dtype"}  # the same for every run (rows in another precision are not comparable): common only


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
    headline: dict = dataclasses.field(default_factory=dict)  # {"reference": run, "runs": {run: what it is}},
    #                                                             optionally "noise_floor": run


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
    check_evaluate(path, evaluate)
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
    headline = values.get("headline") or {}
    check_headline(path, headline, runs)
    grid = Grid(os.path.splitext(os.path.basename(path))[0], path, grid_doc(source), base, common, seeds, runs,
                run_seeds, references, evaluate, {q: tuple(pair) for q, pair in comparisons.items()}, headline)
    run_order(grid)  # reports cycles
    return grid


def check_headline(path, headline, runs):
    """headline: {} or {"reference": a run, "runs": {run: what it is (a string)}, optionally "noise_floor": a
    run}, every name a run."""
    if not headline:
        return
    ok = isinstance(headline, dict) and {"reference", "runs"} <= set(headline) <= {"reference", "runs", "noise_floor"} \
        and isinstance(headline["runs"], dict) and all(isinstance(v, str) for v in headline["runs"].values())
    if not ok:
        raise GridError(f"{path}: headline must be {{'reference': RUN, 'runs': {{RUN: 'what it is', ...}}}}, "
                        f"optionally with 'noise_floor': RUN")
    if headline.get("noise_floor") == headline["reference"]:
        raise GridError(f"{path}: headline's noise_floor is its reference; name the reference's run on another "
                        f"data order (data_order=1)")
    floor = [headline["noise_floor"]] if "noise_floor" in headline else []
    missing = [name for name in [headline["reference"], *headline["runs"], *floor] if name not in runs]
    if missing:
        raise GridError(f"{path}: headline names {', '.join(map(repr, missing))}, not a run of the grid")


def format_value(value):
    """A --key=VALUE text that configurator parses back to value: strings bare where that is unambiguous."""
    if isinstance(value, str):
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return repr(value)


def check_evaluate(path, evaluate):
    """The evaluate dict against evaluate.py's settings (EvalConfig: names, types, values), before anything
    runs: a typo found only after every run has trained costs the whole grid."""
    from nanoaha.configurator import ConfigError, parse_args
    from nanoaha.evaluation import EvalConfig, check_thresholds, threshold_list  # evaluate.py's settings
    if not isinstance(evaluate, dict) or not all(isinstance(k, str) for k in evaluate):
        raise GridError(f"{path}: evaluate must be a dict of evaluate.py options (e.g. {{'eval_tokens': 65536}})")
    for key in sorted(RUNNER_EVAL_KEYS & set(evaluate)):
        raise GridError(f"{path}: evaluate sets {key}, which the runner sets (each run's eval.json is the "
                        f"grid's); remove it")
    try:
        (cfg,) = parse_args([f"--{k}={format_value(v)}" for k, v in evaluate.items()], EvalConfig)
    except ConfigError as e:
        raise GridError(f"{path}: evaluate: {e} (evaluate.py's settings: python evaluate.py --help)") from None
    low = [key for key in ("eval_tokens", "batch_size", "max_examples") if getattr(cfg, key) < 1] + \
        (["context_length"] if cfg.context_length < 0 else [])
    if low:
        raise GridError(f"{path}: evaluate: {', '.join(f'{k}={getattr(cfg, k)}' for k in low)}: give at least 1 "
                        f"(context_length: 0 for block_size)")
    try:
        check_thresholds(threshold_list(cfg.thresholds) + ([] if cfg.router_threshold is None else [cfg.router_threshold]))
    except ValueError as e:
        raise GridError(f"{path}: evaluate: {e}") from None


def check_override(path, run, key, value, runs):
    if key in RUNNER_KEYS:
        raise GridError(f"{path}: {run} sets {key}, which the runner sets for every run (--out, seeds); remove it")
    if key in GRID_WIDE_KEYS and run != "common":
        raise GridError(f"{path}: run {run} sets {key}: every run of a grid trains with the same {key}; set it in "
                        f"common")
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
