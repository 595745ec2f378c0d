"""Nothing a command writes destroys what another wrote, from the command line: a grid run's eval.json is the
grid's, a second runner on a grid is refused and a killed runner's lock taken over."""
import json
import os
import signal
import time

import compare
from helpers import CPU_FP32, Script, run_script, write_grid
from nanoaha import checkpoint
from nanoaha.grid.gridfile import load_grid
from nanoaha.grid.lock import LOCK_NAME
from nanoaha.grid.plan import launches, plan

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "window": 8, "batch_size": 4,
        "max_iters": 6, "warmup_iters": 2, "eval_interval": 3, "eval_iters": 1, "log_interval": 1,
        "router_lambda_ramp": 2, "tensorboard": False, **CPU_FP32}
EVALUATE = "evaluate = {'eval_tokens': 512, 'thresholds': [0.5], 'device': 'cpu'}\n"


def rows_of_record(records):
    (record,) = sorted(os.listdir(records))[-1:]
    return {row["run"]: row for row in json.load(open(os.path.join(records, record, "rows.json")))["rows"]}


def test_a_grid_runs_evaluation_is_not_replaced_by_a_foreign_one_nor_read_once_it_is(tmp_path, tiny_corpus,
                                                                                    prepared_corpus):
    out, records = str(tmp_path / "out"), str(tmp_path / "results")
    path = write_grid(tmp_path / "own.py", {"routed": {"schedule": "R"}}, {**TINY, "data_dir": str(tiny_corpus)},
                      extra=EVALUATE)
    argv = [path, f"--out={out}", f"--record_dir={records}"]
    assert compare.main(argv) == 0
    (job,) = plan(load_grid(path), out)
    eval_json = os.path.join(job.out_dir, "eval.json")
    grids = open(eval_json).read()
    grid_loss = rows_of_record(records)["routed"]["results"][0]["val_loss"]
    assert grid_loss == json.loads(grids)["val_loss"]

    foreign = ["evaluate.py", job.out_dir, f"--data_dir={prepared_corpus}", "--eval_tokens=100000000",
               "--thresholds=0.5", "--device=cpu"]
    refused = run_script(*foreign)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert eval_json in line and "--overwrite" in line and "data_dir" in line and "eval_tokens" in line
    assert open(eval_json).read() == grids

    replaced = run_script(*foreign, "--overwrite")  # told to: replaced, and eval_tokens capped at the split
    assert replaced.returncode == 0, replaced.stderr
    val_tokens = json.load(open(os.path.join(prepared_corpus, "meta.json")))["val_tokens"]
    (note,) = [line for line in replaced.stdout.splitlines() if line.startswith("note: eval_tokens=")]
    assert "eval_tokens=100,000,000 is more than the val split holds" in note
    written = json.load(open(eval_json))
    assert written["val_loss"] != grid_loss and written["eval_tokens"] <= val_tokens
    assert written["settings"]["eval_tokens"] == 100000000

    assert compare.main(argv) == 0  # the grid re-evaluates its run instead of reading the foreign loss
    assert [launch["step"] for launch in launches(job.out_dir)] == ["train", "evaluate", "evaluate"]
    assert rows_of_record(records)["routed"]["results"][0]["val_loss"] == grid_loss
    assert json.load(open(eval_json))["val_loss"] == grid_loss


def test_a_second_runner_is_refused_and_a_killed_runners_lock_is_taken_over(tmp_path, tiny_corpus):
    out, records = str(tmp_path / "out"), str(tmp_path / "results")
    runs = {"long": {"schedule": "L", "max_iters": 100000, "lr_decay_iters": 1000}}
    path = write_grid(tmp_path / "locked.py", runs, {**TINY, "data_dir": str(tiny_corpus)}, extra=EVALUATE)
    log = os.path.join(out, "locked", "long__seed_1", "train.log")
    with Script("compare.py", path, f"--out={out}", f"--record_dir={records}") as first:
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(log) and "iter 4:" in open(log).read()):
            time.sleep(0.2)
        second = run_script("compare.py", path, f"--out={out}", f"--record_dir={records}", timeout=120)
        assert second.returncode == 1 and "Traceback" not in second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert f"in use by another compare.py (pid {first.proc.pid} on " in line and "started 20" in line
        assert run_script("compare.py", path, f"--out={out}", "--dry_run").returncode == 0  # no lock needed
        first.kill()  # SIGKILL: no handler runs, the lock file still names it
    holder = json.load(open(os.path.join(out, "locked", LOCK_NAME)))
    (orphan,) = holder["children"]  # its train.py, in a session of its own, still trains
    assert holder["pid"] == first.proc.pid and orphan != first.proc.pid
    try:
        refused = run_script("compare.py", path, f"--out={out}", f"--record_dir={records}", timeout=120)
        assert refused.returncode == 1 and f"its processes {orphan} still write" in refused.stderr, refused.stderr
        assert f"kill -TERM {orphan}" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    finally:
        os.kill(orphan, signal.SIGTERM)  # train.py saves its step and exits
    deadline = time.time() + 60
    while time.time() < deadline and os.path.exists(f"/proc/{orphan}") and \
            open(f"/proc/{orphan}/stat").read().split()[2] != "Z":
        time.sleep(0.2)
    step = checkpoint.load_checkpoint(os.path.dirname(log), "cpu")["iter_num"]
    runs["long"]["max_iters"] = step + 2  # resume a little further
    write_grid(tmp_path / "locked.py", runs, {**TINY, "data_dir": str(tiny_corpus)}, extra=EVALUATE)
    third = run_script("compare.py", path, f"--out={out}", f"--record_dir={records}", timeout=300)
    assert third.returncode == 0, third.stderr
    assert "taking over a stale lock" in third.stderr and f"pid {first.proc.pid}" in third.stderr
    assert "no longer running" in third.stderr
    assert open(os.path.join(out, "locked", LOCK_NAME)).read() == ""  # released on exit
