"""Where a training step's time goes, by op: tokens/s of the quick-start shape and the ops that took the most
self time in one profiled step (forward, backward, AdamW), for each layer kind and precision asked.

    python bench/step_profile.py                                  # G, L, R in fp32 and bf16, one thread
    python bench/step_profile.py --kinds R --dtypes bf16 --rows 20 --threads 2

Layer kinds are schedules (G dense, L local, R routed in `--routed_mode`); bf16 runs under CPU autocast, as
train.py's dtype="bfloat16" does. Times are of this machine and moment: compare rows of one run, not runs.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig  # noqa: E402
from nanoaha.train_config import TrainConfig  # noqa: E402
from nanoaha.training import configure_optimizer  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def profile(schedule, dtype, args):
    """(tokens/s over args.steps timed steps, the profiler's op table of one more step)."""
    config = GPTConfig(vocab_size=256, block_size=args.block_size, n_layer=4, n_head=args.n_head, n_embd=128,
                       window=32, schedule=schedule, routed_mode=args.routed_mode, attention_backend="torch")
    torch.manual_seed(0)
    model = GPT(config)
    optimizer = configure_optimizer(model, TrainConfig(), "cpu")
    x = torch.randint(config.vocab_size, (args.batch_size, config.block_size))

    def step():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = model(x, x).lm_loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):  # warm-up: allocator, first-call dispatch
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = (time.perf_counter() - start) / args.steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60)
    return args.batch_size * config.block_size / seconds, table


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", nargs="+", default=["G", "L", "R"], help="schedules to profile")
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    parser.add_argument("--routed_mode", default="exact", choices=["exact", "sparse"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--rows", type=int, default=8, help="ops listed per profile")
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--block_size", type=int, default=1024)
    parser.add_argument("--n_head", type=int, default=4, help="heads of the 128-wide layers (head dim 128 / n_head)")
    args = parser.parse_args()
    if min(args.threads, args.steps, args.rows, args.batch_size, args.block_size, args.n_head) < 1:
        parser.error("--threads, --steps, --rows, --batch_size, --block_size and --n_head must be at least 1")
    if 128 % args.n_head:
        parser.error(f"--n_head={args.n_head} must divide the width, 128")
    if set("".join(args.kinds)) - set("GLR"):
        parser.error("--kinds are schedules of the letters G, L, R")
    torch.set_num_threads(args.threads)
    for kind in args.kinds:
        for name in args.dtypes:
            tokens_per_s, table = profile(kind, DTYPES[name], args)
            print(f"\n{kind} {name} ({args.threads} thread(s), head dim {128 // args.n_head}): "
                  f"{tokens_per_s:,.0f} tok/s\n{table}", flush=True)


if __name__ == "__main__":
    main()
