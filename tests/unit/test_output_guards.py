"""Nothing a command writes destroys what another wrote: evaluations owned by their grid, pruning onto another
run, one runner per grid folder, grid settings checked up front, stopped runs called interrupted, capped
eval_tokens, valid JSON."""
import json
import math
import os
import socket

import pytest

import compare
import evaluate
import prune
from helpers import byte_corpus, write_grid
from data.atomic_files import write_json
from nanoaha.evaluation import EvalConfig, eval_settings, evaluate_checkpoint, recorded_settings
from nanoaha.formats import ROOT as PROJECT_ROOT
from nanoaha.grid import runner
from nanoaha.grid.gridfile import GridError, load_grid
from nanoaha.grid.lock import LOCK_NAME, GridLock
from nanoaha.grid.plan import eval_argv, eval_state, grid_evaluation, plan, train_argv
from nanoaha.grid.tables import collect
from test_evaluate import untrained_checkpoint

FAST = ["--eval_tokens=64", "--batch_size=2", "--thresholds=()", "--device=cpu"]


def test_evaluate_refuses_to_replace_an_evaluation_written_with_other_settings(tmp_path, prepared_corpus):
    run = untrained_checkpoint(tmp_path / "run", prepared_corpus)
    other = str(byte_corpus(tmp_path / "other"))
    evaluate.main([run, *FAST])
    path = os.path.join(run, "eval.json")
    first = open(path).read()
    assert json.loads(first)["settings"]["eval_tokens"] == 64
    for changed in ([f"--data_dir={other}"], ["--eval_tokens=128"], ["--dtype=bfloat16"], ["--thresholds=0.5"],
                    ["--key_k=3"], ["--key_window=4"]):
        with pytest.raises(SystemExit) as e:
            evaluate.main([run, *FAST, *changed])
        message = str(e.value.code)
        assert path in message and "--overwrite" in message and "\n" not in message, changed
        assert open(path).read() == first  # untouched
    evaluate.main([run, *FAST])  # the same settings: the same numbers, replaced
    evaluate.main([run, *FAST, f"--data_dir={other}", "--overwrite"])
    assert json.load(open(path))["settings"]["data_dir"] == os.path.abspath(other)  # outside the project: absolute
    written = json.load(open(path))
    assert written["format"] == 1
    del written["settings"]["key_window"], written["format"]
    write_json(path, written)  # an evaluation from before key_window: it was evaluated at its default, 0
    evaluate.main([run, *FAST, f"--data_dir={other}"])
    assert json.load(open(path))["settings"]["key_window"] == 0
    written = json.load(open(path))
    del written["settings"]["key_window"], written["format"]
    write_json(path, written)
    with pytest.raises(SystemExit, match=r"other key_window \(0, not 4\).*--overwrite"):
        evaluate.main([run, *FAST, f"--data_dir={other}", "--key_window=4"])
    del written["settings"]["key_k"]
    write_json(path, written)  # an evaluation from before key tokens: its numbers are other settings'
    with pytest.raises(SystemExit, match=r"other key_k \(None, not 0\).*--overwrite"):
        evaluate.main([run, *FAST, f"--data_dir={other}"])
    os.remove(path)
    with open(path, "w") as f:  # an evaluation from before settings were recorded
        json.dump({"val_loss": 1.0}, f)
    with pytest.raises(SystemExit, match="settings are unrecorded.*--overwrite"):
        evaluate.main([run, *FAST])


def test_compare_reads_only_the_evaluation_its_grid_asked_for(tmp_path, prepared_corpus):
    out = str(tmp_path / "out")
    path = write_grid(tmp_path / "g.py", {"routed": {"schedule": "R"}},
                      {"data_dir": prepared_corpus, "block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32,
                       "window": 8, "max_iters": 0},
                      extra="evaluate = {'eval_tokens': 64, 'batch_size': 2, 'thresholds': [], 'device': 'cpu'}\n")
    grid = load_grid(path)
    (job,) = plan(grid, out)
    untrained_checkpoint(job.out_dir, prepared_corpus)
    argv = eval_argv(job, grid) + ["--overwrite"]
    evaluate.main(argv[2:])  # what the runner runs
    write_json(os.path.join(job.out_dir, "launches.json"), [{"step": "evaluate", "argv": argv, "cwd": os.getcwd(),
                                                            "started": "x", "wall_s": 1.0, "returncode": 0}])
    ours = json.load(open(os.path.join(job.out_dir, "eval.json")))
    assert grid_evaluation(job) == ours and eval_state(job, grid) == "skip"
    before_key_window = {**{k: v for k, v in ours.items() if k != "format"},
                         "settings": {k: v for k, v in ours["settings"].items() if k != "key_window"}}
    write_json(os.path.join(job.out_dir, "eval.json"), before_key_window)  # evaluated before key_window existed
    assert grid_evaluation(job) == ours and eval_state(job, grid) == "skip"  # still the grid's, read as it is now
    assert collect(job)["val_loss"] == ours["val_loss"]
    assert [collect(job)[key] for key in ("key_loss", "other_loss", "key_frac")] == \
        [ours["key_loss"], ours["other_loss"], ours["key_frac"]]  # kept in rows.json for tables to come
    evaluate.main([job.out_dir, "--eval_tokens=32", "--batch_size=2", "--thresholds=[]", "--device=cpu",
                   "--overwrite"])  # someone evaluates the run with other settings, over the grid's
    assert json.load(open(os.path.join(job.out_dir, "eval.json")))["val_loss"] != ours["val_loss"]
    assert grid_evaluation(job) is None and eval_state(job, grid) == "evaluate"  # re-evaluated, never read
    assert collect(job)["val_loss"] is None


def test_matched_rates_come_only_from_the_grids_own_evaluation(tmp_path):
    path = write_grid(tmp_path / "g.py", {"random": {"schedule": "R", "routing": "random",
                                                     "random_global_q": "matched:routed"},
                                          "routed": {"schedule": "R"}}, extra="evaluate = {'eval_tokens': 512}\n")
    grid, out = load_grid(path), str(tmp_path / "out")
    routed, random = plan(grid, out)
    os.makedirs(routed.out_dir)
    for settings, rates in (({**routed.eval_settings, "eval_tokens": 64}, None),  # someone else's evaluation
                            (routed.eval_settings, "[0.25, 0.5]")):
        write_json(os.path.join(routed.out_dir, "eval.json"), {"global_frac_per_layer": [0.25, 0.5],
                                                              "settings": settings})
        argv = train_argv(random, grid, out)
        assert (argv and f"--random_global_q={rates}" in argv) if rates else argv is None


def test_eval_tokens_are_capped_at_the_val_splits_distinct_windows(tmp_path, prepared_corpus):
    run = untrained_checkpoint(tmp_path / "run", prepared_corpus)
    val_tokens = json.load(open(os.path.join(prepared_corpus, "meta.json")))["val_tokens"]
    lines = []
    result = evaluate_checkpoint(run, eval_tokens=100_000_000, batch_size=16, thresholds=(), log=lines.append)
    distinct = (val_tokens - 1) // 32
    assert result["eval_tokens"] <= distinct * 32 <= val_tokens
    (note,) = [line for line in lines if line.startswith("note: eval_tokens")]
    assert "eval_tokens=100,000,000 is more than the val split holds" in note and f"its {distinct} distinct" in note


def test_prune_refuses_an_out_dir_holding_another_runs_checkpoint(tmp_path, prepared_corpus):
    source = untrained_checkpoint(tmp_path / "source", prepared_corpus, schedule="R")
    other = untrained_checkpoint(tmp_path / "other", prepared_corpus, schedule="G")
    target = os.path.join(other, "ckpt.pt")
    before = open(target, "rb").read()
    with pytest.raises(SystemExit) as e:
        prune.main([source, f"--out_dir={other}", *FAST[:2], "--device=cpu"])
    message = str(e.value.code)
    assert target in message and "--overwrite" in message and "\n" not in message
    assert open(target, "rb").read() == before
    for name in ("ckpt_best.pt", "train_summary.json", "eval.json"):  # the other run's, beside its checkpoint
        with open(os.path.join(other, name), "w") as f:
            f.write("{}")
    prune.main([source, f"--out_dir={other}", *FAST[:2], "--device=cpu", "--overwrite"])
    assert open(target, "rb").read() != before
    assert sorted(os.listdir(other)) == ["ckpt.pt"]  # nothing of the replaced run is left to mislead


def dead_pid():
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_a_second_runner_on_a_grid_names_the_holder_and_a_stale_lock_is_taken_over(tmp_path, capsys):
    out = tmp_path / "out"
    path = write_grid(tmp_path / "g.py", {"local": {"schedule": "L"}}, {"max_iters": 1})
    with GridLock(str(out / "g")):
        with pytest.raises(SystemExit) as e:
            compare.main([path, f"--out={out}", f"--record_dir={tmp_path / 'records'}"])
        message = str(e.value.code)
        assert message.startswith("grid error:") and "\n" not in message
        assert f"pid {os.getpid()} on {socket.gethostname()}" in message and "in use by another compare.py" in message
        assert compare.main([path, f"--out={out}", "--dry_run"]) == 0  # a dry run needs no lock
    assert sorted(os.listdir(out / "g")) == [LOCK_NAME]  # nothing ran
    assert (out / "g" / LOCK_NAME).read_text() == ""  # released
    pid = dead_pid()
    (out / "g" / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": "then"}))
    lines = []
    with GridLock(str(out / "g"), log=lines.append):
        assert json.loads((out / "g" / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert len(lines) == 1 and "taking over a stale lock" in lines[0] and f"pid {pid}" in lines[0]
    assert "no longer running" in lines[0]


@pytest.mark.parametrize("evaluate, message", [
    ({"eval_tokenz": 512}, "unknown config key 'eval_tokenz'; did you mean eval_tokens"),
    ({"eval_tokens": "many"}, "eval_tokens' expects int"),
    ({"out_dir": "x"}, "evaluate sets out_dir, which the runner sets"),
    ({"overwrite": True}, "evaluate sets overwrite"),
    ({"eval_tokens": 0}, "evaluate: eval_tokens=0: give at least 1"),
    ({"thresholds": [0.5, 1.5]}, "evaluate: router threshold(s) 1.5 outside [0, 1]"),
])
def test_a_typo_in_the_grids_evaluate_dict_is_found_by_load_grid(tmp_path, evaluate, message):
    path = write_grid(tmp_path / "g.py", {"local": {"schedule": "L"}}, extra=f"evaluate = {evaluate!r}\n")
    with pytest.raises(GridError) as e:
        load_grid(path)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("code", [-15, -2, 143, 130])
def test_a_run_stopped_by_the_runners_signal_is_interrupted_not_failed(tmp_path, monkeypatch, code):
    path = write_grid(tmp_path / "g.py", {"local": {"schedule": "L"}}, {"max_iters": 5})
    grid = load_grid(path)
    (job,) = plan(grid, str(tmp_path / "out"))
    stop = type(runner.stop_requested)()
    monkeypatch.setattr(runner, "stop_requested", stop)
    monkeypatch.setattr(runner, "launch", lambda *args: code)
    assert runner.execute(job, grid, str(tmp_path / "out"), log=lambda line: None).startswith(
        "interrupted" if code > 0 else "failed")  # not asked to stop: a killed process failed
    monkeypatch.setattr(runner, "launch", lambda *args: (stop.set(), code)[1])  # the runner stops it meanwhile
    assert runner.execute(job, grid, str(tmp_path / "out"), log=lambda line: None).startswith("interrupted")
    # its evaluation stopped the same way
    stop.clear()
    os.makedirs(job.out_dir)
    open(os.path.join(job.out_dir, "ckpt.pt"), "w").close()
    write_json(os.path.join(job.out_dir, "train_summary.json"), {"complete": True, "max_iters": 5, "iter_num": 5})
    status = runner.execute(job, grid, str(tmp_path / "out"), log=lambda line: None)
    assert status.startswith("interrupted") and "evaluat" in status


def test_json_files_hold_no_bare_nan(tmp_path):
    path = str(tmp_path / "x.json")
    write_json(path, {"loss": math.nan, "history": [[1, math.inf], [2, 1.5]], "nested": {"x": -math.inf}})

    def refuse(constant):
        raise ValueError(f"bare {constant} in the file")
    assert json.loads(open(path).read(), parse_constant=refuse) == {
        "loss": None, "history": [[1, None], [2, 1.5]], "nested": {"x": None}}


def test_a_corpus_inside_the_project_is_recorded_relative_so_a_record_matches_in_another_checkout():
    settings = eval_settings(EvalConfig(), os.path.join(PROJECT_ROOT, "data", "python_stdlib"))
    assert settings["data_dir"] == os.path.join("data", "python_stdlib")
    assert recorded_settings({"settings": settings}) == settings
    # written before 2026-12-06 in another checkout: the absolute path of its data/ folder
    elsewhere = {**settings, "data_dir": "/elsewhere/checkout/data/python_stdlib"}
    assert recorded_settings({"settings": elsewhere}) == settings
    outside = {**settings, "data_dir": "/srv/corpora/prose"}  # not in a data/ folder: stays what it was
    assert recorded_settings({"settings": outside})["data_dir"] == "/srv/corpora/prose"


def test_an_evaluation_at_each_models_own_window_is_the_grids_at_that_window_and_no_other(tmp_path):
    """A grid that fixes key_window (one label set for a window ladder) still reads the evaluations its runs at
    that window got with key_window 0 ("each model's own"); a run at another window is evaluated again."""
    from nanoaha.grid.plan import evaluation_with, resolved_key_window
    wanted = resolved_key_window(eval_settings(EvalConfig(key_window=32), str(tmp_path / "corpus")), 32)
    own_window = {"val_loss": 1.0, "settings": eval_settings(EvalConfig(), str(tmp_path / "corpus"))}
    write_json(str(tmp_path / "eval.json"), own_window)
    assert evaluation_with(str(tmp_path), wanted, window=32)["val_loss"] == 1.0
    assert evaluation_with(str(tmp_path), wanted, window=128) is None  # its key tokens lie beyond 128


def test_random_routing_matched_per_head_takes_each_heads_rate(tmp_path):
    """matched_heads:NAME: the heads' own global fractions, so random routing differs from learned routing only
    in which tokens go global, not which heads; a rate that moved since it trained is refused."""
    from nanoaha.grid.plan import check_matched_rates
    path = write_grid(tmp_path / "g.py", {"random": {"schedule": "RL", "routing": "random", "n_head": 2,
                                                     "random_global_q": "matched_heads:routed"},
                                          "routed": {"schedule": "RL", "n_head": 2}},
                      extra="evaluate = {'eval_tokens': 512}\n")
    grid, out = load_grid(path), str(tmp_path / "out")
    routed, random = plan(grid, out)
    os.makedirs(routed.out_dir)
    write_json(os.path.join(routed.out_dir, "eval.json"), {"global_frac_per_layer": [0.5, None],
                                                          "global_frac_per_head": [[1.0, 0.0], None],
                                                          "settings": routed.eval_settings})
    argv = train_argv(random, grid, out)
    assert "--random_global_q=[[1.0, 0.0], 0.0]" in argv
    moved = [a.replace("[[1.0, 0.0], 0.0]", "[[0.9, 0.1], 0.0]") for a in argv]
    with pytest.raises(GridError, match="trained at per-layer rates"):
        check_matched_rates(random, moved, argv)
