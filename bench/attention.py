"""GPU benchmark of All-or-Here attention kernels: one markdown table, bf16, B = 1, H = 16, no sinks.

    python bench/attention.py --out /tmp/attention.md                    # full grid
    python bench/attention.py --quick --out /tmp/attention.md             # reduced grid
    python bench/attention.py --budget_s 300 --out ...                    # stop starting new groups after 300 s

Rows: head dim D, window w, length T, global fraction f (each (token, head) gate is 1 with probability f).
Times are milliseconds, the median of CUDA-event timings after warm-up; "f+b" is forward + backward
(torch.autograd.grad of every input, the gate included).
  SDPA    flash causal (the dense baseline)
  flex    FlexAttention, mask_mod (q >= kv) & (gate[b, h, q] | (q - kv < w)), compiled. "mask" is the block-mask
          build from the gate, which training pays every step and layer; "+mask" columns add it
  routed  our Triton routed attention, sparse mode (gate compaction included)
  local   our Triton local attention (independent of f)
  ideal   dense causal attention FLOPs / AHA FLOPs for this gate: keys(t) = t + 1 if global else min(t + 1, w)
  speed-up  SDPA time / routed time (fwd; f+b with its % of ideal); flex likewise, mask included
  peak    peak GPU memory of one forward + backward beyond the inputs, MiB
  |diff|  max |routed - flex| of the outputs: both compute the same function
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
from kernels import triton_attention  # noqa: E402
from nanoaha.formatting import percent  # noqa: E402

FULL_GRID = dict(D=[128, 64], w=[256, 128], T=[2048, 4096, 8192, 16384, 32768],
                 f=[0.0, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0])
QUICK_GRID = dict(D=[128], w=[256], T=[4096, 16384], f=[0.0, 0.05, 0.1, 0.5, 1.0])
HEADS = 16
COLUMNS = ["D", "w", "T", "f", "ideal", "SDPA fwd", "SDPA f+b", "local fwd", "local f+b", "routed fwd",
           "routed f+b", "routed speed-up fwd", "routed speed-up f+b (% ideal)", "flex mask", "flex fwd",
           "flex fwd+mask", "flex f+b", "flex f+b+mask", "flex speed-up f+b+mask (% ideal)",
           "peak MiB SDPA/flex/routed/local", "|diff|"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="path of the markdown table to write")
    p.add_argument("--quick", action="store_true", help=f"reduced grid {QUICK_GRID}")
    p.add_argument("--budget_s", type=float, default=None,
                   help="start no new (D, w, T) group after this many seconds; skipped groups are listed")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def median_ms(fn, target_s=0.25, min_reps=5, max_reps=50):
    """Median of CUDA-event timings; the number of repetitions adapts so that big shapes stay affordable."""
    for _ in range(3):  # warm-up: compilation, autotuning, allocator
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    reps = int(min(max_reps, max(min_reps, target_s / max(time.perf_counter() - start, 1e-6))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for begin, end in events:
        begin.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(end) for begin, end in events)


def peak_mib(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def ideal_speedup(gate, window):
    t = torch.arange(gate.shape[-1], device=gate.device, dtype=torch.float64)
    dense = (t + 1).sum() * gate.shape[0] * gate.shape[1]
    aha = torch.where(gate > 0.5, t + 1, torch.clamp(t + 1, max=window)).sum()
    return (dense / aha).item()


# compiled once; eager create_block_mask would materialise the whole (H, T, T) mask
build_block_mask = torch.compile(create_block_mask)
compiled_flex_attention = torch.compile(flex_attention, dynamic=False)


class FlexAHA:
    """FlexAttention for AHA at one sequence length. The gate and the window live in tensors that are updated
    in place, so a new gate or window reuses the compiled mask builder and kernels instead of recompiling."""

    def __init__(self, B, H, T, device):
        self.shape = (B, H, T)
        self.is_global = torch.zeros(B, H, T, dtype=torch.bool, device=device)
        self.window = torch.zeros((), dtype=torch.int64, device=device)
        is_global, window = self.is_global, self.window

        def mask_mod(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (is_global[b, h, q_idx] | (q_idx - kv_idx < window))

        self.mask_mod = mask_mod

    def set_routing(self, gate, window):
        self.is_global.copy_(gate > 0.5)
        self.window.fill_(window)

    def block_mask(self):
        B, H, T = self.shape
        return build_block_mask(self.mask_mod, B, H, T, T, device=self.is_global.device)


def forward_only(fn):
    def run():
        with torch.no_grad():
            return fn()
    return run


def forward_backward(fn, inputs, grad_out):
    def run():
        return torch.autograd.grad(fn(), inputs, grad_out)
    return run


def measure(fn, inputs, grad_out):
    """(fwd ms, f+b ms, peak MiB of f+b)."""
    both = forward_backward(fn, inputs, grad_out)
    return median_ms(forward_only(fn)), median_ms(both), peak_mib(both)


def ms_cells(*times):
    return [f"{ms:.3f}" for ms in times]


def speedup_cell(baseline_ms, ms, ideal):
    speedup = baseline_ms / ms
    return f"{speedup:.2f}x ({percent(speedup / ideal, 0)})"


def run_group(D, w, T, fractions, sdpa_cache, seed):
    """Table rows of one (D, w, T), one per global fraction, yielded as they are measured."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (1, HEADS, T, D)
    q, k, v, grad_out = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    qkv = (q, k, v)
    if (T, D) not in sdpa_cache:
        def sdpa():
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        sdpa_cache[T, D] = measure(sdpa, qkv, grad_out)
    sdpa_fwd, sdpa_fb, sdpa_peak = sdpa_cache[T, D]
    local_fwd, local_fb, local_peak = measure(lambda: triton_attention.local_attention(q, k, v, w), qkv, grad_out)
    flex = FlexAHA(1, HEADS, T, q.device)
    for f in fractions:
        gate = (torch.rand(shape[:3], device="cuda", generator=g) < f).float().requires_grad_()
        flex.set_routing(gate, w)
        mask_ms = median_ms(flex.block_mask)
        block_mask = flex.block_mask()

        def flex_aha():
            return compiled_flex_attention(q, k, v, block_mask=block_mask)

        def routed():
            return triton_attention.routed_attention(q, k, v, gate, w, 0, "sparse")

        flex_fwd, flex_fb, flex_peak = measure(flex_aha, qkv, grad_out)
        routed_fwd, routed_fb, routed_peak = measure(routed, (q, k, v, gate), grad_out)
        with torch.no_grad():
            diff = (routed().float() - flex_aha().float()).abs().max().item()
        ideal = ideal_speedup(gate, w)
        yield [D, w, T, f, f"{ideal:.2f}x", *ms_cells(sdpa_fwd, sdpa_fb, local_fwd, local_fb, routed_fwd, routed_fb),
               f"{sdpa_fwd / routed_fwd:.2f}x", speedup_cell(sdpa_fb, routed_fb, ideal),
               *ms_cells(mask_ms, flex_fwd, flex_fwd + mask_ms, flex_fb, flex_fb + mask_ms),
               speedup_cell(sdpa_fb, flex_fb + mask_ms, ideal),
               f"{sdpa_peak:.0f}/{flex_peak:.0f}/{routed_peak:.0f}/{local_peak:.0f}", f"{diff:.1e}"]


def markdown_row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/attention.py needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    torch._dynamo.config.cache_size_limit = 64  # one flex compilation per (T, D), the default 8 would fall back
    torch._dynamo.config.accumulated_cache_size_limit = 512
    grid = QUICK_GRID if args.quick else FULL_GRID
    groups = [(D, w, T) for D in grid["D"] for w in grid["w"] for T in grid["T"]]
    header = [f"## Attention kernels on {torch.cuda.get_device_name()}",
              "", f"command: python {' '.join(sys.argv)}",
              f"torch {torch.__version__}, bf16, B=1, H={HEADS}, n_sink=0; times in ms (median, CUDA events)", "",
              "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as out:
        def emit(line):  # written as it comes, so a run cut short by a timeout keeps its rows
            print(line, flush=True)
            out.write(line + "\n")
            out.flush()

        for line in header:
            emit(line)
        skipped, sdpa_cache = [], {}
        start = time.perf_counter()
        for D, w, T in groups:
            if args.budget_s is not None and time.perf_counter() - start > args.budget_s:
                skipped.append(f"D={D} w={w} T={T}")
                continue
            for row in run_group(D, w, T, grid["f"], sdpa_cache, args.seed):
                emit(markdown_row(row))
            torch.cuda.empty_cache()
        emit("")
        emit(f"wall time {time.perf_counter() - start:.0f} s")
        if skipped:
            emit(f"not measured (budget of {args.budget_s:.0f} s spent): " + ", ".join(skipped))


if __name__ == "__main__":
    main()
