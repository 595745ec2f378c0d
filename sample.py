"""Generate text from a checkpoint and show which tokens went global.

    python sample.py --out_dir=out/quickstart --start="def " --show_routing
    python sample.py --out_dir=out/quickstart --start=FILE:prompt.txt --temperature=0 --router_threshold=0.7
"""
import sys
from bisect import bisect_right
from dataclasses import dataclass

import torch

from nanoaha.checkpoint import load_model
from nanoaha.configurator import parse_args_or_exit, run_main
from data.tokens import codec
from nanoaha.device import pick_device
from nanoaha.formatting import human_bytes, percent
from nanoaha.generation_timing import timed_generate
from nanoaha.routing_stats import global_heads_per_token


@dataclass
class SampleConfig:
    out_dir: str = "out"
    start: str = "\n"              # the prompt, or FILE:path to read it from a file
    num_samples: int = 1
    max_new_tokens: int = 300
    temperature: float = 0.8       # 0: greedy
    top_k: int | None = 50
    seed: int = 1337
    device: str = "auto"
    use_kv_cache: bool = True
    show_routing: bool = False     # colour each token by how many heads went global
    router_threshold: float | None = None  # override the trained threshold (speed/quality trade-off)

    def __post_init__(self):
        if self.num_samples < 1 or self.max_new_tokens < 1:
            raise ValueError(f"num_samples={self.num_samples} and max_new_tokens={self.max_new_tokens} must be at "
                             f"least 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must not be negative (0: greedy)")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k={self.top_k} must be at least 1, or None to sample from every token")
        if self.router_threshold is not None and not 0.0 <= self.router_threshold <= 1.0:
            raise ValueError(f"router_threshold={self.router_threshold} must be in [0, 1]")


# xterm-256 background colours from blue (the fewest heads global) to red (the most): RdYlBu reversed, as the
# TensorBoard snippet; white text on the dark ones, black on the light ones
PALETTE = (25, 32, 74, 117, 229, 222, 209, 166, 124)
DARK = {25, 32, 166, 124}


def routing_steps(counts, max_count, n_colours=len(PALETTE)):
    """The colour scale of one text: from the fewest to the most heads that went global among its tokens, one step
    per count where the text spans at most n_colours counts, else n_colours equal ranges of counts; the steps'
    colours spread over the whole palette, so neighbouring counts differ at a glance whatever the text's level (a
    fixed 0..max_count scale gave every token of a model at 10-16% global the same dark blue). A text of one count
    takes its colour by that count's share of max_count. Returns (each token's step, [(lowest, highest count)
    of each step], [the colour of each step])."""
    low, high = min(counts), max(counts)
    span = high - low + 1
    edges = [low + round(i * span / min(span, n_colours)) for i in range(min(span, n_colours) + 1)]
    ranges = [(a, b - 1) for a, b in zip(edges, edges[1:])]
    last = len(PALETTE) - 1
    if len(ranges) == 1:
        colours = [PALETTE[round(low / max_count * last) if max_count else 0]]
    else:
        colours = [PALETTE[round(i * last / (len(ranges) - 1))] for i in range(len(ranges))]
    steps = [bisect_right(edges, count) - 1 for count in counts]
    return steps, ranges, colours


def coloured(text, colour):
    """text on an xterm-256 background, a newline shown as a coloured return sign before it (a background
    behind a line break shows nothing)."""
    start = f"\x1b[48;5;{colour}m\x1b[{30 if colour not in DARK else 97}m"
    return f"{start}\u21b5\x1b[0m\n".join(f"{start}{part}\x1b[0m" if part else "" for part in text.split("\n"))


def colour_by_routing(pieces, counts, max_count):
    """The text with each token's background coloured by how many routed heads went global for it (of max_count),
    on routing_steps' scale; and the legend: each step's colour with the counts it stands for."""
    steps, ranges, colours = routing_steps(counts, max_count)
    text = "".join(coloured(piece, colours[step]) for piece, step in zip(pieces, steps))
    labels = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges]
    legend = "".join(coloured(f" {label} ", colour) for label, colour in zip(labels, colours))
    return text, legend


def format_timings(t):
    """One line: prefill and decode tokens/s, the KV cache's bytes."""
    rate = lambda n, s: f"{n / s:,.0f} tok/s" if s else "-"
    return (f"[prefill {t['prefill_tokens']:,} tokens, {rate(t['prefill_tokens'], t['prefill_s'])} | decode "
            f"{t['decode_tokens']:,} tokens, {rate(t['decode_tokens'], t['decode_s'])} | KV cache "
            f"{human_bytes(t['cache_bytes'])}]")


def main(argv):
    (cfg,) = parse_args_or_exit(argv, SampleConfig, usage=__doc__)
    device = pick_device(cfg.device)
    model, meta = load_model(cfg.out_dir, device, cfg.router_threshold)
    encode, decode = codec(meta["encoding"], meta.get("chars"))
    prompt = cfg.start
    if prompt.startswith("FILE:"):
        with open(prompt[5:], encoding="utf-8") as f:
            prompt = f.read()
    idx = torch.tensor([encode(prompt)], dtype=torch.long, device=device)
    if idx.shape[1] == 0:
        sys.exit("the prompt is empty: pass --start=TEXT or --start=FILE:path")
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    n_routed = sum(kind == "routed" for kind in model.config.kinds)
    for i in range(cfg.num_samples):
        tokens, timings = timed_generate(model, idx, cfg.max_new_tokens, cfg.temperature, cfg.top_k,
                                         cfg.use_kv_cache, generator)
        tokens = tokens[0]
        if cfg.show_routing and n_routed:
            with torch.no_grad():
                counts = global_heads_per_token(model(tokens[None, -model.config.block_size:]))[0].tolist()
            shown, n_heads = tokens[-len(counts):].tolist(), n_routed * model.config.n_head
            text, legend = colour_by_routing([decode([t]) for t in shown], counts, n_heads)
            print(text)
            print(f"\n[colour: routed heads that went global per token, of {n_heads}, scaled from the fewest to the "
                  f"most in this text; {percent(sum(counts) / (len(counts) * n_heads))} global overall]")
            print(f"[heads global: {legend}]")
        else:
            print(decode(tokens.tolist()))
        print(format_timings(timings))
        print("-" * 40)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
