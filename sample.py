"""Generate text from a checkpoint and show which tokens went global.

    python sample.py --out_dir=out/quickstart --start="def " --show_routing
    python sample.py --out_dir=out/quickstart --start=FILE:prompt.txt --temperature=0 --router_threshold=0.7
"""
import sys
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


def colour_by_routing(pieces, counts, max_count):
    """ANSI background colours from blue (all local) to red (all heads global)."""
    palette = [17, 18, 19, 20, 54, 90, 126, 160, 196]
    out = []
    for piece, count in zip(pieces, counts):
        colour = palette[round(count / max_count * (len(palette) - 1))] if max_count else palette[0]
        out.append(f"\x1b[48;5;{colour}m\x1b[97m{piece}\x1b[0m")
    return "".join(out)


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
            shown = tokens[-len(counts):].tolist()
            print(colour_by_routing([decode([t]) for t in shown], counts, n_routed * model.config.n_head))
            print(f"\n[colour: heads that went global per token, of {n_routed * model.config.n_head}; "
                  f"{percent(sum(counts) / (len(counts) * n_routed * model.config.n_head))} global overall]")
        else:
            print(decode(tokens.tolist()))
        print(format_timings(timings))
        print("-" * 40)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
