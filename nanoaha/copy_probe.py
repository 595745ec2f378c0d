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
- global: the share of the second copy's queries that went global (routed layers; 1 dense, 0 local);
- routed layers only: the previous-token score over a head's local decisions and over its global ones, and the
  induction score over its global ones: whether a head keeps its function when it goes global.
"""
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from model import apply_rotary
from nanoaha.checkpoint import load_model
from nanoaha.device import autocast_context, pick_dtype
from nanoaha.evaluation import eval_data, trained_data_dir
from kernels.reference import attention_weights, causal_mask, local_mask

DEFAULT_SPAN = 256
DEFAULT_N_SPANS = 32


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
    return attention_weights(q, k, mask)


def head_sums(weights, span, window, hard=None):
    """{score: ((H,) sum, (H,) count)} of one layer's weights (B, H, 2 * span, 2 * span) on repeated spans
    (module docstring), summed so that batches pool exactly; hard: that layer's (B, H, T) routing decisions,
    None for dense or local layers (whose global share copy_probe fills in)."""
    T = weights.shape[-1]
    t = torch.arange(T, device=weights.device)
    second = t[span:]
    previous = weights[:, :, t[1:], t[1:] - 1]
    induction = weights[:, :, second, second - span + 1]
    far = (weights[:, :, :span, :span] * (t[:span, None] - t[None, :span] >= window)).sum(-1)
    sums = {"induction": sum_where(induction), "previous": sum_where(previous), "far": sum_where(far)}
    if hard is not None:
        sums["global"] = sum_where(hard[:, :, span:].float())
        sums["previous_when_local"] = sum_where(previous, ~hard[:, :, 1:])
        sums["previous_when_global"] = sum_where(previous, hard[:, :, 1:])
        sums["induction_when_global"] = sum_where(induction, hard[:, :, span:])
    return sums


def sum_where(values, where=None):
    """((H,) sum, (H,) count) of values (B, H, N) over the entries where `where` holds (all: None)."""
    if where is None:
        return values.sum((0, 2)), torch.full(values.shape[1:2], values.shape[0] * values.shape[2], dtype=values.dtype)
    where = where.to(values.dtype)
    return (values * where).sum((0, 2)), where.sum((0, 2))


def head_scores(sums):
    """{score: [one mean per head]} from head_sums (pooled); nan for a head with no such decision."""
    return {name: (total / count).tolist() for name, (total, count) in sums.items()}


def copy_probe(model, sequences, batch_size=8, autocast=None):
    """The probe on a model (eval mode) and sequences (n, 2 * span) from probe_sequences, batch_size at a time:
    {"span", "n_spans", "first_loss", "second_loss", "copy_gain", "layers": [{"kind", score: [one per head]}]}."""
    span = sequences.shape[1] // 2
    loss_sums, layer_sums = torch.zeros(2), {}
    for batch in sequences.split(batch_size):
        losses, sums = probe_batch(model, batch, autocast)
        loss_sums += losses
        for i, layer in sums.items():
            for name, (total, count) in layer.items():
                old = layer_sums.setdefault(i, {}).get(name)
                layer_sums[i][name] = (total, count) if old is None else (old[0] + total, old[1] + count)
    first, second = (loss_sums / (sequences.shape[0] * (span - 1))).tolist()
    layers = []
    for i, block in enumerate(model.blocks):
        scores = head_scores(layer_sums[i])
        if "global" not in scores:
            scores["global"] = [1.0 if block.attn.kind == "dense" else 0.0] * block.attn.n_head
        layers.append({"kind": block.attn.kind, **scores})
    return {"span": span, "n_spans": sequences.shape[0], "first_loss": first, "second_loss": second,
            "copy_gain": first - second, "layers": layers}


def probe_batch(model, sequences, autocast=None):
    """((2,) summed losses on the first and second copy's targets, {layer: head_sums}) of one batch."""
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
    first, second = losses[:, :span - 1].sum(), losses[:, span:].sum()
    with torch.no_grad():
        sums = {i: head_sums(layer_weights(attn, x, cos, sin, hard), span, model.config.window, hard)
                for i, (attn, x, cos, sin, hard) in found.items()}
    return torch.stack([first, second]).cpu(), {i: {k: (t.cpu(), c.cpu()) for k, (t, c) in s.items()}
                                                 for i, s in sums.items()}


def probe_checkpoint(path, data_dir="", span=DEFAULT_SPAN, n_spans=DEFAULT_N_SPANS, batch_size=8, device="cpu",
                     dtype="float32"):
    """copy_probe on a checkpoint's model over n_spans spans of its val split (batch_size at a time), random
    routing drawn under seed 0."""
    model, _ = load_model(path, device)
    if 2 * span > model.config.block_size:
        raise ValueError(f"span={span}: two copies ({2 * span} tokens) exceed {path}'s block_size "
                         f"{model.config.block_size}: lower --span")
    if span <= model.config.window:
        raise ValueError(f"span={span} is within the window ({model.config.window}): the copy would be local; "
                         f"use a span longer than the window")
    data_dir = data_dir or trained_data_dir(path)
    data = eval_data(data_dir, model.config, f"checkpoint {path}")
    sequences = probe_sequences(data.tokens("val"), span, n_spans).to(device)
    torch_dtype = pick_dtype(dtype, device)
    torch.manual_seed(0)
    result = copy_probe(model, sequences, batch_size, autocast_context(device, torch_dtype))
    return {"checkpoint": path, "data_dir": data_dir, "window": model.config.window,
            "layers_kinds": model.config.layer_letters, **result}


def training_spans(data, block_size, window, n_spans):
    """The probe sequences of train.py's evaluations: n_spans val spans (fewer where the val split is short) of
    min(DEFAULT_SPAN, block_size // 2) tokens; None where no span longer than the window fits or n_spans is 0."""
    span, tokens = min(DEFAULT_SPAN, block_size // 2), data.tokens("val")
    n_spans = min(n_spans, len(tokens) // span) if span > window else 0
    return probe_sequences(tokens, span, n_spans) if n_spans else None


HEAD_SCORES = ("previous", "induction", "global")  # what training keeps per layer and head at each evaluation


def probe_during_training(model, sequences, autocast=None):
    """(copy gain, [each layer's strongest induction score], {score: [[one per head] per layer]} for HEAD_SCORES)
    of the model now, on a forked RNG seeded 0 (random routing neither moves training's RNG nor varies between
    evaluations); the model's mode is restored. The per-head scores say when a head gains or loses its function
    (a local previous-token head, a copy head) along training."""
    was_training = model.training
    model.eval()
    devices = [sequences.device] if sequences.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(0)
            result = copy_probe(model, sequences, autocast=autocast)
    finally:
        model.train(was_training)
    heads = {score: [layer[score] for layer in result["layers"]] for score in HEAD_SCORES}
    return result["copy_gain"], [max(layer["induction"]) for layer in result["layers"]], heads
