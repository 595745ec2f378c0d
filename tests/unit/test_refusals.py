"""What the scripts refuse, each in one line that names the problem and the fix, and before any work: another
run's files in prune's out_dir, a PyTorch file that is not a checkpoint, outputs that cannot be written, a
batch size of 0, a key window no target lies beyond; a full disk while saving a checkpoint; settings whose
advice or effect was not true."""
import errno
import json
import os

import pytest
import torch

import evaluate
import probe
import prune
import sample
import train
from helpers import CPU_FP32, flags, train_configs
from model import GPTConfig
from nanoaha import checkpoint
from nanoaha.configurator import ConfigError, parse_args, run_main
from nanoaha.evaluation import evaluate_checkpoint
from nanoaha.train_config import TrainConfig, check_config
from test_evaluate import untrained_checkpoint

FAST = ["--eval_tokens=64", "--batch_size=2", "--device=cpu"]


def one_line_exit(main, argv):
    """The message a script's main ends with (SystemExit), asserted to be one line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    message = str(e.value.code)
    assert message and "\n" not in message and message != "0", message
    return message


def test_prune_refuses_an_out_dir_with_another_runs_best_checkpoint_and_summary(tmp_path, prepared_corpus):
    """Without a ckpt.pt there, prune deleted the other run's ckpt_best.pt and train_summary.json, exit 0."""
    source = untrained_checkpoint(tmp_path / "source", prepared_corpus, schedule="R")
    other = tmp_path / "other"
    other.mkdir()
    for name in ("ckpt_best.pt", "train_summary.json"):
        (other / name).write_text("another run's")
    message = one_line_exit(prune.main, [source, f"--out_dir={other}", *FAST])
    assert str(other / "ckpt_best.pt") in message and str(other / "train_summary.json") in message
    assert "--overwrite" in message
    assert sorted(os.listdir(other)) == ["ckpt_best.pt", "train_summary.json"]  # nothing deleted, nothing written
    prune.main([source, f"--out_dir={other}", *FAST, "--overwrite"])
    assert sorted(os.listdir(other)) == ["ckpt.pt"]


@pytest.fixture
def not_a_checkpoint(tmp_path):
    path = tmp_path / "foo" / "ckpt.pt"
    path.parent.mkdir()
    torch.save({"foo": 1}, path)
    return path


def test_a_pytorch_file_that_is_not_a_checkpoint_is_named_by_every_script(tmp_path, not_a_checkpoint,
                                                                          prepared_corpus):
    """Each script failed with a KeyError traceback ('model_config', 'train_config', ...)."""
    expected = f"{not_a_checkpoint} is not a nanoAHA checkpoint"
    with pytest.raises(ValueError, match=expected):
        checkpoint.load_checkpoint(str(not_a_checkpoint), "cpu")
    assert expected in one_line_exit(evaluate.main, [str(not_a_checkpoint), "--device=cpu"])
    assert expected in one_line_exit(prune.main, [str(not_a_checkpoint), f"--out_dir={tmp_path / 'p'}", *FAST])
    assert expected in one_line_exit(lambda argv: run_main(probe.main, argv),
                                     [str(not_a_checkpoint), f"--data_dir={prepared_corpus}", "--device=cpu"])
    assert expected in one_line_exit(lambda argv: run_main(sample.main, argv),
                                     [f"--out_dir={not_a_checkpoint.parent}", "--device=cpu"])
    tiny = ["--block_size=32", "--window=8", "--n_layer=1", "--n_embd=32", "--n_head=2", "--tensorboard=False",
            f"--data_dir={prepared_corpus}", *flags(CPU_FP32)]
    for argv in ([f"--out_dir={tmp_path / 'new'}", f"--init_from={not_a_checkpoint}"],
                 [f"--out_dir={not_a_checkpoint.parent}", "--init_from=resume"]):
        assert expected in one_line_exit(lambda argv: run_main(train.main, argv), tiny + argv)


def test_outputs_that_cannot_be_written_are_refused_before_any_work(tmp_path, prepared_corpus, monkeypatch):
    """evaluate.py and prune.py --out_dir=FILE failed with FileExistsError after all the work; probe.py --out=
    a missing folder or a folder failed as late."""
    run = untrained_checkpoint(tmp_path / "run", prepared_corpus, schedule="R")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    monkeypatch.setattr(torch.nn.Module, "__call__", lambda *a, **k: pytest.fail("a model ran before the refusal"))
    assert f"--out_dir={a_file} is a file" in one_line_exit(evaluate.main, [run, f"--out_dir={a_file}", *FAST])
    assert f"--out_dir={a_file} is a file" in one_line_exit(prune.main, [run, f"--out_dir={a_file}", *FAST])
    message = one_line_exit(lambda argv: run_main(probe.main, argv), [run, f"--out={tmp_path}", "--device=cpu"])
    assert f"--out={tmp_path} is a folder: name a JSON file" in message
    monkeypatch.undo()
    out = tmp_path / "missing" / "probe.json"  # a folder that does not exist yet is created
    probe.main([run, f"--out={out}", f"--data_dir={prepared_corpus}", "--device=cpu", "--span=16", "--n_spans=2"])
    assert len(json.load(open(out))) == 1


@pytest.mark.parametrize("batch_size", [0, -2])
def test_probe_refuses_a_batch_size_below_1_as_evaluate_and_prune_do(tmp_path, batch_size):
    """probe.py --batch_size=0 ended in a RuntimeError traceback from torch."""
    message = one_line_exit(lambda argv: run_main(probe.main, argv), [str(tmp_path), f"--batch_size={batch_size}"])
    assert message == f"config error: batch_size={batch_size} must be at least 1"


def test_a_key_window_no_target_lies_beyond_is_refused_and_no_key_tokens_say_why(tmp_path, prepared_corpus):
    """key_window >= block_size, or a key_k no window can match, gave 0% key tokens without a word."""
    run = untrained_checkpoint(tmp_path / "run", prepared_corpus)  # block_size 32, window 8
    message = one_line_exit(evaluate.main, [run, "--key_window=32", "--thresholds=()", *FAST])
    assert "key_window=32 is not below the block_size=32" in message and "--key_window" in message
    lines = []
    result = evaluate_checkpoint(run, eval_tokens=64, batch_size=2, thresholds=[], key_k=30, log=lines.append)
    assert result["key_frac"] == 0 and result["key_loss"] is None
    [note] = [line for line in lines if "no key tokens" in line]
    assert note == ("note: no key tokens (k 30, window 8): a key token needs k + window < block_size, and "
                    "30 + 8 >= 32; a smaller --key_k or --key_window finds some")
    lines.clear()  # the corpus' lines repeat every ~28 bytes: in windows of 32, no 8-gram recurs 9 or more back
    evaluate_checkpoint(run, eval_tokens=64, batch_size=2, thresholds=[], log=lines.append)
    assert "note: no key tokens (k 8, window 8): no 8-token sequence of a window recurs" in "\n".join(lines)
    lines.clear()
    result = evaluate_checkpoint(run, eval_tokens=64, batch_size=2, thresholds=[], key_k=2, log=lines.append)
    assert result["key_frac"] > 0 and not any("no key tokens" in line for line in lines)


def test_router_local_iters_with_sparse_mode_accepts_the_advice_it_gives(tmp_path):
    """The refusal advised 'sparse_from_iter after the held steps', which the same check then refused."""
    def check(**values):
        check_config(*train_configs({"schedule": "R", "router_local_iters": 2, **values}))

    with pytest.raises(ValueError, match="use routed_mode='exact' or 'sampled', or sparse_from_iter=2 or later") \
            as e:
        check(routed_mode="sparse", sparse_from_iter=1)
    assert "\n" not in str(e.value)
    check(routed_mode="sampled")  # its exact sequences give the held routers both attentions
    check(routed_mode="sparse", sparse_from_iter=2)  # exact through the held steps 0 and 1
    check(routed_mode="sparse", sparse_from_iter=5)


@pytest.mark.parametrize("schedule", ["L", "G", "LG"])
def test_router_per_token_false_without_a_routed_layer_is_refused(schedule):
    """It was accepted silently: there is no routed layer for it to change."""
    with pytest.raises(ValueError, match=f"router_per_token=False .* schedule='{schedule}' has none"):
        check_config(*parse_args([f"--schedule={schedule!r}", "--router_per_token=False"], TrainConfig, GPTConfig))
    check_config(*parse_args(["--schedule='LR'", "--router_per_token=False"], TrainConfig, GPTConfig))
    check_config(*parse_args(["--schedule='LR'", "--router_per_token=False", "--routing='random'"], TrainConfig,
                             GPTConfig))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_while_saving_a_checkpoint_is_one_line_and_keeps_the_previous_one(tmp_path, monkeypatch,
                                                                                      capsys, code):
    """torch's own writer failed with a multi-line traceback (the earlier checkpoint survived)."""
    path, best = str(tmp_path / "ckpt.pt"), str(tmp_path / checkpoint.BEST_NAME)
    state = {"model": {}, "model_config": {}, "iter_num": 1}
    checkpoint.save_checkpoint(path, state)
    checkpoint.save_best(path, best)
    before = open(path, "rb").read()

    def full(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(SystemExit) as e:
        run_main(lambda argv: checkpoint.save_checkpoint(path, {**state, "iter_num": 2}), [])
    assert e.value.code == (f"error: the disk is full ({os.strerror(code)}): cannot write {path}; the previous "
                            f"{path} is intact; free space in {tmp_path} and run again")
    assert open(path, "rb").read() == before and sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ckpt_best.pt"]
    with pytest.raises(checkpoint.DiskFull, match=f"cannot write {tmp_path / 'new.pt'}; no .*new.pt was written"):
        checkpoint.save_checkpoint(str(tmp_path / "new.pt"), state)
    monkeypatch.setattr(checkpoint.shutil, "copyfile", lambda *a: full(None, open(a[1], "wb")))
    with pytest.raises(checkpoint.DiskFull, match=f"cannot write {best}; the previous {best} is intact"):
        checkpoint.save_best(path, best)
    monkeypatch.undo()
    assert checkpoint.load_checkpoint(best, "cpu")["iter_num"] == 1


@pytest.mark.parametrize("values, expected", [
    ({"routed_mode": "dense"}, "routed_mode='dense': use 'exact', 'sparse' or 'sampled'"),
    ({"routed_mode": "sampled", "routed_exact_frac": 0.0}, r"routed_exact_frac=0.0 must be a fraction in \(0, 1\]"),
    ({"routed_mode": "sampled", "routed_exact_frac": 1.5}, r"routed_exact_frac=1.5 must be a fraction in \(0, 1\]"),
])
def test_a_routed_mode_that_cannot_run_is_refused_in_one_line(values, expected):
    with pytest.raises(ValueError, match=expected) as e:
        GPTConfig(schedule="R", **values)
    assert "\n" not in str(e.value)
