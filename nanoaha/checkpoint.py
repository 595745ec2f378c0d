"""Checkpoints: written atomically, read with clear errors, loaded into a model with a shape check, and a model
built from one. train.py, sample.py, evaluate.py and prune.py all go through here.

A checkpoint is a dict: model (state dict), optimizer, model_config, train_config, dtype (the precision it trained
in), iter_num, best_val_loss, val/key/head/copy/decision_history (every evaluation's), commit_history,
commit_streak and commit_recent (router_commit_after, router_commit_by_iter), train_wall_s (seconds of training
behind it, summed over the processes that trained it), attention_flop_sums (ideal and computed attention FLOPs
summed over the logged steps, and their count), last_eval (the latest evaluation's losses and routing),
router_lambda_state, data_meta (the corpus' meta.json) and rng (every RNG state, for exact resume). A run folder
holds the latest (ckpt.pt) and the one with the best val loss (ckpt_best.pt). Its format version and the
migrations of older ones: nanoaha/formats.py.
"""
import errno
import os
import shutil
import sys

import torch

from data.atomic_files import atomic_write
from model import GPT, GPTConfig
from nanoaha.formats import stamp, upgrade

def checkpoint_path(path):
    """A run's folder or a checkpoint file -> the file."""
    return os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path


def save_checkpoint(path, state):
    def write(tmp):
        with open(tmp, "wb") as f:  # through Python's file: a full disk is an OSError, not torch's multi-line one
            torch.save(stamp("checkpoint", state), f)
    written(path, lambda: atomic_write(path, write))


class DiskFull(OSError):
    """A file that did not fit on the disk (or in the quota): run_main ends with its one line."""


def written(path, write):
    """write(), which writes path atomically; a full disk ends in one line that says so, where, and that the
    previous file at path (untouched: the write went to a temporary file) is intact."""
    try:
        write()
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        kept = f"the previous {path} is intact" if os.path.exists(path) else f"no {path} was written"
        raise DiskFull(f"the disk is full ({e.strerror}): cannot write {path}; {kept}; free space in "
                       f"{os.path.dirname(os.path.abspath(path))} and run again") from None


BEST_NAME = "ckpt_best.pt"


def save_best(path, best_path):
    """Copy the checkpoint at path to best_path, atomically. A copy, not a hard link: damage to one file's
    blocks must leave the other readable."""
    written(best_path, lambda: atomic_write(best_path, lambda tmp: shutil.copyfile(path, tmp)))


def load_resume_checkpoint(out_dir, device):
    """The checkpoint to resume from: out_dir/ckpt.pt, or, if that one is corrupt, the best one with a warning
    naming both files. (path, checkpoint)."""
    path, best = os.path.join(out_dir, "ckpt.pt"), os.path.join(out_dir, BEST_NAME)
    try:
        return path, load_checkpoint(path, device)
    except ValueError as e:
        if not os.path.exists(best):
            raise
        ckpt = load_checkpoint(best, device)
        print(f"WARNING: {e}; resuming from {best} (step {ckpt['iter_num']}) instead", file=sys.stderr)
        return best, ckpt


CHECKPOINT_KEYS = ("model", "model_config")  # in every checkpoint, since the first (pruned ones too)


def load_checkpoint(path, device):
    path = checkpoint_path(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}: train one first (python train.py configs/NAME.py)")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:
        raise ValueError(f"checkpoint {path} cannot be read ({e}); it is corrupt or not a nanoAHA checkpoint") from None
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or key not in ckpt]
    if missing:  # a PyTorch file of something else: its readers would fail on a KeyError
        raise ValueError(f"{path} is not a nanoAHA checkpoint (a PyTorch file without {' or '.join(missing)}): "
                         f"name a ckpt.pt that train.py or prune.py wrote")
    return upgrade("checkpoint", ckpt, path)


def load_model_state(model, state_dict, source, allow_new_routers=False):
    """Load weights, failing with a clear message when the shapes belong to another model.
    allow_new_routers: a dense or local checkpoint fine-tuned into a routed model; its routers start fresh."""
    own = model.state_dict()
    for key, value in state_dict.items():
        if key in own and own[key].shape != value.shape:
            raise ValueError(f"checkpoint {source} has {key} of shape {tuple(value.shape)}, this model "
                             f"{tuple(own[key].shape)}: the checkpoint is from another model shape")
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if allow_new_routers:
        missing = [k for k in missing if ".router." not in k]
        unexpected = [k for k in unexpected if ".router." not in k]
    if missing or unexpected:
        raise ValueError(f"checkpoint {source} does not match this model: missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}")


def load_model(path, device, router_threshold=None):
    """The model a checkpoint holds, in eval mode on `device`, and the checkpoint's data meta.
    router_threshold: the model is built with this threshold instead of the trained one (a speed/quality
    trade-off at inference)."""
    ckpt = load_checkpoint(path, device)
    overrides = {} if router_threshold is None else {"router_threshold": router_threshold}
    model = GPT(GPTConfig(**{**ckpt["model_config"], **overrides}))
    load_model_state(model, ckpt["model"], checkpoint_path(path))
    return model.to(device).eval(), ckpt["data_meta"]
