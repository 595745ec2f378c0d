import json
import os
import shutil
import signal
import subprocess
import time

import pytest

import compare
from helpers import CPU_FP32, ROOT, Script, run_script, table_cells, write_grid
from nanoaha import checkpoint
from nanoaha.grid.gridfile import load_grid
from nanoaha.grid.plan import launches, plan

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "window": 8, "batch_size": 4,
        "max_iters": 6, "warmup_iters": 2, "eval_interval": 3, "eval_iters": 1, "log_interval": 1,
        "router_lambda_ramp": 2, "tensorboard": False, **CPU_FP32}


def test_grid_runs_skips_what_is_complete_resumes_what_is_not_and_writes_the_record(tmp_path, tiny_corpus):
    out, records = str(tmp_path / "out"), str(tmp_path / "results")
    runs = {"local": {"schedule": "L"}, "routed": {"schedule": "R"},
            "broken": {"schedule": "G", "trainable": "router"}}  # train.py refuses it at start
    evaluate = "evaluate = {'eval_tokens': 512, 'thresholds': [0.3, 0.7], 'device': 'cpu'}\n" \
        "comparisons = {'routed vs local': ('routed', 'local')}\n"
    path = write_grid(tmp_path / "two.py", runs, {**TINY, "data_dir": str(tiny_corpus)}, extra=evaluate)
    argv = [path, "--jobs=2", f"--out={out}", f"--record_dir={records}"]
    assert compare.main(argv) == 1  # broken failed: the grid is incomplete
    g = load_grid(path)
    jobs = {job.run: job for job in plan(g, out)}
    for run in ("local", "routed"):
        summary = json.load(open(os.path.join(jobs[run].out_dir, "train_summary.json")))
        assert summary["complete"] and summary["iter_num"] == 6
        assert os.path.isfile(os.path.join(jobs[run].out_dir, "eval.json"))
    (record,) = os.listdir(records)
    assert record.endswith("_two")
    files = set(os.listdir(os.path.join(records, record)))
    assert {"README.md", "table.md", "two.py", "pareto.png", "val_curves.png", "heatmap_routed.png"} <= files
    assert "window.png" not in files  # no two runs differ only in window: no empty plot, no link
    assert "(window.png)" not in open(os.path.join(records, record, "README.md")).read()
    assert ("key_curves.png" in files) == ("![key-token loss curves](key_curves.png)" in
                                           open(os.path.join(records, record, "README.md")).read())
    assert "copy_curves.png" in files and "(copy_curves.png)" in open(os.path.join(records, record, "README.md")).read()
    # the routed row's heads along training (the probe's per-head scores); not the fixed local row's
    assert "heads_routed.png" in files and "heads_local.png" not in files
    assert "(heads_routed.png)" in open(os.path.join(records, record, "README.md")).read()
    # the attention training computed, over its logged steps, beside the end's
    assert "computed (end / training mean)" in open(os.path.join(records, record, "table.md")).read()
    table = open(os.path.join(records, record, "table.md")).read()
    assert "| broken | GG | 0 of 1 (seed 1 failed: train.py exited with 1" in table and "**Incomplete**" in table
    assert table_cells(table)["routed vs local"][1] == "routed - local" and "(1 seed)" in table_cells(table)["routed vs local"][2]
    readme = open(os.path.join(records, record, "README.md")).read()
    assert "A test grid: does the runner work?" in readme and "python compare.py " + path in readme
    assert "step 6: val loss" in readme  # the final log lines
    assert "comparison_curves.png" in files and "| routed vs local | routed - local | " in readme  # along training
    assert "## Per layer" in readme and "| routed | 1 | " in readme  # where routed spends global attention
    assert "this invocation: 5 processes" in readme  # local and routed: train, evaluate; broken: train

    logs = {run: os.path.getmtime(os.path.join(jobs[run].out_dir, "train.log")) for run in ("local", "routed")}
    launched = {run: len(launches(jobs[run].out_dir)) for run in ("local", "routed")}
    assert launched == {"local": 2, "routed": 2}  # train + evaluate
    del runs["broken"]
    runs["routed"]["max_iters"] = 9  # the grid asks for more: routed resumes from its step-6 checkpoint
    write_grid(tmp_path / "two.py", runs, {**TINY, "data_dir": str(tiny_corpus)}, extra=evaluate)
    log_size = os.path.getsize(os.path.join(jobs["routed"].out_dir, "train.log"))
    handlers = [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)]
    assert compare.main(argv) == 0
    # the grid's stop handler is gone afterwards (left installed, it made later forked workers ignore SIGTERM)
    assert [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)] == handlers
    assert sorted(os.listdir(records)) == [record, record + "_2"]  # a record is written once: the new one beside it
    assert os.path.getmtime(os.path.join(jobs["local"].out_dir, "train.log")) == logs["local"]
    assert len(launches(jobs["local"].out_dir)) == 2  # nothing launched for the complete run
    resumed = launches(jobs["routed"].out_dir)[2:]
    assert [launch["step"] for launch in resumed] == ["train", "evaluate"]
    assert "--init_from=resume" in resumed[0]["argv"] and "--max_iters=9" in resumed[0]["argv"]
    with open(os.path.join(jobs["routed"].out_dir, "train.log")) as f:
        new_lines = f.read()[log_size:]
    steps = [int(line.split(":")[0].split()[1]) for line in new_lines.splitlines() if line.startswith("iter ")]
    assert steps == [7, 8, 9]  # continued from step 6, not from 0
    summary = json.load(open(os.path.join(jobs["routed"].out_dir, "train_summary.json")))
    assert summary["complete"] and summary["iter_num"] == 9
    assert [step for step, _ in summary["val_history"]] == [0, 3, 6, 9]  # step 6 once, evaluated again on resume
    assert [step for step, _, _ in summary["key_history"]] == [0, 3, 6, 9]  # key and other tokens' losses alike
    assert "this invocation: 2 processes" in open(os.path.join(records, record + "_2", "README.md")).read()
    assert compare.main(argv) == 0  # everything complete: the record is drawn again from the runs' files
    assert "this invocation started no process" in open(os.path.join(records, record + "_3", "README.md")).read()

    runs["routed"]["router_lambda"] = 0.5  # another command for a trained run folder: refused, nothing runs
    write_grid(tmp_path / "two.py", runs, {**TINY, "data_dir": str(tiny_corpus)}, extra=evaluate)
    with pytest.raises(SystemExit, match="was trained with another command .*--router_lambda=0.5.*delete that folder"):
        compare.main(argv)


def test_a_grid_grows_in_a_later_session_from_the_runs_its_record_kept(tmp_path, tiny_corpus, capsys):
    """Session 1 trains local and writes a record that keeps its small files; session 2 (its out/ gone) adds a row,
    takes local back with --from_record (no process launched for it, no checkpoint) and trains only the new row;
    its record has both rows, local's numbers those of session 1."""
    records = str(tmp_path / "results")
    common = {**TINY, "data_dir": str(tiny_corpus)}
    evaluate = "evaluate = {'eval_tokens': 512, 'device': 'cpu'}\n"
    path = write_grid(tmp_path / "grow.py", {"local": {"schedule": "L"}}, common, extra=evaluate)
    assert compare.main([path, "--jobs=1", f"--out={tmp_path / 'out1'}", f"--record_dir={records}"]) == 0
    (first,) = os.listdir(records)
    kept = os.path.join(records, first, "runs", "local__seed_1")
    assert sorted(os.listdir(kept)) == ["eval.json", "launches.json", "train.log", "train_summary.json"]

    path = write_grid(tmp_path / "grow.py", {"local": {"schedule": "L"}, "routed": {"schedule": "R"}}, common,
                      extra=evaluate)
    out2 = str(tmp_path / "out2")
    argv = [path, "--jobs=1", f"--out={out2}", f"--record_dir={records}", f"--from_record={os.path.join(records, first)}"]
    assert compare.main(argv + ["--dry_run"]) == 0
    printed = capsys.readouterr().out
    assert "would take 1 finished run(s)" in printed and not os.path.exists(out2)
    assert "local seed 1: kept run taken from" in printed and "routed seed 1: will train" in printed
    assert compare.main(argv) == 0
    printed = capsys.readouterr().out
    assert "took 1 finished run(s) from" in printed and "local seed 1" in printed
    local_dir = os.path.join(out2, "grow", "local__seed_1")
    assert not os.path.exists(os.path.join(local_dir, "ckpt.pt"))
    assert [launch["step"] for launch in launches(local_dir)] == ["train", "evaluate"]  # session 1's, none new
    second = sorted(os.listdir(records))[1]
    rows = {row["run"]: row for row in json.load(open(os.path.join(records, second, "rows.json")))["rows"]}
    first_rows = {row["run"]: row for row in json.load(open(os.path.join(records, first, "rows.json")))["rows"]}
    assert rows["local"]["results"][0]["val_loss"] == first_rows["local"]["results"][0]["val_loss"]
    assert rows["routed"]["results"][0]["complete"]
    assert sorted(os.listdir(os.path.join(records, second, "runs"))) == ["local__seed_1", "routed__seed_1"]
    assert compare.main([path, "--jobs=1", f"--out={out2}", f"--record_dir={records}", "--dry_run"]) == 0
    assert "local seed 1: complete (kept by a record, no checkpoint), skipped" in capsys.readouterr().out

    path = write_grid(tmp_path / "grow.py", {"local": {"schedule": "L", "window": 4}}, common, extra=evaluate)
    with pytest.raises(SystemExit, match="was trained with another command .*--window=4"):
        compare.main([path, f"--out={tmp_path / 'out3'}", f"--from_record={os.path.join(records, first)}"])
    with pytest.raises(SystemExit, match="neither runs/ nor rows.json there"):
        compare.main([path, f"--out={tmp_path / 'out4'}", f"--from_record={tmp_path}"])


def test_a_record_without_its_kept_runs_gives_back_their_numbers_and_the_grid_trains_only_what_is_new(
        tmp_path, tiny_corpus, capsys):
    """A record whose runs/ is gone (before the .gitignore fix a fresh clone had none) still holds every run's
    numbers in rows.json: a later session's grid with one more seed takes them for the runs trained with the same
    settings (no run folder, no process), trains the new seed, and its record has both seeds; a run whose settings
    changed is not taken, and a run that needs a taken run's checkpoint is refused."""
    records = str(tmp_path / "results")
    common = {**TINY, "data_dir": str(tiny_corpus)}
    evaluate = "evaluate = {'eval_tokens': 512, 'device': 'cpu'}\n"
    runs = {"local": {"schedule": "L"}, "routed": {"schedule": "R", "seeds": [1]}}
    path = write_grid(tmp_path / "seeds.py", runs, common, extra=evaluate)
    assert compare.main([path, "--jobs=2", f"--out={tmp_path / 'out1'}", f"--record_dir={records}"]) == 0
    (first,) = os.listdir(records)
    shutil.rmtree(os.path.join(records, first, "runs"))
    old = {row["run"]: row["results"] for row in json.load(open(os.path.join(records, first, "rows.json")))["rows"]}

    path = write_grid(tmp_path / "seeds.py", runs, {**common}, extra=evaluate + "seeds = [1, 2]\n")
    out2 = str(tmp_path / "out2")
    argv = [path, "--jobs=1", f"--out={out2}", f"--record_dir={records}", f"--from_record={os.path.join(records, first)}"]
    assert compare.main(argv + ["--dry_run"]) == 0
    printed = capsys.readouterr().out
    assert "would take the numbers of 2 run(s) from its rows.json: local seed 1, routed seed 1" in printed
    assert "local seed 1: numbers taken from" in printed and "local seed 2: will train" in printed
    assert compare.main(argv) == 0
    assert [d for d in sorted(os.listdir(os.path.join(out2, "seeds"))) if not d.startswith(".")] == ["local__seed_2"]
    second = sorted(os.listdir(records))[1]
    rows = {row["run"]: row for row in json.load(open(os.path.join(records, second, "rows.json")))["rows"]}
    assert [r["seed"] for r in rows["local"]["results"]] == [1, 2] and all(r["complete"] for r in rows["local"]["results"])
    assert rows["local"]["results"][0]["val_loss"] == old["local"][0]["val_loss"]
    assert rows["routed"]["results"][0]["per_head"] == old["routed"][0]["per_head"]
    assert rows["local"]["results"][0]["taken_from"] == os.path.join(records, first)
    assert sorted(os.listdir(os.path.join(records, second, "runs"))) == ["local__seed_2"]  # files only where they exist
    readme = open(os.path.join(records, second, "README.md")).read()
    assert "2 training(s) came as numbers from an earlier record's rows.json" in readme
    assert "(numbers from " in readme and "| local | LL | 2 |" in open(os.path.join(records, second, "table.md")).read()

    changed = write_grid(tmp_path / "seeds.py", {"local": {"schedule": "L", "window": 4}, "routed": runs["routed"]},
                         common, extra=evaluate + "seeds = [1, 2]\n")
    assert compare.main([changed, f"--out={tmp_path / 'out3'}", f"--from_record={os.path.join(records, second)}",
                         "--dry_run"]) == 0
    printed = capsys.readouterr().out
    assert "not local seed 1: the record trained or evaluated it with other settings; it trains here" in printed
    assert "local seed 1: will train" in printed and "routed seed 1: numbers taken from" in printed
    needs = write_grid(tmp_path / "seeds.py", {**runs, "tuned": {"schedule": "R", "init_from": "run:routed",
                                                                  "max_iters": 8, "seeds": [1]}},
                       common, extra=evaluate + "seeds = [1, 2]\n")
    with pytest.raises(SystemExit, match="tuned seed 1 starts from routed seed 1's checkpoint or evaluation, which the "
                                         "record has only as numbers"):
        compare.main([needs, f"--out={tmp_path / 'out4'}", f"--from_record={os.path.join(records, second)}"])


def test_git_keeps_a_records_runs_and_ignores_the_run_folders():
    """A record's kept runs (results/DATE_GRID/runs/, nanoaha/grid/kept.py) are what a later session's
    --from_record takes back: a .gitignore pattern that matched them (an unanchored 'runs/' did) left every record
    without them on a fresh clone. Training output at the root stays ignored."""
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("needs a git checkout")
    def ignored(path):
        done = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT)
        assert done.returncode in (0, 1), f"git check-ignore {path} failed"
        return done.returncode == 0
    kept = "results/2026-12-04_stdlib_live/runs/dense__seed_1/"
    assert not any(ignored(kept + name) for name in ("train_summary.json", "eval.json", "launches.json", "train.log"))
    assert all(ignored(path) for path in ("out/grids/x/ckpt.pt", "runs/x/events", "out_gpt2/ckpt.pt"))


def test_a_signal_stops_the_grid_and_every_run_saves_its_step(tmp_path, tiny_corpus):
    out = str(tmp_path / "out")
    runs = {"long": {"schedule": "R", "max_iters": 100000, "lr_decay_iters": 1000, "log_interval": 1},
            "later": {"schedule": "L"}}
    path = write_grid(tmp_path / "stop.py", runs, {**TINY, "data_dir": str(tiny_corpus)})
    log = os.path.join(out, "stop", "long__seed_1", "train.log")
    with Script("compare.py", path, "--jobs=1", f"--out={out}", f"--record_dir={tmp_path / 'results'}") as proc:
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(log) and "iter 3:" in open(log).read()):
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # as a Ctrl-C to the runner alone
        returncode, _, err = proc.finish()
    assert returncode == 130 and "run the same command again to resume" in err, err
    step = checkpoint.load_checkpoint(os.path.dirname(log), "cpu")["iter_num"]
    assert step >= 3 and "stopped by SIGTERM: saved" in open(log).read()
    assert not os.path.exists(os.path.join(out, "stop", "later__seed_1"))  # no new run started
    assert not os.path.exists(tmp_path / "results")  # and no record of an unfinished grid


def test_a_bad_argument_to_compare_ends_with_one_line(tmp_path):
    not_rows = tmp_path / "not_a_record"
    not_rows.mkdir()
    (not_rows / "rows.json").write_text('{"grid": "g", "rows": []}')  # JSON, but no references
    cases = {
        ("configs/grids/tiny.py", "--jbos=2"): "unknown config key 'jbos'; did you mean jobs?",
        ("configs/grids/no_such_grid.py", "--dry_run"): "grid file 'configs/grids/no_such_grid.py' does not exist",
        ("--summary=s", "configs/grids/tiny.py"): "configs/grids/tiny.py/rows.json not found or not JSON",
        ("--summary=s", str(not_rows)): "is not a rows.json that compare.py wrote (KeyError: 'references')",
        ("--summary=s", f"--record_dir={tmp_path / 'a_file' / 'below'}", "results/2026-12-02_stdlib_bpe"):
            "Not a directory",
    }
    (tmp_path / "a_file").write_text("")
    for args, message in cases.items():
        done = run_script("compare.py", *args, timeout=120)
        assert done.returncode == 1 and message in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, (args, done.stderr)
    assert not os.path.exists(tmp_path / "a_file" / "below")



def test_a_layout_learned_per_head_continues_fixed_from_its_checkpoint(tmp_path, tiny_corpus):
    """The diagnosis row: a per-head routed run's first steps, then its layout fixed (random routing at the
    per-head fractions of its evaluation, 0 or 1) from its checkpoint: one dependency, the rates resolved."""
    runs = {"first": {"schedule": "R", "router_per_token": False, "max_iters": 3},
            "fixed": {"schedule": "R", "routing": "random", "random_global_q": "matched_heads:first",
                      "init_from": "run:first", "max_iters": 3}}
    path = write_grid(tmp_path / "late.py", runs, {**TINY, "data_dir": str(tiny_corpus)},
                      extra="evaluate = {'eval_tokens': 256, 'device': 'cpu', 'thresholds': []}\n")
    out, records = str(tmp_path / "out"), str(tmp_path / "results")
    assert compare.main([path, "--jobs=1", f"--out={out}", f"--record_dir={records}"]) == 0
    first, fixed = plan(load_grid(path), out)
    assert fixed.deps == [("first", 1)]
    heads = json.load(open(os.path.join(first.out_dir, "eval.json")))["global_frac_per_head"]
    trained = next(a for a in launches(fixed.out_dir)[0]["argv"] if a.startswith("--random_global_q="))
    assert trained == f"--random_global_q={heads}" and all(q in (0.0, 1.0) for layer in heads for q in layer)


def test_a_partial_record_holds_the_finished_runs_and_names_the_others_without_training(tmp_path, tiny_corpus):
    """--partial: a grid whose second run has not started and whose third stopped short records the first
    alone, trains nothing, and its table says what is missing; the same command without it then finishes."""
    out, records = str(tmp_path / "out"), str(tmp_path / "results")
    runs = {"local": {"schedule": "L"}, "routed": {"schedule": "R"}, "dense": {"schedule": "G"}}
    common = {**TINY, "data_dir": str(tiny_corpus)}
    path = write_grid(tmp_path / "three.py", {"local": runs["local"]}, common)
    assert compare.main([path, "--jobs=1", f"--out={out}", f"--record_dir={records}"]) == 0
    shutil.rmtree(records)
    path = write_grid(tmp_path / "three.py", runs, common)
    jobs = {job.run: job for job in plan(load_grid(path), out)}
    # dense stopped at step 3 of 6: its checkpoint stays, as a stopped run leaves it
    run_script("train.py", "configs/quickstart.py", *[f"--{k}={v}" for k, v in {**common, "schedule": "G",
                                                                                  "max_iters": 3}.items()],
               f"--out_dir={jobs['dense'].out_dir}", "--seed=1")
    assert compare.main([path, "--jobs=1", f"--out={out}", f"--record_dir={records}", "--partial"]) == 1
    assert not os.path.exists(jobs["routed"].out_dir)  # nothing trained
    assert json.load(open(os.path.join(jobs["dense"].out_dir, "train_summary.json")))["iter_num"] == 3
    (record,) = os.listdir(records)
    table = open(os.path.join(records, record, "table.md")).read()
    assert "0 of 1 (seed 1 not finished (not started))" in table
    assert "0 of 1 (seed 1 not finished (stopped short of its steps" in table and "**Incomplete**" in table
    assert table_cells(table)["local"][0] == "local"
    readme = open(os.path.join(records, record, "README.md")).read()  # not "every run was complete"
    assert "this invocation started no process (--partial: the finished runs, the others named below)" in readme
