"""Prefill and decode time of GPT.generate, measured from outside the model: sample.py and bench/generate.py
report it. A step runs from the start of one forward pass to the start of the next (or the end), so it counts
the sampling of its token too; on CUDA every boundary synchronizes, since kernels run asynchronously."""
import time

import torch


def timed_generate(model, idx, *args, **kwargs):
    """model.generate(idx, *args, **kwargs) -> (tokens, timings). timings: seconds and tokens (batch x tokens
    fed) of prefill (a pass over a whole context: the prompt, each cache refill, every step without the cache)
    and of decode (one token against the KV cache), and the cache's largest size in bytes."""
    timings = {"prefill_s": 0.0, "prefill_tokens": 0, "decode_s": 0.0, "decode_tokens": 0, "cache_bytes": 0}
    running = []  # the step under way: (phase, tokens fed, start time)

    def clock():
        if idx.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def end_step(now):
        if running:
            phase, fed, start = running.pop()
            timings[f"{phase}_s"] += now - start
            timings[f"{phase}_tokens"] += fed

    def before_forward(module, args, kwargs):
        now, cache = clock(), kwargs.get("cache")
        end_step(now)
        running.append(("decode" if cache and cache[0].length > 0 else "prefill", args[0].numel(), now))

    def after_forward(module, args, kwargs, output):
        cache = kwargs.get("cache")
        if cache:
            timings["cache_bytes"] = max(timings["cache_bytes"], sum(c.bytes for c in cache))

    hooks = [model.register_forward_pre_hook(before_forward, with_kwargs=True),
             model.register_forward_hook(after_forward, with_kwargs=True)]
    try:
        tokens = model.generate(idx, *args, **kwargs)
        end_step(clock())
    finally:
        for hook in hooks:
            hook.remove()
    return tokens, timings
