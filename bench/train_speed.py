"""End-to-end training throughput: the same model with dense vs routed (sparse mode) vs local attention.

    python bench/train_speed.py                    # GPU: 12 layers, 768 wide, T=8192, w=256
    python bench/train_speed.py --quick            # CPU smoke run at toy size

Routed layers use random routing at rate --global_frac so that the sparsity is the one asked for from the
first step (a fresh learned router starts all-global); the kernels' cost depends only on the gate pattern.
Prints tokens/s per variant, measured in one run, and the ratio to dense.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig  # noqa: E402
from nanoaha.formatting import percent  # noqa: E402
from nanoaha.train_config import TrainConfig  # noqa: E402
from nanoaha.training import configure_optimizer  # noqa: E402


def tokens_per_second(config, batch_size, steps, warmup, device, dtype):
    torch.manual_seed(0)
    model = GPT(config).to(device)
    optimizer = configure_optimizer(model, TrainConfig(), "cuda" if device == "cuda" else "cpu")
    x = torch.randint(config.vocab_size, (batch_size, config.block_size), device=device)
    autocast = torch.autocast("cuda" if device == "cuda" else "cpu", dtype=dtype, enabled=dtype != torch.float32)
    for step in range(warmup + steps):
        if step == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        with autocast:
            loss = model(x, x).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return steps * batch_size * config.block_size / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--global_frac", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        shape = dict(n_layer=2, n_head=4, n_embd=128, block_size=1024, window=64, vocab_size=256)
        batch_size, steps, warmup, dtype = 2, 3, 1, torch.float32
    else:
        shape = dict(n_layer=12, n_head=12, n_embd=768, block_size=8192, window=256, vocab_size=50304)
        batch_size, steps, warmup, dtype = 1, args.steps, 3, torch.bfloat16
    variants = {
        "dense (G)": dict(schedule="G"),
        f"routed (R, sparse, {percent(args.global_frac, 0)} global)": dict(
            schedule="R", routing="random", random_global_q=args.global_frac, routed_mode="sparse"),
        "local (L)": dict(schedule="L"),
    }
    print(f"command: python {' '.join(sys.argv)}")
    print(f"device {device}, {dtype}, batch {batch_size}, " + ", ".join(f"{k}={v}" for k, v in shape.items()))
    print("| variant | tokens/s | vs dense |\n|---|---|---|")
    dense = None
    for name, kinds in variants.items():
        tps = tokens_per_second(GPTConfig(**shape, **kinds), batch_size, steps, warmup, device, dtype)
        dense = dense or tps
        print(f"| {name} | {tps:,.0f} | {tps / dense:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
