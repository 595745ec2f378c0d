"""Does a finished DDP run exit 0 every time? Runs the same short 2-process training (torchrun, gloo on the CPU)
again and again and counts the exit statuses: a rare abort at exit shows only over many runs.

    python bench/ddp_exit.py --runs=30            # 30 runs in a row; exit status 0 only if every one exited 0
    python bench/ddp_exit.py --runs=30 --nproc=2 --max_iters=6 --extra="--routing='random' --p_dense=0.3"

Each run trains a tiny model on a small byte corpus written to a temporary folder, in a fresh out_dir, and must
leave a complete checkpoint. Prints one line per run (exit status, seconds, the last stderr line of a failure)
and the count.
"""
import argparse
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from data.tokens import write_meta, write_tokens  # noqa: E402

TINY = ["--block_size=32", "--window=8", "--n_layer=2", "--n_head=2", "--n_embd=32", "--batch_size=2",
        "--eval_iters=1", "--eval_interval=3", "--log_interval=1", "--warmup_iters=2", "--device=cpu"]


def write_corpus(path):
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(0)
    lines = [f"def f{i}(x):\n    return x + {i}\n" for i in range(40)]
    docs = ["".join(rng.choice(lines, 30)) for _ in range(12)]
    for split, part in (("train", docs[:10]), ("val", docs[10:])):
        write_tokens(path, split, (np.frombuffer(d.encode(), dtype=np.uint8) for d in part), np.uint16, 0)
    write_meta(path, {"encoding": "bytes", "vocab_size": 256, "dtype": "uint16", "eot_token": 0})


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(corpus, out_dir, nproc, max_iters, extra, timeout):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "train.py", "configs/quickstart.py",
           f"--data_dir={corpus}", f"--out_dir={out_dir}", f"--max_iters={max_iters}", *TINY, *extra]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - start, f"ran past {timeout} s"
    complete = os.path.exists(os.path.join(out_dir, "ckpt.pt"))
    lines = done.stderr.strip().splitlines()
    # torchrun ends with a summary table: the rank's own lines say what happened (an abort, a signal, an error)
    told = [line.strip() for line in lines if any(k in line for k in ("terminate", "exitcode", "Error", "error:"))]
    last = "; ".join(told[:3]) or (lines or [""])[-1]
    note = "" if done.returncode == 0 and complete else (last if complete else f"no checkpoint; {last}")
    return done.returncode, time.perf_counter() - start, note


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--max_iters", type=int, default=6)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    parser.add_argument("--extra", default="", help="more train.py settings, e.g. \"--routing='random'\"")
    args = parser.parse_args()
    if args.runs < 1 or args.nproc < 1 or args.max_iters < 1:
        parser.error("--runs, --nproc and --max_iters must be at least 1")
    clean = 0
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus")
        write_corpus(corpus)
        for i in range(args.runs):
            code, seconds, note = one_run(corpus, os.path.join(tmp, f"run{i}"), args.nproc, args.max_iters,
                                          shlex.split(args.extra), args.timeout)
            clean += code == 0 and not note
            print(f"run {i + 1}/{args.runs}: exit {code} in {seconds:.1f} s{'; ' + note if note else ''}",
                  flush=True)
    print(f"{clean} of {args.runs} runs of {args.nproc} processes exited 0 with a complete checkpoint")
    sys.exit(0 if clean == args.runs else 1)


if __name__ == "__main__":
    main()
