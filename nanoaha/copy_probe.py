"""The repeat probe: does a model copy from beyond its window, and which heads do it? probe.py is the command.

Each probe sequence is a span of `span` val tokens followed by the same span again; with span > window the
second copy's source lies beyond every local window. A model that copies predicts the second copy better than
the first: the copy gain is the mean loss on the first copy's targets minus the mean loss on the same targets in
the second copy (nats; the target after the boundary, whose first occurrence had no context, is left out).
Per layer and head, from the attention weights each (head, token) used, its routing decision included:
- induction: the mean weight a second-copy query at t puts on key t - span + 1, the token after the earlier
  occurrence of its own token: what a copy head reads (the induction heads of Olsson et al., 2022);
- previous: the mean weight a query at t puts on key t - 1, what the layer under a copy head provides;
- far: the mean weight on keys beyond the window (t - s >= window; sinks included) over the first copy, i.e. on ordinary text:
  how much of the head's attention long context takes;
- global: the share of the second copy's queries that went global (routed layers; 1 dense, 0 local).
"""
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from model import apply_rotary
from nanoaha.checkpoint import load_model
from nanoaha.device import autocast_context, pick_dtype
from nanoaha.evaluation import eval_data, trained_data_dir
from nanoaha.kernels.reference import causal_mask, local_mask

DEFAULT_SPAN = 256
DEFAULT_N_SPANS = 32
SCORES = ("induction", "previous", "far", "global")


def probe_sequences(tokens, span, n_spans):
    """(n_spans, 2 * span) int64: n_spans spans of `tokens` (evenly spaced, not overlapping), each repeated."""
    if span < 2:
        raise ValueError(f"span={span}: a span needs at least 2 tokens (a target after the first)")
    if n_spans < 1:
        raise ValueError(f"n_spans={n_spans}: probe at least one span")
    stride = len(tokens) // n_spans
    if stride < span:
        raise ValueError(f"{n_spans} spans of {span} tokens do not fit in {len(tokens):,} val tokens without "
                         f"overlapping: lower --n_spans or --span")
    spans = torch.stack([torch.as_tensor(tokens[i * stride:i * stride + span].astype("int64"))
                         for i in range(n_spans)])
    return torch.cat([spans, spans], dim=1)


def layer_weights(attn, x, cos, sin, hard):
    """(B, H, T, T) fp32 attention weights of one Attention module on its input x, as the model used them:
    dense layers the causal mask, local ones the window (and sinks), routed ones per (head, token) the
    causal mask where hard (B, H, T) is True, else the window."""
    B, T, _ = x.shape
    qkv = attn.qkv(x).view(B, T, 3, attn.n_head, attn.head_dim).permute(2, 0, 3, 1, 4).float()
    q, k = apply_rotary(qkv[:2], cos, sin) if cos is not None else qkv[:2]
    cfg = attn.config
    causal, local = causal_mask(T, x.device), local_mask(T, cfg.window, cfg.n_sink, x.device)
    if attn.kind == "dense":
        mask = causal
    elif attn.kind == "local":
        mask = local
    else:
        mask = torch.where(hard[..., None], causal, local)
    scores = (q @ k.transpose(-1, -2)) * attn.head_dim ** -0.5
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def head_scores(weights, span, window, hard=None):
    """{score: (H,) tensor} of one layer's weights (B, H, 2 * span, 2 * span) on repeated spans (module
    docstring); hard: that layer's (B, H, T) routing decisions, None for dense (1) or local (0) layers, whose
    global share is given by the caller."""
    T = weights.shape[-1]
    t = torch.arange(T, device=weights.device)
    second = t[span:]
    scores = {
        "induction": weights[:, :, second, second - span + 1].mean((0, 2)),
        "previous": weights[:, :, t[1:], t[1:] - 1].mean((0, 2)),
        "far": (weights[:, :, :span, :span] * (t[:span, None] - t[None, :span] >= window)).sum(-1).mean((0, 2)),
    }
    if hard is not None:
        scores["global"] = hard[:, :, span:].float().mean((0, 2))
    return scores


def copy_probe(model, sequences, autocast=None):
    """The probe on a model (eval mode) and sequences (n, 2 * span) from probe_sequences: {"copy_gain",
    "first_loss", "second_loss", "layers": [{"kind", score: [one per head]}]}."""
    span = sequences.shape[1] // 2
    found = {}

    def keep(module, args, output):
        x, cos, sin = args[:3]
        found[module.layer] = (module, x.detach().float(), cos, sin, output[1])

    hooks = [block.attn.register_forward_hook(keep) for block in model.blocks]
    ignored_last = torch.full_like(sequences[:, :1], -1)  # the last position has no target
    try:
        with torch.no_grad(), autocast or nullcontext():
            out = model(sequences, targets=torch.cat([sequences[:, 1:], ignored_last], 1))
    finally:
        for hook in hooks:
            hook.remove()
    losses = F.cross_entropy(out.logits[:, :-1].float().transpose(1, 2), sequences[:, 1:], reduction="none")
    # position p predicts token p + 1: targets 1 .. span - 1 of the first copy, the same tokens in the second
    first, second = losses[:, :span - 1].mean().item(), losses[:, span:].mean().item()
    layers = []
    with torch.no_grad():
        for i in range(len(model.blocks)):
            attn, x, cos, sin, hard = found[i]
            scores = head_scores(layer_weights(attn, x, cos, sin, hard), span, model.config.window, hard)
            if hard is None:
                scores["global"] = torch.full((attn.n_head,), 1.0 if attn.kind == "dense" else 0.0)
            layers.append({"kind": attn.kind, **{name: scores[name].tolist() for name in SCORES}})
    return {"span": span, "n_spans": sequences.shape[0], "first_loss": first, "second_loss": second,
            "copy_gain": first - second, "layers": layers}


def mean_results(results):
    """The mean of copy_probe results over equal-sized batches (every number averaged)."""
    def mean(values):
        first = values[0]
        if isinstance(first, dict):
            return {key: mean([v[key] for v in values]) for key in first}
        if isinstance(first, list):
            return [mean(list(column)) for column in zip(*values)]
        if isinstance(first, str):
            return first
        return sum(values) / len(values)
    return {**mean(results), "span": results[0]["span"], "n_spans": sum(r["n_spans"] for r in results)}


def probe_checkpoint(path, data_dir="", span=DEFAULT_SPAN, n_spans=DEFAULT_N_SPANS, batch_size=8, device="cpu",
                     dtype="float32"):
    """copy_probe on a checkpoint's model over n_spans spans of its val split (in batches of batch_size;
    n_spans rounded down to whole batches), random routing drawn under seed 0."""
    model, _ = load_model(path, device)
    if 2 * span > model.config.block_size:
        raise ValueError(f"span={span}: two copies ({2 * span} tokens) exceed {path}'s block_size "
                         f"{model.config.block_size}: lower --span")
    if span <= model.config.window:
        raise ValueError(f"span={span} is within the window ({model.config.window}): the copy would be local; "
                         f"use a span longer than the window")
    data_dir = data_dir or trained_data_dir(path)
    data = eval_data(data_dir, model.config, f"checkpoint {path}")
    batch_size = min(batch_size, n_spans)
    sequences = probe_sequences(data.tokens("val"), span, n_spans - n_spans % batch_size).to(device)
    torch_dtype = pick_dtype(dtype, device)
    torch.manual_seed(0)
    results = [copy_probe(model, batch, autocast_context(device, torch_dtype))
               for batch in sequences.split(batch_size)]
    return {"checkpoint": path, "data_dir": data_dir, "window": model.config.window,
            "layers_kinds": model.config.layer_letters, **mean_results(results)}
