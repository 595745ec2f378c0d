"""DDP on the CPU with gloo: ranks agree with one process, resume exactly, and another world size continues as
documented (the data order is kept when the global batch is; per-rank RNGs are re-seeded)."""
import os
import shutil
import socket
import subprocess
import sys

import torch

import train
from helpers import CPU_FP32, ROOT, flags, run_in_own_session
from model import GPTConfig
from nanoaha import checkpoint
from nanoaha.configurator import parse_args
from nanoaha.train_config import TrainConfig

TINY = {"block_size": 32, "window": 8, "n_layer": 2, "n_head": 2, "n_embd": 32, "batch_size": 2, "eval_iters": 1,
        "eval_interval": 3, "log_interval": 1, "warmup_iters": 2, "lr_decay_iters": 6, "learning_rate": 3e-3,
        "router_lambda_ramp": 2, "tensorboard": False, "progress_bar": False, **CPU_FP32}


def args(corpus, out_dir, **overrides):
    values = {"data_dir": str(corpus), "out_dir": str(out_dir), **TINY, **overrides}
    return flags(values)


def torchrun(corpus, out_dir, nproc=2, **overrides):
    with socket.socket() as s:  # a free loopback port for the rendezvous, on the loopback interface only
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_in_own_session([sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
                                 f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1", f"--master_port={port}",
                                 "train.py", *args(corpus, out_dir, **overrides)], timeout=300,
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout[-1000:] + result.stderr[-3000:]
    assert f"{nproc} process(es)" in result.stdout
    return result


def in_process(corpus, out_dir, **overrides):
    return train.train(*parse_args(args(corpus, out_dir, **overrides), TrainConfig, GPTConfig))


def weights(out_dir):
    return checkpoint.load_checkpoint(str(out_dir), "cpu")["model"]


def assert_close(a, b, exact=False):
    for key in a:
        if exact:
            assert torch.equal(a[key], b[key]), key
        else:
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)


def test_two_ranks_match_one_process_with_two_micro_steps_and_another_world_size_resumes(tmp_path, tiny_corpus):
    # forced-global steps drawn per rank would make the ranks disagree, and the result differ from one process
    two = tmp_path / "two_ranks"
    result = torchrun(tiny_corpus, two, max_iters=6, p_dense=0.5)
    assert "iter 6: loss" in result.stdout and "[forced global]" in result.stdout
    one = tmp_path / "one_rank"
    in_process(tiny_corpus, one, max_iters=6, grad_accum=2, p_dense=0.5)
    assert_close(weights(two), weights(one))
    # stop the 2-rank run at step 3, resume it in one process with the same global batch: the data continues
    half = tmp_path / "half"
    torchrun(tiny_corpus, half, max_iters=3, p_dense=0.5)
    in_process(tiny_corpus, half, max_iters=6, grad_accum=2, init_from="resume", p_dense=0.5)
    assert_close(weights(half), weights(two))


def test_ddp_resume_is_exact_with_random_routing_dropout_and_forced_global_steps(tmp_path, tiny_corpus):
    common = {"routing": "random", "dropout": 0.1, "p_dense": 0.4}
    straight = tmp_path / "straight"
    torchrun(tiny_corpus, straight, max_iters=6, **common)
    resumed = tmp_path / "resumed"
    torchrun(tiny_corpus, resumed, max_iters=3, **common)
    saved = checkpoint.load_checkpoint(str(resumed), "cpu")["rng"]
    assert len(saved["torch"]) == 2 and not torch.equal(saved["torch"][0], saved["torch"][1])
    torchrun(tiny_corpus, resumed, max_iters=6, init_from="resume", **common)
    assert_close(weights(resumed), weights(straight), exact=True)
    # another world size: per-rank RNG states cannot be matched to ranks, so they are re-seeded, and it says so
    shutil.rmtree(resumed)
    torchrun(tiny_corpus, resumed, max_iters=3, **common)
    three = torchrun(tiny_corpus, resumed, nproc=3, max_iters=6, init_from="resume", **common)
    assert "resuming a run of 2 process(es) with 3: random routing and dropout are re-seeded" in three.stdout
    assert "the data order changes: the global batch is now 6 windows (was 4)" in three.stdout
    assert checkpoint.load_checkpoint(str(resumed), "cpu")["iter_num"] == 6
