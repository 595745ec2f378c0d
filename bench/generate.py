"""Generation speed: prefill time and decode tokens/s of dense, local and routed models, side by side.

    python bench/generate.py                                   # contexts 1K, 4K, 8K; batch 1 and 8; one thread
    python bench/generate.py --contexts 1024 --batches 1 --new_tokens 32        # a quick look
    python bench/generate.py --checkpoint out/quickstart                         # adds a trained routed model
    python bench/generate.py --device cuda --n_layer 12 --n_embd 768 --n_head 12 --window 256   # on a GPU

Models: 4 layers, 4 heads, 128 wide (--n_layer, --n_head, --n_embd), window 128, block_size = the largest context + new tokens, random weights
(speed does not depend on them). Rows: dense `G`, local `L`, routed `R` with random routing at --global_frac
(each head of each token global with that probability); with --checkpoint, a second table: the trained model
beside dense and local models of its shape, at its longest context (block_size - new tokens). Per row: the
prompt's prefill time, decode tokens/s (new tokens x batch / decode time, the KV cache in use), their ratios to
dense measured in the same run, and the KV cache's bytes at the end. Times are the median of --repeats runs.
On CUDA (--device cuda) the attention backend is Triton for the prefill and each timed step is synchronized.
"""
import argparse
import dataclasses
import os
import platform
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere
from nanoaha.checkpoint import load_model  # noqa: E402
from nanoaha.formatting import percent  # noqa: E402
from nanoaha.generation_timing import timed_generate  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def measure(model, context, batch, new_tokens, repeats):
    prompt = torch.randint(model.config.vocab_size, (batch, context), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(next(model.parameters()).device)
    runs = []
    for _ in range(repeats):
        torch.manual_seed(0)  # random routing draws the same gates each repeat
        runs.append(timed_generate(model, prompt, new_tokens, temperature=0)[1])
    prefill = statistics.median(r["prefill_s"] for r in runs)
    decode = statistics.median(r["decode_s"] for r in runs)
    return {"prefill_ms": prefill * 1e3, "decode_tok_s": (new_tokens - 1) * batch / decode,
            "cache_mib": runs[-1]["cache_bytes"] / 2**20}


def suite(config, routed_name, routed_model=None, global_frac=0.1, device="cpu"):
    """Dense, local and a routed model of one shape (random weights: speed does not depend on them)."""
    rows = {"dense G": config.with_schedule("G"), "local L": config.with_schedule("L")}
    for name, cfg in rows.items():
        torch.manual_seed(0)
        yield name, GPT(cfg).to(device).eval()
    if routed_model is None:
        torch.manual_seed(0)
        routed_model = GPT(dataclasses.replace(config, schedule="R", routing="random", random_global_q=global_frac))
    yield routed_name, routed_model.to(device).eval()


def table(rows, contexts, batches, new_tokens, repeats):
    print("| model | context | batch | prefill ms | prefill vs dense | decode tok/s | decode vs dense | KV cache MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for context in contexts:
        for batch in batches:
            dense = None
            for name, model in rows():
                r = measure(model, context, batch, new_tokens, repeats)
                dense = dense or r
                print(f"| {name} | {context} | {batch} | {r['prefill_ms']:.0f} | "
                      f"{dense['prefill_ms'] / r['prefill_ms']:.2f}x | {r['decode_tok_s']:,.0f} | "
                      f"{r['decode_tok_s'] / dense['decode_tok_s']:.2f}x | {r['cache_mib']:.1f} |", flush=True)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--global_frac", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkpoint", default="")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--n_head", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=128)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda, but torch sees no CUDA GPU: leave --device out to run on the CPU")
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{args.threads} CPU thread(s)"
    backend = "triton prefill" if args.device == "cuda" else "torch backend"
    print(f"# generation: prefill and decode, {backend}, {where}, fp32\n")
    print(f"python bench/generate.py {' '.join(argv)}  \nmachine: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}; {args.new_tokens} new tokens, temperature 0, "
          f"median of {args.repeats}\n")
    base = GPTConfig(vocab_size=256, block_size=max(args.contexts) + args.new_tokens, n_layer=args.n_layer,
                     n_head=args.n_head, n_embd=args.n_embd, window=args.window, attention_backend="auto")
    print(f"## {args.n_layer} layers x {args.n_head} heads x {args.n_embd} wide, window {args.window}, random "
          f"weights\n")
    table(lambda: suite(base, f"routed R, random {percent(args.global_frac, 0)}", global_frac=args.global_frac,
                        device=args.device), args.contexts, args.batches, args.new_tokens, args.repeats)
    if args.checkpoint:
        model, _ = load_model(args.checkpoint, args.device)
        cfg = model.config
        print(f"\n## {args.checkpoint}: {cfg.n_layer} layers x {cfg.n_head} heads x {cfg.n_embd} wide, window "
              f"{cfg.window}, trained; dense and local of its shape beside it, at its longest context\n")
        table(lambda: suite(cfg, f"trained {cfg.layer_letters}", model, device=args.device),
              [cfg.block_size - args.new_tokens], args.batches, args.new_tokens, args.repeats)


if __name__ == "__main__":
    main(sys.argv[1:])
