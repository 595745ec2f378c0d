"""CPU benchmark: training tokens/s of routing mechanisms against the fixed schedule with the same layout, and the
attention FLOPs each computes against the ideal of its decisions (the issue's target 4: tokens/s >= 0.9x the
fixed schedule's, computed attention FLOPs within 1.2x of ideal).

The live grid's shape: configs/quickstart.py with 2 layers, n_embd 256 (4 heads of 64), T=1024, window 32,
batch 4, bytes (vocab 256). The layout (--layout, one digit per head and a comma between layers, 1 global, 0
local): by default 0000,1000, a local first layer and one always-global head (head 0) in the second, the layout
of LR_one_global_head. Variants, all from the same init seed:
1. LG (fixed): a local layer, then a dense one;
2. the layout, fixed: random routing at per-head rates 0 and 1 (schedule "LR" for the default layout, "RR"
   otherwise): the fixed schedule of the layout, the baseline of the ratios;
3. R per-head, committed: per-head routers (router_per_token=False), every head committed to the layout
   (Router.commit), the state a committing run ends in;
4. R per-head, not committed (exact): the same routers with biases that decide the layout (-1 local, +1
   global), in 'exact' mode: what such a run computes before its heads commit;
5. R per-token at LG's cost (exact): per-token routers whose biases make layer 0 local and layer 1 global
   (weights zero, router_init_std=0): what learned per-token routing computes, at LG's ideal cost;
4s, 5s: 4 and 5 in 'sampled' mode (routed_exact_frac 0.25: 1 of the batch's 4 sequences exact);
6. G (dense).

A step is forward, backward and AdamW on random tokens (loss: lm_loss; no router penalty, clipping or data
loading), in fp32 or (--dtype bf16) under CPU autocast, as train.py runs bf16. Every model is built once and
warmed up (--warmup steps each); then each of --rounds rounds times --steps steps of every model in turn, the
order rotating from round to round, so the machine's drift hits all alike. tokens/s is the median over rounds;
"vs (2)" the median over rounds of the ratio measured within a round [lowest, highest round]. Attention FLOPs
(relative to an all-dense model) come from nanoaha.routing_stats on one forward of the model in training mode
with a gradient, i.e. what a training step computes: 'ideal' what the decisions ask for, 'computed' what the
kernels ran.

With --commit_step N the table is followed by what a run of --max_iters steps whose heads decide in exact mode
until step N and are all committed from then on computes and how fast it trains, modelled from rows (4) and (3):
tokens/s against (2) as max_iters / (N / ratio(4) + (max_iters - N) / ratio(3)), and attention FLOPs as the
step-weighted mean of (4)'s and (3)'s computed. A run whose heads commit earlier than N costs less: the model is
an upper bound on its cost.

    python bench/layout_speed.py
    python bench/layout_speed.py --layout=0110,1100 --commit_step=1000   # a budget of 4 heads, a deadline
    python bench/layout_speed.py --threads 1 --clock process   # on a machine busy with other jobs
    python bench/layout_speed.py --dtype bf16
"""
import argparse
import dataclasses
import os
import shlex
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from anywhere
from model import GPT, GPTConfig  # noqa: E402
from nanoaha.configurator import parse_args  # noqa: E402
from nanoaha.device import autocast_context  # noqa: E402
from nanoaha.routing_stats import routing_stats  # noqa: E402
from nanoaha.train_config import TrainConfig  # noqa: E402
from nanoaha.training import configure_optimizer  # noqa: E402

QUICKSTART = os.path.join(ROOT, "configs", "quickstart.py")
SHAPE = {"n_layer": 2, "n_embd": 256, "n_head": 4, "block_size": 1024, "window": 32, "vocab_size": 256}
DEFAULT_LAYOUT = "0000,1000"  # LR_one_global_head's
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BASELINE = "(2) the layout, fixed"


def commit(layout):
    """Set up a per-head-routed model: every head committed to its path of `layout`."""
    def setup(model):
        for block, paths in zip(model.blocks, layout):
            for head, path in enumerate(paths):
                block.attn.router.commit(head, path)
    return setup


def biases(layout):
    """Set up a routed model: each head's router bias (a per-token router's logits.bias; its weights are zero)
    -1 where `layout` has it local, +1 where global, so the decisions are the layout; nothing committed."""
    def setup(model):
        with torch.no_grad():
            for block, paths in zip(model.blocks, layout):
                router = block.attn.router
                bias = router.bias if router.logits is None else router.logits.bias
                bias.copy_(torch.tensor([1.0 if path else -1.0 for path in paths]))
    return setup


def parse_layout(text, n_layer, n_head):
    """'0000,1000' -> [(0, 0, 0, 0), (1, 0, 0, 0)]; ValueError naming the problem."""
    layers = text.split(",")
    if len(layers) != n_layer or any(len(h) != n_head or set(h) - {"0", "1"} for h in layers):
        raise ValueError(f"--layout={text}: give {n_layer} layers of {n_head} digits (1 global, 0 local), "
                         f"separated by commas, e.g. {DEFAULT_LAYOUT}")
    return [tuple(int(d) for d in h) for h in layers]


def variants(layout):
    """{name: (GPTConfig settings, setup after building or None)} for `layout`."""
    default = layout == parse_layout(DEFAULT_LAYOUT, SHAPE["n_layer"], SHAPE["n_head"])
    fixed = {"schedule": "LR" if default else "R" * len(layout), "routing": "random",
             "random_global_q": [0.0 if default else [float(d) for d in layout[0]]]
             + [[float(d) for d in paths] for paths in layout[1:]]}
    return {
        "(1) LG (fixed)": ({"schedule": "LG"}, None),
        BASELINE: (fixed, None),
        "(3) R per-head, committed to that layout": (
            {"schedule": "R", "router_per_token": False, "routed_mode": "exact"}, commit(layout)),
        "(4) R per-head, not committed (exact)": (
            {"schedule": "R", "router_per_token": False, "routed_mode": "exact"}, biases(layout)),
        "(4s) R per-head, not committed (sampled)": (
            {"schedule": "R", "router_per_token": False, "routed_mode": "sampled", "routed_exact_frac": 0.25},
            biases(layout)),
        "(5) R per-token at LG's cost (exact)": (
            {"schedule": "R", "router_per_token": True, "router_init_std": 0.0, "routed_mode": "exact"},
            biases([(0, 0, 0, 0), (1, 1, 1, 1)])),
        "(5s) R per-token at LG's cost (sampled)": (
            {"schedule": "R", "router_per_token": True, "router_init_std": 0.0, "routed_mode": "sampled",
             "routed_exact_frac": 0.25}, biases([(0, 0, 0, 0), (1, 1, 1, 1)])),
        "(6) G (dense)": ({"schedule": "G"}, None),
    }


@dataclasses.dataclass
class Timed:
    name: str
    config: GPTConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    seconds: list = dataclasses.field(default_factory=list)  # per round, the clock's seconds for --steps steps
    flops: dict = None


def parse_cli():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32", help="fp32, or bf16 under CPU autocast")
    p.add_argument("--steps", type=int, default=2, help="timed training steps per model and round")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps per model, before the rounds")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--clock", choices=["wall", "process"], default="wall",
                   help="wall: time.perf_counter; process: this process's CPU time (time.process_time)")
    p.add_argument("--seed", type=int, default=0, help="every model's init seed")
    p.add_argument("--layout", default=DEFAULT_LAYOUT,
                   help="per layer, one digit per head (1 global, 0 local), layers separated by commas")
    p.add_argument("--commit_step", type=int, default=None,
                   help="also model a run whose heads decide in exact mode until this step, then are committed")
    p.add_argument("--max_iters", type=int, default=5000, help="the modelled run's steps (with --commit_step)")
    args = p.parse_args()
    if min(args.steps, args.rounds) < 1 or args.warmup < 0 or (args.threads is not None and args.threads < 1):
        p.error("--steps, --rounds and --threads must be at least 1, --warmup at least 0")
    if args.commit_step is not None and not 0 <= args.commit_step <= args.max_iters:
        p.error(f"--commit_step={args.commit_step} must lie between 0 and --max_iters={args.max_iters}")
    try:
        args.layout = parse_layout(args.layout, SHAPE["n_layer"], SHAPE["n_head"])
    except ValueError as e:
        p.error(str(e))
    return args


def configs(variants):
    """(TrainConfig, {variant: GPTConfig}): the quick-start config at the live grid's shape."""
    tcfg, mcfg = parse_args([QUICKSTART], TrainConfig, GPTConfig)
    return tcfg, {name: dataclasses.replace(mcfg, **SHAPE, **settings) for name, (settings, _) in variants.items()}


def train_step(model, optimizer, x, dtype):
    with autocast_context("cpu", dtype):
        loss = model(x, x).lm_loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def attention_flops(model, config, x, dtype):
    """Attention FLOPs of one training forward (train mode, with a gradient) relative to an all-dense model:
    ideal, computed, and per layer the fraction of (token, head) decisions that went global."""
    with autocast_context("cpu", dtype):
        output = model(x, x)
    stats = routing_stats(output, config)
    return {"ideal": stats["model_ideal_flop_frac"].item(), "computed": stats["model_computed_flop_frac"].item(),
            "global": stats["global_frac"].mean(dim=1).tolist()}


def build(tcfg, configs, setups, x, dtype, seed):
    timed = []
    for name, config in configs.items():
        torch.manual_seed(seed)
        model = GPT(config)
        setup = setups[name]
        if setup is not None:
            setup(model)
        model.train()
        entry = Timed(name, config, model, configure_optimizer(model, tcfg, "cpu"))
        entry.flops = attention_flops(model, config, x, dtype)
        timed.append(entry)
    return timed


def measure(timed, x, args, dtype, clock):
    for _ in range(args.warmup):
        for entry in timed:
            train_step(entry.model, entry.optimizer, x, dtype)
    for r in range(args.rounds):
        for entry in timed[r % len(timed):] + timed[:r % len(timed)]:
            start = clock()
            for _ in range(args.steps):
                train_step(entry.model, entry.optimizer, x, dtype)
            entry.seconds.append(clock() - start)


def table(timed, tokens):
    base = next(e for e in timed if e.name == BASELINE).seconds
    lines = ["| variant | tokens/s | vs (2) [min, max] | global frac per layer | attn FLOPs ideal | computed | "
             "computed / ideal |", "|---|---|---|---|---|---|---|"]
    for e in timed:
        ratios = [b / s for s, b in zip(e.seconds, base)]  # tokens/s ratio = baseline's seconds / this one's
        f = e.flops
        lines.append(f"| {e.name} | {statistics.median(tokens / s for s in e.seconds):,.0f} | "
                     f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}] | "
                     f"{', '.join(f'{g:.2f}' for g in f['global'])} | {f['ideal']:.3f} | {f['computed']:.3f} | "
                     f"{f['computed'] / f['ideal']:.2f} |")
    return "\n".join(lines)


def run_model(timed, commit_step, max_iters):
    """A run of max_iters steps, exact-routed (4) until commit_step and committed (3) after: (tokens/s against
    (2) per round, attention FLOPs computed over the run / ideal)."""
    by_name = {e.name: e for e in timed}
    base, exact, committed = (by_name[n] for n in (BASELINE, "(4) R per-head, not committed (exact)",
                                                   "(3) R per-head, committed to that layout"))
    ratios = [max_iters * b / (commit_step * s4 + (max_iters - commit_step) * s3)
              for b, s4, s3 in zip(base.seconds, exact.seconds, committed.seconds)]
    computed = (commit_step * exact.flops["computed"]
                + (max_iters - commit_step) * committed.flops["computed"]) / max_iters
    return ratios, computed / committed.flops["ideal"]


def describe(layout):
    return "; ".join(f"layer {i}: " + (", ".join(f"head {h} global" for h, d in enumerate(paths) if d) or "local")
                     for i, paths in enumerate(layout))


def main():
    args = parse_cli()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    clock = time.process_time if args.clock == "process" else time.perf_counter
    chosen = variants(args.layout)
    tcfg, cfgs = configs(chosen)
    config = next(iter(cfgs.values()))
    print(f"command: python {shlex.join(sys.argv)}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, {args.clock} clock; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"shape: {config.n_layer} layers, {config.n_head} heads, n_embd {config.n_embd}, T={config.block_size}, "
          f"window {config.window}, batch {tcfg.batch_size}, vocab {config.vocab_size}; layout: "
          f"{describe(args.layout)}")
    print(f"{args.warmup} warm-up step(s) per model, then {args.rounds} rounds of {args.steps} timed step(s) per "
          f"model; tokens/s: median over rounds; vs (2): median over rounds of the ratio within a round; attention "
          f"FLOPs: fractions of an all-dense model's, one training forward\n")
    torch.manual_seed(args.seed)
    x = torch.randint(config.vocab_size, (tcfg.batch_size, config.block_size))
    timed = build(tcfg, cfgs, {name: setup for name, (_, setup) in chosen.items()}, x, dtype, args.seed)
    measure(timed, x, args, dtype, clock)
    print(table(timed, args.steps * x.numel()))
    if args.commit_step is not None:
        ratios, over_ideal = run_model(timed, args.commit_step, args.max_iters)
        print(f"\na run of {args.max_iters} steps, exact-routed (4) until step {args.commit_step}, committed (3) "
              f"after (modelled): tokens/s {statistics.median(ratios):.2f}x (2)'s [{min(ratios):.2f}, "
              f"{max(ratios):.2f}], attention FLOPs computed over the run {over_ideal:.2f}x the layout's ideal")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
