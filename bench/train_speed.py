"""End-to-end training throughput: dense, local and routed models measured in one run, as ratios to dense.

    python bench/train_speed.py                    # GPU (the default with CUDA): 12 layers, 768 wide, T=8192, w=256
    python bench/train_speed.py --device cpu       # CPU (the default without CUDA): quick-start shape, fp32 and bf16
    python bench/train_speed.py --device cpu --compile --threads 2 --rounds 5
    python bench/train_speed.py --quick            # a smoke run at toy size (either mode)

Routed layers in sparse mode use random routing at rate --global_frac (default 0.1), so the sparsity is the one
asked for from the first step (a fresh learned router starts all-global); the kernels' cost depends only on the
gate pattern, so those rows show the cost of routing at that rate. R exact has learned routers (random routing
trains sparse: model.trained_mode); exact mode computes both paths for every token, whatever the gates.

GPU: dense, routed (sparse mode) and local in bf16, one after the other; tokens/s and the ratio to dense.

CPU: the quick-start shape (configs/quickstart.py; bytes, vocab 256) as G (dense), L (local), LLLG, R exact and
R sparse, each in fp32 and in bf16 (under CPU autocast, as train.py runs dtype="bfloat16"), and with --compile
each also compiled (torch.compile; a variant that fails to compile is named with the reason and left out). Every
model and its optimizer is built once and warmed up (--warmup steps each, round by round); then each of --rounds
rounds times --steps steps of every model in turn, the order rotating from round to round, so the machine's
drift hits all alike. A step is forward, backward and AdamW on random tokens (no data loading, no clipping). The
table gives tokens/s as the median over rounds, bf16/fp32 as the median of the per-round ratios [lowest, highest
round], and each variant against dense in the same dtype (median of the per-round ratios).
"""
import argparse
import dataclasses
import os
import platform
import shlex
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from anywhere
from model import GPT, GPTConfig  # noqa: E402
from nanoaha.configurator import parse_args  # noqa: E402
from nanoaha.device import autocast_context, cpu_bf16_flag, cpuinfo_field, read_cpuinfo  # noqa: E402
from nanoaha.formatting import percent  # noqa: E402
from nanoaha.train_config import TrainConfig  # noqa: E402
from nanoaha.training import compile_model, configure_optimizer  # noqa: E402

QUICKSTART = os.path.join(ROOT, "configs", "quickstart.py")
CPU_VARIANTS = {"G (dense)": {"schedule": "G"}, "L (local)": {"schedule": "L"}, "LLLG": {"schedule": "LLLG"},
                "R exact": {"schedule": "R", "routed_mode": "exact"},
                "R sparse": {"schedule": "R", "routed_mode": "sparse"}}
CPU_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CPU_DEFAULTS = {"steps": 5, "warmup": 2, "rounds": 3}
CPU_QUICK = {"steps": 1, "warmup": 1, "rounds": 1, "block_size": 128}  # --quick: a smoke run


def train_step(model, optimizer, x, device, dtype):
    with autocast_context(device, dtype):
        loss = model(x, x).lm_loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# ------------------------------------------------------------------------------------------------------ GPU mode

def tokens_per_second(config, batch_size, steps, warmup, device, dtype):
    torch.manual_seed(0)
    model = GPT(config).to(device)
    optimizer = configure_optimizer(model, TrainConfig(), "cuda" if device == "cuda" else "cpu")
    x = torch.randint(config.vocab_size, (batch_size, config.block_size), device=device)
    for step in range(warmup + steps):
        if step == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        train_step(model, optimizer, x, device, dtype)
    if device == "cuda":
        torch.cuda.synchronize()
    return steps * batch_size * config.block_size / (time.perf_counter() - start)


def gpu_main(args):
    if args.quick:
        shape = dict(n_layer=2, n_head=4, n_embd=128, block_size=1024, window=64, vocab_size=256)
        batch_size, steps, warmup, dtype = 2, 3, 1, torch.float32
    else:
        shape = dict(n_layer=12, n_head=12, n_embd=768, block_size=8192, window=256, vocab_size=50304)
        batch_size, steps, warmup, dtype = 1, args.steps or 10, 3, torch.bfloat16
    variants = {
        "dense (G)": dict(schedule="G"),
        f"routed (R, sparse, {percent(args.global_frac, 0)} global)": dict(
            schedule="R", routing="random", random_global_q=args.global_frac, routed_mode="sparse"),
        "local (L)": dict(schedule="L"),
    }
    print(f"command: python {shlex.join(sys.argv)}")
    print(f"device {args.device}, {dtype}, batch {batch_size}, " + ", ".join(f"{k}={v}" for k, v in shape.items()))
    print("| variant | tokens/s | vs dense |\n|---|---|---|")
    dense = None
    for name, kinds in variants.items():
        tps = tokens_per_second(GPTConfig(**shape, **kinds), batch_size, steps, warmup, args.device, dtype)
        dense = dense or tps
        print(f"| {name} | {tps:,.0f} | {tps / dense:.2f}x |", flush=True)


# ------------------------------------------------------------------------------------------------------ CPU mode

@dataclasses.dataclass
class Timed:
    """One model of the CPU table and its tokens/s per round; tokens_per_s is None once it failed to compile."""
    variant: str
    dtype: str
    compiled: bool
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    tokens_per_s: list | None = dataclasses.field(default_factory=list)


def cpu_configs(args):
    """(TrainConfig, {variant: GPTConfig}) of the quick-start shape: its model, batch and optimizer settings."""
    tcfg, mcfg = parse_args([QUICKSTART], TrainConfig, GPTConfig)
    shape = {"vocab_size": 256, "block_size": args.block_size or mcfg.block_size}
    configs = {}
    for name, kinds in CPU_VARIANTS.items():
        random = "R" in kinds["schedule"] and kinds.get("routed_mode") == "sparse"
        routing = {"routing": "random", "random_global_q": args.global_frac} if random else {}
        configs[name] = dataclasses.replace(mcfg, **shape, **kinds, **routing)
    return tcfg, configs


def build(tcfg, configs, compiled):
    """A model (same init per variant) and optimizer for every variant, dtype and (with --compile) compilation."""
    if compiled:  # each model compiles graphs of its own: room for them all, and a model past the limit fails
        torch._dynamo.config.recompile_limit = 8 * len(configs) * len(CPU_DTYPES)  # (not: runs eager, silently)
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    timed = []
    for compile_it in ((False, True) if compiled else (False,)):
        for name, config in configs.items():
            for dtype in CPU_DTYPES:
                torch.manual_seed(0)
                model = GPT(config)
                optimizer = configure_optimizer(model, tcfg, "cpu")
                timed.append(Timed(name, dtype, compile_it, compile_model(model) if compile_it else model, optimizer))
    return timed


def run_steps(entry, x, steps):
    """Seconds for `steps` training steps of one model; None (and the model left out, with one line saying why)
    when a compiled one fails: compilation happens at the first call."""
    start = time.perf_counter()
    try:
        for _ in range(steps):
            train_step(entry.model, entry.optimizer, x, "cpu", CPU_DTYPES[entry.dtype])
    except Exception as e:
        if not entry.compiled:
            raise
        reason = (str(e).strip().splitlines() or [""])[0][:200]
        print(f"compiled {entry.variant} {entry.dtype}: left out, compiling or running it failed "
              f"({type(e).__name__}: {reason})", flush=True)
        entry.tokens_per_s = None
        return None
    return time.perf_counter() - start


def measure(timed, x, args):
    """Warm every model up, then time them round by round in an order that rotates. Warm-up goes round by round
    too: compiled models share torch.compile's caches, and compiling one can make another recompile."""
    for _ in range(args.warmup):
        for entry in timed:
            if entry.tokens_per_s is not None:
                run_steps(entry, x, 1)
    for r in range(args.rounds):
        for entry in timed[r % len(timed):] + timed[:r % len(timed)]:
            if entry.tokens_per_s is not None and (seconds := run_steps(entry, x, args.steps)) is not None:
                entry.tokens_per_s.append(args.steps * x.numel() / seconds)


def ratio_cell(numerators, denominators, spread=False):
    """Median over rounds of numerator / denominator measured in the same round, optionally [lowest, highest]."""
    if numerators is None or denominators is None:
        return "-"
    ratios = [a / b for a, b in zip(numerators, denominators)]
    cell = f"{statistics.median(ratios):.2f}x"
    return f"{cell} [{min(ratios):.2f}, {max(ratios):.2f}]" if spread else cell


def cpu_table(timed):
    """One row per variant (and per compiled variant): tokens/s, bf16 / fp32, each dtype against dense."""
    by_key = {(e.variant, e.compiled, e.dtype): e.tokens_per_s for e in timed}
    lines = ["| variant | fp32 tok/s | bf16 tok/s | bf16 / fp32 [min, max] | fp32 vs dense | bf16 vs dense |",
             "|---|---|---|---|---|---|"]
    dense = next(iter(CPU_VARIANTS))
    for compiled in sorted({e.compiled for e in timed}):
        for variant in CPU_VARIANTS:
            fp32, bf16 = by_key[variant, compiled, "fp32"], by_key[variant, compiled, "bf16"]
            speed = [f"{statistics.median(tps):,.0f}" if tps else "-" for tps in (fp32, bf16)]
            vs_dense = [ratio_cell(by_key[variant, compiled, d], by_key[dense, compiled, d]) for d in CPU_DTYPES]
            name = f"{variant}, compiled" if compiled else variant
            lines.append(f"| {name} | {' | '.join(speed)} | {ratio_cell(bf16, fp32, spread=True)} | "
                         f"{' | '.join(vs_dense)} |")
    return "\n".join(lines)


def cpu_name(cpuinfo):
    return cpuinfo_field(cpuinfo, "model name") or platform.processor() or "unknown CPU"


def cpu_main(args):
    for key, value in (CPU_QUICK if args.quick else CPU_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.threads:
        torch.set_num_threads(args.threads)
    tcfg, configs = cpu_configs(args)
    config = next(iter(configs.values()))
    cpuinfo = read_cpuinfo()
    print(f"command: python {shlex.join(sys.argv)}")
    print(f"CPU: {cpu_name(cpuinfo)}; native bf16: {cpu_bf16_flag(cpuinfo) or 'no (no avx512_bf16 or amx_bf16)'}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"shape: {config.n_layer} layers, {config.n_head} heads, n_embd {config.n_embd}, T={config.block_size}, "
          f"window {config.window}, batch {tcfg.batch_size}, vocab {config.vocab_size}; routed layers: random "
          f"routing at {percent(args.global_frac, 0)} global")
    print(f"{args.warmup} warm-up steps per model, then {args.rounds} rounds of {args.steps} timed steps per model; "
          f"tok/s: median over rounds; ratios: median over rounds of the ratio within a round\n")
    timed = build(tcfg, configs, args.compile)
    x = torch.randint(config.vocab_size, (tcfg.batch_size, config.block_size))
    measure(timed, x, args)
    print(cpu_table(timed))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a smoke run at toy size")
    parser.add_argument("--global_frac", type=float, default=0.1, help="routed layers' random global rate")
    parser.add_argument("--steps", type=int, help="timed steps (GPU: 10; CPU: 5 per model and round)")
    cpu = parser.add_argument_group("CPU mode")
    cpu.add_argument("--warmup", type=int, help="warm-up steps per model, once (default 2)")
    cpu.add_argument("--rounds", type=int, help="timed rounds (default 3)")
    cpu.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    cpu.add_argument("--compile", action="store_true", help="also time every model compiled (torch.compile)")
    cpu.add_argument("--block_size", type=int, help="sequence length (default: the quick start's, 1024; --quick 128)")
    args = parser.parse_args()
    if any(value is not None and value < 1 for value in (args.steps, args.rounds, args.threads, args.block_size)):
        parser.error("--steps, --rounds, --threads and --block_size must be at least 1")
    if args.warmup is not None and args.warmup < 0:
        parser.error("--warmup must be at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (--device cpu runs the CPU mode)")
    if args.device == "cuda":
        given = [name for name in ("warmup", "rounds", "threads", "block_size") if getattr(args, name) is not None]
        if given or args.compile:
            parser.error(f"{', '.join(f'--{n}' for n in given + ['compile'] * args.compile)}: CPU mode only "
                         f"(--device cpu)")
        gpu_main(args)
    else:
        cpu_main(args)


if __name__ == "__main__":
    main()
