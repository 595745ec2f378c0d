"""CPU benchmark: routed and local attention (torch backend) against dense causal SDPA, forward + backward.

Prints speed-ups (dense time / candidate time), never absolute times: they depend on the machine, the
ratios much less. Every round runs all candidates once, in an order that rotates from round to round, and
each ratio is the median over rounds of (dense time / candidate time) measured within the same round, so
slow drifts of the machine (other processes, frequency) hit both sides alike.

On a machine shared with other busy processes, wall-clock ratios are noise (threads wait for each other);
`--threads 1 --clock process` then times this process's CPU time, which other processes barely change.

    python bench/cpu_attention.py                      # T = 2048, 4096, 8192; w = 128; 10% global
    python bench/cpu_attention.py --T 4096 --rounds 11
    python bench/cpu_attention.py --threads 1 --clock process
"""
import argparse
import os
import shlex
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
from kernels.attention import attention  # noqa: E402
from nanoaha.formatting import percent  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, nargs="+", default=[2048, 4096, 8192], help="sequence lengths")
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--global-frac", type=float, default=0.1, help="fraction of (token, head) gates set to 1")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--rounds", type=int, default=7, help="timed rounds (after one warm-up round)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--clock", choices=["wall", "process"], default="wall",
                   help="wall: time.perf_counter; process: this process's CPU time (time.process_time)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def candidates(q, k, v, gate, window):
    def routed(mode):
        return lambda: attention(q, k, v, "routed", window, gate=gate, mode=mode, backend="torch")

    return {
        "dense": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "local": lambda: attention(q, k, v, "local", window, backend="torch"),
        "routed sparse": routed("sparse"),
        "routed exact": routed("exact"),
    }


def time_forward_backward(fn, grad_out, leaves, clock):
    for x in leaves:
        x.grad = None
    start = clock()
    fn().backward(grad_out)
    return clock() - start


def measure(T, args):
    g = torch.Generator().manual_seed(args.seed)
    shape = (args.batch, args.heads, T, args.head_dim)
    q, k, v = (torch.randn(shape, generator=g).requires_grad_() for _ in range(3))
    gate = (torch.rand(shape[:3], generator=g) < args.global_frac).float().requires_grad_()
    grad_out = torch.randn(shape, generator=g)
    fns = candidates(q, k, v, gate, args.window)
    clock = time.process_time if args.clock == "process" else time.perf_counter
    names = list(fns)
    ratios = {name: [] for name in names if name != "dense"}
    for r in range(args.rounds + 1):
        order = names[r % len(names):] + names[:r % len(names)]
        seconds = {name: time_forward_backward(fns[name], grad_out, (q, k, v, gate), clock) for name in order}
        if r == 0:
            continue  # warm-up: allocator, thread pool, first-call dispatch
        for name in ratios:
            ratios[name].append(seconds["dense"] / seconds[name])
    return gate.detach().mean().item(), ratios


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print("command: python " + shlex.join(sys.argv))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; B={args.batch} H={args.heads} "
          f"D={args.head_dim} w={args.window}, fp32, forward+backward, {args.rounds} rounds, "
          f"{args.clock} clock")
    print(f"load average before: {os.getloadavg()[0]:.2f} (other processes make the ratios unreliable)")
    print("speed-up = dense causal SDPA time / candidate time, measured side by side (higher is better);")
    print("each cell: median over rounds [lowest - highest round]\n")
    names = ("local", "routed sparse", "routed exact")
    print(f"{'T':>6} {'global':>7}" + "".join(f"{name:>22}" for name in names))
    results = {}
    for T in args.T:
        global_frac, ratios = measure(T, args)
        results[T] = {name: statistics.median(values) for name, values in ratios.items()}
        cells = (f"{results[T][n]:.2f}x [{min(ratios[n]):.2f}-{max(ratios[n]):.2f}]" for n in names)
        print(f"{T:>6} {percent(global_frac):>7}" + "".join(f"{cell:>22}" for cell in cells), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\ntargets (issue): routed sparse >= 2.5x and local >= 3x at T=4096, both growing with T")
    if 4096 in results:
        print(f"  T=4096: routed sparse {'met' if results[4096]['routed sparse'] >= 2.5 else 'MISSED'}, "
              f"local {'met' if results[4096]['local'] >= 3 else 'MISSED'}")
    lengths = sorted(results)
    for name in ("local", "routed sparse"):
        growing = all(results[a][name] < results[b][name] for a, b in zip(lengths, lengths[1:]))
        print(f"  {name} growing with T: {'yes' if growing else 'NO'}")


if __name__ == "__main__":
    main()
