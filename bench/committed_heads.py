"""CPU benchmark: a routed layer whose heads have committed to a path (kernels/layer.py, paths=) against the
same layout routed, fixed and dense; forward + backward of one layer, torch backend.

The layout: head 0 global, the other heads local. Candidates:
- routed exact: every head routed (decisions = the layout, straight-through gate), 'exact' mode, as training
  computes before the heads commit;
- routed sampled: the same in 'sampled' mode (--exact-frac of the batch's sequences exact, the others sparse);
- committed: paths (1, 0, 0, ...): head 0 dense alone, the others their window alone ('exact' mode: nothing of
  it runs for committed heads);
- fixed sparse: the fixed schedule with the same layout, a routed layer in 'sparse' mode whose gate (head 0 all
  1, the others 0) carries no gradient;
- dense: dense causal attention for every head.

Every round runs all candidates once, in an order that rotates from round to round; the ratio to the fixed
schedule is the median over rounds of the ratio measured within a round, so the machine's drift hits every
candidate alike. 'pairs / ideal': the query-key pairs the call computed (its LayerAttention.keys) over those
the layout needs (one head dense, the others their window).

    python bench/committed_heads.py
    python bench/committed_heads.py --threads 1 --clock process   # on a machine busy with other jobs
"""
import argparse
import os
import shlex
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
from kernels.layer import keys_read, layer_attention  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--rounds", type=int, default=9, help="timed rounds (after one warm-up round)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--clock", choices=["wall", "process"], default="wall",
                   help="wall: time.perf_counter; process: this process's CPU time (time.process_time)")
    p.add_argument("--exact-frac", type=float, default=0.25, help="routed sampled: share of sequences run exact")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def candidates(q, k, v, p, window, exact_frac):
    """name -> a call returning (LayerAttention, the leaves its backward reaches)."""
    B, H, T, _ = q.shape
    hard = torch.zeros(B, H, T, dtype=torch.bool)
    hard[:, 0] = True  # the layout: head 0 global, the others local
    committed = (1,) + (0,) * (H - 1)

    def routed(local, token):  # the router's straight-through gate (model.Router)
        return hard, hard.float() + p - p.detach(), p

    def fixed(local, token):  # committed heads' and a fixed schedule's gate: no gradient
        return hard, hard.float(), p.detach()

    def run(kind, route, mode="exact", paths=None):
        return lambda: layer_attention(q, k, v, kind, window, route=route, mode=mode, backend="torch", paths=paths,
                                       exact_frac=exact_frac)

    return {
        "(a) routed exact": run("routed", routed),
        "(b) routed sampled": run("routed", routed, mode="sampled"),
        "(c) committed": run("routed", fixed, paths=committed),
        "(d) fixed sparse": run("routed", fixed, mode="sparse"),
        "(e) dense": run("dense", None),
    }


def time_forward_backward(fn, grad_out, leaves, clock):
    for x in leaves:
        x.grad = None
    start = clock()
    out = fn()
    out.y.backward(grad_out)
    return clock() - start, out.keys.item()


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    B, H, T, D, window = args.batch, args.heads, args.T, args.head_dim, args.window
    g = torch.Generator().manual_seed(args.seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g).requires_grad_() for _ in range(3))
    p = torch.rand(B, H, T, generator=g).requires_grad_()
    grad_out = torch.randn(B, H, T, D, generator=g)
    fns = candidates(q, k, v, p, window, args.exact_frac)
    clock = time.process_time if args.clock == "process" else time.perf_counter
    ideal = B * (keys_read("dense", T, window, 0).sum() + (H - 1) * keys_read("local", T, window, 0).sum()).item()

    print("command: python " + shlex.join(sys.argv))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; B={B} H={H} T={T} D={D} w={window}, "
          f"fp32, forward+backward of one layer, {args.rounds} rounds, {args.clock} clock; "
          f"sampled: exact_frac {args.exact_frac}")
    print(f"layout: head 0 global, heads 1-{H - 1} local; load average before: {os.getloadavg()[0]:.2f}\n")
    names = list(fns)
    seconds, keys = {name: [] for name in names}, {}
    for r in range(args.rounds + 1):
        for name in names[r % len(names):] + names[:r % len(names)]:
            s, keys[name] = time_forward_backward(fns[name], grad_out, (q, k, v, p), clock)
            if r > 0:  # round 0 warms up: allocator, thread pool, first-call dispatch
                seconds[name].append(s)
    fixed = seconds["(d) fixed sparse"]
    print("| candidate | ms / call (median) | time / (d) [min, max] | pairs / ideal |")
    print("|---|---|---|---|")
    for name in names:
        ratios = [a / b for a, b in zip(seconds[name], fixed)]
        print(f"| {name} | {1e3 * statistics.median(seconds[name]):.1f} | {statistics.median(ratios):.2f}x "
              f"[{min(ratios):.2f}, {max(ratios):.2f}] | {keys[name] / ideal:.2f} |")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
