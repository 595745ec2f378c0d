"""Never lose a run: refused overwrites, non-finite steps, latest and best checkpoints, signals, setting ranges,
resuming on other data, and one-line errors from every script."""
import errno
import json
import math
import signal

import numpy as np
import pytest
import torch

import train
from data.tokens import write_meta, write_tokens
from helpers import CPU_FP32, Script, flags, run_script, train_configs
from model import GPT
from nanoaha import checkpoint
from nanoaha.configurator import run_main
from nanoaha.training import TrainingStopped

TINY = ["--block_size=32", "--window=8", "--n_layer=1", "--n_embd=32", "--n_head=2", "--eval_iters=1",
        "--batch_size=2", "--tensorboard=False", *flags(CPU_FP32)]


def configs(tmp_path, corpus, **overrides):
    values = {"data_dir": str(corpus), "out_dir": str(tmp_path / "out"), "block_size": 32, "n_layer": 2,
              "n_head": 2, "n_embd": 32, "window": 8, "batch_size": 4, "max_iters": 6, "eval_interval": 3,
              "eval_iters": 2, "log_interval": 3, "warmup_iters": 2, "learning_rate": 3e-3, "tensorboard": False,
              **CPU_FP32, **overrides}
    return train_configs(values)


def weights(path):
    return torch.load(path, weights_only=False)["model"]


def test_a_new_run_refuses_a_folder_with_a_checkpoint_unless_told_to_overwrite(tmp_path, tiny_corpus):
    train.train(*configs(tmp_path, tiny_corpus, max_iters=3))
    ckpt = tmp_path / "out" / "ckpt.pt"
    before = ckpt.stat().st_mtime_ns
    with pytest.raises(ValueError, match="--init_from=resume.*--overwrite"):
        train.train(*configs(tmp_path, tiny_corpus, max_iters=3))
    with pytest.raises(ValueError, match="exists"):  # a fine-tuning run too
        train.train(*configs(tmp_path, tiny_corpus, max_iters=3, init_from=str(ckpt)))
    assert ckpt.stat().st_mtime_ns == before
    result = train.train(*configs(tmp_path, tiny_corpus, max_iters=2, overwrite=True, eval_interval=100))
    assert checkpoint.load_checkpoint(str(ckpt), "cpu")["iter_num"] == 2
    assert checkpoint.load_checkpoint(str(tmp_path / "out" / checkpoint.BEST_NAME), "cpu")["iter_num"] in (0, 2)
    assert math.isfinite(result["val_loss"])


def test_non_finite_steps_are_skipped_counted_and_leave_the_weights_alone(tmp_path, tiny_corpus, monkeypatch,
                                                                          capsys):
    forward, calls, stepped = GPT.forward, [0], []
    poisoned = {2, 3}  # training forwards (steps) whose loss becomes NaN

    def poisoning_forward(self, idx, targets=None, *args, **kwargs):
        out = forward(self, idx, targets, *args, **kwargs)
        if self.training:
            if calls[0] in poisoned:
                out.lm_loss = out.lm_loss * float("nan")
            calls[0] += 1
        return out

    step = torch.optim.AdamW.step
    monkeypatch.setattr(GPT, "forward", poisoning_forward)
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: (stepped.append(calls[0] - 1),
                                                                          step(self, *a, **k))[1])
    result = train.train(*configs(tmp_path, tiny_corpus, max_iters=6, eval_interval=100))
    assert stepped == [0, 1, 4, 5]  # no optimizer update on the poisoned steps
    out = capsys.readouterr().out
    assert "step 2: non-finite loss, step skipped (1 in a row, 1 in all)" in out
    assert "step 3: non-finite loss, step skipped (2 in a row, 2 in all)" in out
    summary = json.load(open(tmp_path / "out" / "train_summary.json"))
    assert summary["nonfinite_steps"] == 2 and summary["complete"] and math.isfinite(result["val_loss"])


def test_a_diverging_run_stops_and_keeps_its_last_good_checkpoints(tmp_path, tiny_corpus, capsys):
    with pytest.raises(TrainingStopped, match="diverged: 4 non-finite steps in a row.*lower learning_rate"):
        train.train(*configs(tmp_path, tiny_corpus, max_iters=200, eval_interval=2, learning_rate=1e3,
                             warmup_iters=1, max_nonfinite_steps=4))
    out_dir = tmp_path / "out"
    latest = checkpoint.load_checkpoint(str(out_dir / "ckpt.pt"), "cpu")
    best = checkpoint.load_checkpoint(str(out_dir / checkpoint.BEST_NAME), "cpu")
    for ckpt in (latest, best):
        assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert best["iter_num"] == 0 and best["best_val_loss"] < 6  # the untrained model was the best one
    assert latest["iter_num"] < 200


def test_a_diverged_runs_summary_counts_its_non_finite_steps(tmp_path, tiny_corpus, monkeypatch, capsys):
    """The summary of the last evaluation said nonfinite_steps: 0 after a run the log said skipped 2 and stopped."""
    forward, calls = GPT.forward, [0]

    def poisoning_forward(self, idx, targets=None, *args, **kwargs):
        out = forward(self, idx, targets, *args, **kwargs)
        if self.training:
            calls[0] += 1
            if calls[0] > 2:  # every step from step 2 on
                out.lm_loss = out.lm_loss * float("nan")
        return out

    monkeypatch.setattr(GPT, "forward", poisoning_forward)
    with pytest.raises(TrainingStopped, match="diverged: 2 non-finite steps in a row at step 3"):
        train.train(*configs(tmp_path, tiny_corpus, max_iters=10, eval_interval=100, max_nonfinite_steps=2))
    assert "(2 in a row, 2 in all)" in capsys.readouterr().out
    summary = json.load(open(tmp_path / "out" / "train_summary.json"))
    assert summary["nonfinite_steps"] == 2 and summary["iter_num"] == 3 and not summary["complete"]


def test_a_full_disk_at_a_checkpoint_stops_training_in_one_line_and_keeps_the_earlier_one(tmp_path, tiny_corpus,
                                                                                          monkeypatch):
    """torch's writer ended the run with a multi-line traceback."""
    save, saves = torch.save, []

    def filling(obj, f, *args, **kwargs):
        saves.append(obj["iter_num"])
        if len(saves) > 1:  # the disk fills after the first checkpoint
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", filling)
    tcfg, mcfg = configs(tmp_path, tiny_corpus, max_iters=6, eval_interval=3)
    with pytest.raises(SystemExit) as e:
        run_main(lambda argv: train.train(tcfg, mcfg), [])
    path = str(tmp_path / "out" / "ckpt.pt")
    assert e.value.code == (f"error: the disk is full (No space left on device): cannot write {path}; the previous "
                            f"{path} is intact; free space in {tmp_path / 'out'} and run again")
    monkeypatch.undo()
    assert saves == [0, 3] and checkpoint.load_checkpoint(path, "cpu")["iter_num"] == 0


def test_a_non_finite_val_loss_writes_no_checkpoint(tmp_path, tiny_corpus, monkeypatch, capsys):
    train.train(*configs(tmp_path, tiny_corpus, max_iters=3))
    before = weights(tmp_path / "out" / "ckpt.pt")
    evaluate = train.evaluate_losses

    def diverged(*args, **kwargs):
        losses, stats = evaluate(*args, **kwargs)
        return {**losses, "val_loss": float("nan")}, stats

    monkeypatch.setattr(train, "evaluate_losses", diverged)
    train.train(*configs(tmp_path, tiny_corpus, max_iters=6, init_from="resume"))
    assert "val loss is not finite" in capsys.readouterr().out
    after = checkpoint.load_checkpoint(str(tmp_path / "out"), "cpu")
    assert after["iter_num"] == 3 and all(torch.equal(after["model"][k], v) for k, v in before.items())


def test_the_best_checkpoint_is_kept_and_a_corrupt_latest_falls_back_to_it(tmp_path, tiny_corpus, capsys):
    train.train(*configs(tmp_path, tiny_corpus, max_iters=6))
    out_dir = tmp_path / "out"
    latest = checkpoint.load_checkpoint(str(out_dir / "ckpt.pt"), "cpu")
    best = checkpoint.load_checkpoint(str(out_dir / checkpoint.BEST_NAME), "cpu")
    losses = dict((step, loss) for step, loss in latest["val_history"])
    assert best["best_val_loss"] == min(losses.values()) and losses[best["iter_num"]] == best["best_val_loss"]
    (out_dir / "ckpt.pt").write_bytes(b"half a checkpoint")
    train.train(*configs(tmp_path, tiny_corpus, max_iters=8, init_from="resume"))
    err = capsys.readouterr().err
    assert "corrupt" in err and checkpoint.BEST_NAME in err and f"step {best['iter_num']}" in err
    assert checkpoint.load_checkpoint(str(out_dir / "ckpt.pt"), "cpu")["iter_num"] == 8


def test_sigterm_saves_the_current_step_and_resuming_continues_exactly(tmp_path, tiny_corpus):
    common = [f"--data_dir={tiny_corpus}", *TINY, "--lr_decay_iters=1000", "--eval_interval=1000",
              "--log_interval=1", "--routing='random'", "--dropout=0.1", "--p_dense=0.3", "--progress_bar=False"]
    stopped = tmp_path / "stopped"
    with Script("train.py", "configs/quickstart.py", *common, "--max_iters=100000", f"--out_dir={stopped}") as proc:
        proc.wait_for("iter 3:")  # it trains
        proc.send_signal(signal.SIGTERM)
        returncode, out, err = proc.finish()
    assert returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and err.strip().startswith("stopped by SIGTERM: saved")
    step = checkpoint.load_checkpoint(str(stopped), "cpu")["iter_num"]
    assert f"at step {step};" in err and step >= 3
    resumed = run_script("train.py", "configs/quickstart.py", *common, f"--max_iters={step + 3}", f"--out_dir={stopped}",
                  "--init_from=resume")
    straight = run_script("train.py", "configs/quickstart.py", *common, f"--max_iters={step + 3}",
                   f"--out_dir={tmp_path / 'straight'}")
    assert resumed.returncode == 0 and straight.returncode == 0, resumed.stderr + straight.stderr
    a, b = weights(stopped / "ckpt.pt"), weights(tmp_path / "straight" / "ckpt.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_run_stopped_before_its_first_evaluation_says_where_it_stopped(tmp_path, tiny_corpus):
    """The resumed run had no evaluation of its own, so its signal wrote no summary: the grid's dry run said
    "will resume from step 400" of a run saved at step 461."""
    common = [f"--data_dir={tiny_corpus}", *TINY, "--lr_decay_iters=1000", "--eval_interval=1000",
              "--log_interval=1", "--progress_bar=False", "--max_iters=100000", f"--out_dir={tmp_path}"]
    steps = []
    for extra in ([], ["--init_from=resume"]):
        after = steps[-1] + 3 if steps else 3
        with Script("train.py", "configs/quickstart.py", *common, *extra) as proc:
            proc.wait_for(f"iter {after}:")
            proc.send_signal(signal.SIGTERM)
            returncode, _, err = proc.finish()
        assert returncode == 128 + signal.SIGTERM, err
        steps.append(checkpoint.load_checkpoint(str(tmp_path), "cpu")["iter_num"])
        summary = json.load(open(tmp_path / "train_summary.json"))
        assert summary["iter_num"] == steps[-1] and summary["val_history"][0][0] == 0, (steps, summary["iter_num"])
    assert steps[1] >= steps[0] + 3


def test_sigint_saves_and_exits_with_130(tmp_path, tiny_corpus):
    with Script("train.py", "configs/quickstart.py", f"--data_dir={tiny_corpus}", *TINY, "--max_iters=100000",
                "--log_interval=1", f"--out_dir={tmp_path}", "--progress_bar=False") as proc:
        proc.wait_for("iter 2:")
        proc.send_signal(signal.SIGINT)
        returncode, out, err = proc.finish()
    assert returncode == 130 and "stopped by SIGINT: saved" in err and "Traceback" not in err
    assert checkpoint.load_checkpoint(str(tmp_path), "cpu")["iter_num"] >= 2


def test_scripts_end_expected_errors_with_one_line(tmp_path, tiny_corpus):
    cases = [("train.py", "configs/quickstart.py", f"--data_dir={tiny_corpus}", f"--out_dir={tmp_path}",
              "--init_from=resume"),
             ("train.py", "configs/quickstart.py", "--batch_size=0"),
             ("sample.py", f"--out_dir={tmp_path / 'nothing'}"),
             ("sample.py", "--top_k=0"),
             ("evaluate.py", str(tmp_path / "nothing")),
             ("data/python_stdlib/prepare.py", "--num_proc=0")]
    for args in cases:
        result = run_script(*args)
        assert result.returncode != 0 and "Traceback" not in result.stderr, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert "error" in lines[-1] and (len(lines) == 1 or lines[0].startswith("usage:")), (args, lines)
    assert "no checkpoint at" in run_script(*cases[0]).stderr


def test_resuming_on_other_data_is_refused(tmp_path, tiny_corpus):
    train.train(*configs(tmp_path, tiny_corpus, max_iters=3))
    other = tmp_path / "other"
    other.mkdir()
    for split in ("train", "val"):
        data = np.fromfile(tiny_corpus / f"{split}.bin", dtype=np.uint16)
        write_tokens(str(other), split, [data[: len(data) // 2 + 1]], np.uint16, 0)
    write_meta(str(other), {"encoding": "bytes", "vocab_size": 256, "dtype": "uint16", "eot_token": 0})
    with pytest.raises(ValueError, match="trained on other data.*train_tokens"):
        train.train(*configs(tmp_path, other, max_iters=6, init_from="resume"))


def test_float16_trains_with_a_gradient_scaler_and_resumes_it(tmp_path, tiny_corpus):
    train.train(*configs(tmp_path, tiny_corpus, max_iters=3, n_layer=1, dtype="float16"))
    ckpt = checkpoint.load_checkpoint(str(tmp_path / "out"), "cpu")
    assert ckpt["scaler"] is not None and ckpt["scaler"]["scale"] > 0
    result = train.train(*configs(tmp_path, tiny_corpus, max_iters=4, n_layer=1, dtype="float16",
                                  init_from="resume"))
    assert math.isfinite(result["val_loss"])


def test_a_resumed_run_that_diverges_names_the_checkpoints_its_folder_holds(tmp_path, tiny_corpus):
    train.train(*configs(tmp_path, tiny_corpus, max_iters=2, eval_interval=2))
    history = json.load(open(tmp_path / "out" / "train_summary.json"))["val_history"]
    best_step = min(history, key=lambda entry: entry[1])[0]
    with pytest.raises(TrainingStopped) as stopped:
        train.train(*configs(tmp_path, tiny_corpus, max_iters=200, eval_interval=100, learning_rate=1e3,
                             warmup_iters=1, max_nonfinite_steps=3, init_from="resume"))
    message = str(stopped.value)
    assert "None" not in message and "ckpt.pt holds step 2 and " in message, message
    assert f"{checkpoint.BEST_NAME} holds step {best_step} (val loss" in message, message


def test_resuming_at_an_evaluations_step_records_it_once(tmp_path, tiny_corpus):
    train.train(*configs(tmp_path, tiny_corpus, max_iters=4, eval_interval=2))
    train.train(*configs(tmp_path, tiny_corpus, max_iters=6, eval_interval=2, init_from="resume"))
    summary = json.load(open(tmp_path / "out" / "train_summary.json"))
    assert [step for step, _ in summary["val_history"]] == [0, 2, 4, 6]
