"""The versions of the files nanoAHA writes and reads back, and one migration per change.

Every file written carries "format": its kind's current version (stamp); every file read goes through
upgrade(), which applies, in order, the migrations from the file's version to the current one, so the code that
reads a file sees the current format only. Version 0 is a file written before versions (2026-12-06). A change to
a format adds one function to its list in MIGRATIONS: the old files' fields, renamed or filled in as what they
mean (an unknown that was never recorded stays unknown: None, or an empty history).

    checkpoint          ckpt.pt / ckpt_best.pt (nanoaha/checkpoint.py)
    evaluation          eval.json (evaluate.py, nanoaha/evaluation.py)
    train_summary       train_summary.json (train.py)
    rows                a record's rows.json (nanoaha/grid/tables.py)
"""
import os

FIELD = "format"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def checkpoint_0(ckpt):
    """Fields added before versions, missing from older checkpoints: dtype (2026-12-02: unknown), key_history
    (2026-12-02), head_history (2026-12-03), copy_history and train_wall_s (2026-12-04: unknown)."""
    for key, missing in (("dtype", None), ("key_history", []), ("head_history", []), ("copy_history", []),
                         ("train_wall_s", None)):
        ckpt.setdefault(key, missing)
    return ckpt


def checkpoint_1(ckpt):
    """decision_history (2026-12-06): the decisions' stability at each evaluation; none before."""
    ckpt.setdefault("decision_history", [])
    return ckpt


def checkpoint_2(ckpt):
    """Routers' committed heads (2026-12-06, router_commit_after): none committed before (-1 for every head),
    no commits in the history, no streaks."""
    import torch  # here, so that reading a record's JSON files does not import torch

    ckpt.setdefault("commit_history", [])
    ckpt.setdefault("commit_streak", None)
    model, n_head = ckpt.get("model"), ckpt["model_config"].get("n_head")
    if isinstance(model, dict) and n_head:
        routers = {key.rpartition(".router.")[0] for key in model if ".router." in key}
        for prefix in routers:
            model.setdefault(f"{prefix}.router.committed", torch.full((n_head,), -1, dtype=torch.int8))
    return ckpt


def checkpoint_3(ckpt):
    """attention_flop_sums (2026-12-06): the attention FLOPs summed over the logged steps; unknown before."""
    ckpt.setdefault("attention_flop_sums", None)
    return ckpt


def checkpoint_4(ckpt):
    """commit_recent (2026-12-06, router_commit_by_iter): each head's recent global share; unknown before (a
    resumed run starts it from zero)."""
    ckpt.setdefault("commit_recent", None)
    return ckpt


def checkpoint_5(ckpt):
    """last_eval (2026-12-07): the latest evaluation's losses and routing, for the summary a resumed run writes
    before its own first evaluation; unknown before (that summary then waits for the next evaluation)."""
    ckpt.setdefault("last_eval", {})
    return ckpt


def evaluation_0(result):
    """key_window (2026-12-04) was evaluated at its default, 0; data_dir was recorded absolute (a corpus in some
    checkout's data/ folder reads as that path relative to this one's root, so a record matches elsewhere)."""
    settings = result.get("settings")
    if isinstance(settings, dict):
        settings.setdefault("key_window", 0)
        if isinstance(settings.get("data_dir"), str):
            settings["data_dir"] = portable_corpus_path(settings["data_dir"], legacy=True)
    return result


def train_summary_0(summary):
    """Fields added before versions: key_history (2026-12-02), copy_history and train_wall_s (2026-12-04:
    unknown), nonfinite_steps (unknown)."""
    for key, missing in (("val_history", []), ("key_history", []), ("copy_history", []), ("train_wall_s", None),
                         ("nonfinite_steps", None)):
        summary.setdefault(key, missing)
    return summary


def train_summary_1(summary):
    """decision_history (2026-12-06), as in checkpoints."""
    summary.setdefault("decision_history", [])
    return summary


def train_summary_2(summary):
    """commit_history (2026-12-06, router_commit_after): no commits before."""
    summary.setdefault("commit_history", [])
    return summary


def train_summary_3(summary):
    """attention_flop_frac_training (2026-12-06): the attention FLOPs, mean over the run's logged steps; unknown
    before (nanoaha/grid/tables.py reads them from the run's log lines instead)."""
    summary.setdefault("attention_flop_frac_training", None)
    return summary


def rows_0(saved):
    """Records written before grids had comparisons (2026-12-02's stdlib_bytes and stdlib_bpe) have none."""
    saved.setdefault("comparisons", {})
    return saved


def rows_1(saved):
    """flops_training (2026-12-06), the attention FLOPs computed in training as a mean over its logged steps:
    unknown in older records' results."""
    for row in saved.get("rows") or []:
        for result in row.get("results") or []:
            result.setdefault("flops_training", None)
    return saved


MIGRATIONS = {"checkpoint": [checkpoint_0, checkpoint_1, checkpoint_2, checkpoint_3, checkpoint_4,
                              checkpoint_5],
              "evaluation": [evaluation_0],
              "train_summary": [train_summary_0, train_summary_1, train_summary_2, train_summary_3],
              "rows": [rows_0, rows_1]}


def current(kind):
    return len(MIGRATIONS[kind])


def stamp(kind, obj):
    """obj as written now: with its kind's current format."""
    return {**obj, FIELD: current(kind)}


def upgrade(kind, obj, source="this file"):
    """obj (a dict read from a file of this kind) in the current format; a file from a newer nanoAHA is refused
    in one line. Non-dicts pass through (the caller's own checks name them)."""
    if not isinstance(obj, dict):
        return obj
    version = obj.get(FIELD, 0)
    if not isinstance(version, int) or version > current(kind):
        raise ValueError(f"{source} is a {kind} of format {version!r}, newer than this nanoAHA reads "
                         f"({current(kind)}): update nanoAHA (git pull)")
    for migration in MIGRATIONS[kind][version:]:
        obj = migration(obj)
    obj[FIELD] = current(kind)
    return obj


def portable_corpus_path(path, legacy=False):
    """A corpus path as an evaluation records it: relative to the project root where it lies inside it (a
    record's evaluations then match the same corpus in another checkout), absolute elsewhere. legacy: a path
    recorded absolute in another checkout's data/ folder reads as the same path under data/ here."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, ROOT)
    if not (relative == ".." or relative.startswith(".." + os.sep)):
        return relative
    if legacy and os.path.isabs(path):
        _, sep, tail = path.rpartition(os.sep + "data" + os.sep)
        if sep and tail:
            return os.path.join("data", tail)
    return path if legacy else absolute
