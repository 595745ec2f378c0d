"""Routing statistics: every number about where routing went and what attention cost, in one place.

train.py logs them (console and TensorBoard), nanoaha/evaluation.py reports them (evaluate.py, prune.py), sample.py
colours tokens by them.

Attention cost is counted in keys read per query (query-key pairs), relative to dense causal attention:
- ideal: what the gates ask for: a global token reads keys 0 .. t, a local one its window and sinks;
- computed: what the kernels computed, as kernels/layer.py counts it where it runs them: 'exact' runs local and
  full attention for every routed token, 'sparse' local for every token plus full for the gated ones, 'sampled'
  the one on a share of the batch's sequences and the other on the rest (forced-global steps run 'exact').
  Tile padding inside a kernel is not counted. Evaluation and generation run 'sparse' whatever the model trains
  in (no gradient needs the full output of a local token), so reports count 'computed' for the mode the model
  trains in (the cost of training on those tokens) and 'inference' for what the pass ran.
"""
import math

import torch
from tqdm import tqdm

from data.synthetic.tasks import UNKNOWN_LABEL
from kernels.layer import keys_read, sequence_keys
from nanoaha.formatting import percent


def training_flops_per_token(config, n_params, computed_flop_frac):
    """FLOPs of one training token (forward and backward), as computed: 6 per parameter (the tied embedding
    counted once, as the output layer's matmul; learned positions are a lookup and left out), plus attention:
    4 * d FLOPs per query-key pair forward (QK^T and AV), 3x that with the backward, over the mean T / 2 keys
    of causal attention per layer, scaled by what the attention computed relative to dense."""
    attention_dense = 6 * config.n_layer * config.n_embd * config.block_size
    positions = config.block_size * config.n_embd if config.position_embedding == "learned" else 0
    return 6 * (n_params - positions) + attention_dense * float(computed_flop_frac)


@torch.no_grad()
def routing_stats(output, config, mode=None):
    """Routing statistics of one forward pass (a model.GPTOutput); `mode` is the routed mode whose cost
    'computed' counts (default: the mode the pass ran in); given, 'model_inference_flop_frac' is what the pass
    itself computed.

    Per layer and head (n_layer, H): 'global_frac', the fraction of tokens whose head attended globally (1 for
    dense layers, 0 for local); 'mean_p', the mean router probability (nan without a learned router). Per
    layer (n_layer,): 'ideal_flop_frac' and 'computed_flop_frac', attention FLOPs relative to dense causal
    attention (see the module docstring). Scalars: 'routed_global_frac' (global decisions / all decisions over
    the routed layers, nan if there are none), 'model_ideal_flop_frac' and 'model_computed_flop_frac' (the
    whole model's attention FLOPs relative to an all-dense model)."""
    T, H, device = output.seq_len, config.n_head, output.logits.device
    pairs = output.logits.shape[0] * H  # (sequence, head) pairs: the layers' counts are summed over them
    dense_keys = keys_read("dense", T, config.window, config.n_sink, device).float()
    local_keys = keys_read("local", T, config.window, config.n_sink, device).float()
    counted = mode or output.routed_mode
    global_frac, mean_p, ideal, computed, ran = [], [], [], [], []
    paths = output.paths or [None] * len(config.kinds)
    for kind, hard, p, keys, layer_paths in zip(config.kinds, output.gates, output.probs, output.attention_keys,
                                                paths):
        if kind == "routed":
            g = hard.float()  # (B, H, T)
            frac = g.mean(dim=(0, 2))
            ideal_keys = (g * dense_keys + (1 - g) * local_keys).mean(dim=(0, 1)).sum()
        else:
            frac = torch.full((H,), 1.0 if kind == "dense" else 0.0, device=device)
            ideal_keys = (dense_keys if kind == "dense" else local_keys).sum()
        ran_keys = keys / pairs  # what the pass's kernels computed (kernels/layer.py), per (sequence, head)
        computed_keys = ran_keys if counted == output.routed_mode or kind != "routed" else \
            sequence_keys(kind, hard, counted, T, config.window, config.n_sink, device=device,
                          paths=layer_paths, exact_frac=config.routed_exact_frac) / pairs  # another mode's
        global_frac.append(frac)
        mean_p.append(p.float().mean(dim=(0, 2)) if p is not None else torch.full((H,), math.nan, device=device))
        ideal.append(ideal_keys / dense_keys.sum())
        computed.append(computed_keys / dense_keys.sum())
        ran.append(ran_keys / dense_keys.sum())
    global_frac, mean_p = torch.stack(global_frac), torch.stack(mean_p)
    ideal, computed = torch.stack(ideal), torch.stack(computed)
    routed = torch.tensor([k == "routed" for k in config.kinds], device=device)
    inference = {} if mode is None else {"model_inference_flop_frac": torch.stack(ran).mean()}
    return {
        "global_frac": global_frac,
        "mean_p": mean_p,
        "ideal_flop_frac": ideal,
        "computed_flop_frac": computed,
        "routed_global_frac": global_frac[routed].mean() if routed.any() else torch.tensor(math.nan),
        "model_ideal_flop_frac": ideal.mean(),
        "model_computed_flop_frac": computed.mean(),
        **inference,
    }


NEAR_THRESHOLD = 0.05  # a decision whose p lies this close to the threshold flips with a small update


def decision_stability(previous, decisions, threshold):
    """How settled the routed decisions are, on the fixed val tokens of one evaluation. decisions: per batch,
    (gates, probs) as the model returned them (per layer a (B, H, T) tensor or None); previous: the last
    evaluation's `gates` (below), or None. Returns per routed layer and head (None for other layers):
    'flicker', the share of the decisions that differ from the previous evaluation's on the same tokens (None at
    the first); 'margin', the mean distance of p from the threshold; 'near', the share of decisions with p within
    NEAR_THRESHOLD of it (margin and near None without learned routers); and 'gates', this evaluation's decisions
    (per layer, all batches), for the next call."""
    layers = len(decisions[0][0])
    def joined(part, i):  # layer i's (N, H, T) over the batches, or None
        first = decisions[0][part][i]
        return None if first is None else torch.cat([d[part][i].float().cpu() for d in decisions])
    gates = [None if g is None else g > 0.5 for g in (joined(0, i) for i in range(layers))]
    probs = [joined(1, i) for i in range(layers)]
    def per_head(x):
        return x.float().mean(dim=(0, 2)).tolist()
    flicker = [None if g is None or previous is None or previous[i] is None or previous[i].shape != g.shape
               else per_head(g != previous[i]) for i, g in enumerate(gates)]
    margin = [None if p is None else per_head((p - threshold).abs()) for p in probs]
    near = [None if p is None else per_head((p - threshold).abs() < NEAR_THRESHOLD) for p in probs]
    return {"flicker": flicker, "margin": margin, "near": near, "gates": gates}


def stability_scalars(stability, flips=None, bias_grads=None):
    """TensorBoard's decision-stability scalars: per routed layer (heads averaged) as val_stability/NAME_layerL,
    per head as val_stability_heads_layerL/NAME_headH (one section per layer, as the global fractions); flips:
    per layer (None where it has no per-head router), the per-head routers' step-by-step changes; bias_grads:
    per layer (None where it has no learned router), each head's mean bias gradient since the last evaluation
    (negative: the loss pulls the head towards global)."""
    values = {}
    named = (*((n, stability[n]) for n in ("flicker", "margin", "near")), ("step_flips", flips or []),
             ("bias_grad", bias_grads or []))
    for name, per_layer in named:
        for layer, heads in enumerate(per_layer):
            if heads is None:
                continue
            values[f"val_stability/{name}_layer{layer}"] = sum(heads) / len(heads)
            values.update({f"val_stability_heads_layer{layer}/{name}_head{h}": v for h, v in enumerate(heads)})
    return values


def mean_stats(stats_list):
    """Elementwise mean of several routing_stats dicts (of equal-sized batches), on the CPU."""
    return {k: torch.stack([s[k].float().cpu() for s in stats_list]).mean(0) for k in stats_list[0]}


def routing_summary(stats, kinds):
    """Global fraction of the routed layers (overall, per layer, per head; None where a layer is not routed)
    and the model's attention FLOPs vs dense, ideal, computed (and at inference, where evaluation measured it),
    as plain numbers (for JSON)."""
    routed, frac = [kind == "routed" for kind in kinds], stats["routed_global_frac"].item()
    return {
        "global_frac": None if math.isnan(frac) else frac,
        "global_frac_per_layer": [frac.mean().item() if r else None for frac, r in zip(stats["global_frac"], routed)],
        "global_frac_per_head": [frac.tolist() if r else None for frac, r in zip(stats["global_frac"], routed)],
        "attention_flop_frac_ideal": stats["model_ideal_flop_frac"].item(),
        "attention_flop_frac_computed": stats["model_computed_flop_frac"].item(),
        **({"attention_flop_frac_inference": stats["model_inference_flop_frac"].item()}
           if "model_inference_flop_frac" in stats else {}),
    }


def format_routing(stats):
    """The log line's routing part: global fraction, then attention FLOPs vs dense, ideal and computed."""
    frac = stats["routed_global_frac"].item()
    glob = "" if math.isnan(frac) else f"global {percent(frac)} "
    return (f"{glob}attn-FLOPs ideal {percent(stats['model_ideal_flop_frac'].item(), 0)} "
            f"computed {percent(stats['model_computed_flop_frac'].item(), 0)}")


def tensorboard_scalars(prefix, stats, kinds):
    """What the logger writes: the model-level numbers under `prefix`, the routed layers' global fraction and
    mean p under `prefix`_layers, each head's global fraction under `prefix`_heads (nan values left out)."""
    values = {f"{prefix}/global_frac": stats["routed_global_frac"].item(),
              f"{prefix}/attention_flop_frac_ideal": stats["model_ideal_flop_frac"].item(),
              f"{prefix}/attention_flop_frac_computed": stats["model_computed_flop_frac"].item()}
    for layer, kind in enumerate(kinds):
        if kind != "routed":
            continue
        values[f"{prefix}_layers/global_frac_layer{layer}"] = stats["global_frac"][layer].mean().item()
        values[f"{prefix}_layers/mean_p_layer{layer}"] = stats["mean_p"][layer].mean().item()
        for head, frac in enumerate(stats["global_frac"][layer].tolist()):
            values[f"{prefix}_heads/layer{layer}_head{head}"] = frac
    return {k: v for k, v in values.items() if not math.isnan(v)}


def collapsed_layers(stats, kinds, threshold, decided=()):
    """Routed layers with learned routers (random routing has no p: its rate is a setting, not a collapse) whose
    global fraction (heads averaged) is below threshold; decided: layers that chose to be local rather than
    collapsed into it (every head committed to a path, router_commit_after; or given no head by a budget of
    heads, router_global_heads)."""
    return [i for i, kind in enumerate(kinds) if kind == "routed" and i not in decided
            and not stats["mean_p"][i].isnan().all() and stats["global_frac"][i].mean().item() < threshold]


def warn_collapse(stats, kinds, threshold, step, decided=()):
    """A routed layer whose heads (almost) never go global gets no gradient through its full-attention path,
    so it rarely recovers: say so loudly, with what to try. Returns the collapsed layers (collapsed_layers)."""
    collapsed = collapsed_layers(stats, kinds, threshold, decided)
    if collapsed:
        layers = ", ".join(f"{i} ({percent(stats['global_frac'][i].mean().item(), 2)} global, mean p "
                           f"{stats['mean_p'][i].mean().item():.3f})" for i in collapsed)
        tqdm.write(f"WARNING step {step}: router collapse in layer(s) {layers}: global attention is switched off. "
                   "Try p_dense > 0, a later router_lambda_start, a longer ramp or router_budget > 0.")
    return collapsed


def global_heads_per_token(output):
    """(B, T): per token, the number of (routed layer, head) pairs that attended globally; None without routed
    layers."""
    gates = [g.sum(1) for g in output.gates if g is not None]
    return torch.stack(gates).sum(0) if gates else None


def label_counts(gate, labels):
    """Counts of a gate (bool, any shape) against needs_global labels of the same shape: [gated and needed,
    gated and known not needed, needed but not gated, gated, tokens]. Unknown labels count only in the last
    two."""
    known, needed = labels != UNKNOWN_LABEL, labels == 1
    return torch.tensor([(gate & needed).sum(), (gate & known & ~needed).sum(), (~gate & needed).sum(),
                         gate.sum(), gate.numel()], dtype=torch.float64)


def ratio(a, b):
    return (a / b).item() if b > 0 else math.nan


def precision_recall(counts):
    """(global fraction, precision, recall) from summed label_counts. Precision: of the tokens routed global,
    the fraction that need it; recall: of the tokens that need it, the fraction routed global."""
    return ratio(counts[3], counts[4]), ratio(counts[0], counts[0] + counts[1]), ratio(counts[0], counts[0] + counts[2])


def kv_cache_bytes(config, context_length, bytes_per_element=4, window_heads=None):
    """Bytes of one sequence's KV cache at context_length positions, as GPT.new_cache keeps it: keys and
    values of every head; a head that reads only its window (every head of a local layer) holds the last
    `window` positions and the first n_sink, the others every position (any later query may go global).
    window_heads: per layer, those heads (GPT.window_heads: with a routed layer's heads committed local);
    default the config's local layers."""
    head_dim = config.n_embd // config.n_head
    if window_heads is None:
        window_heads = [range(config.n_head) if kind == "local" else () for kind in config.kinds]
    window = min(context_length, config.window + config.n_sink)
    return sum(2 * head_dim * bytes_per_element * (len(heads) * window + (config.n_head - len(heads)) * context_length)
               for heads in window_heads)
