"""One layer's attention, every kind and both paths in one place: a whole sequence (training, evaluation, the
prefill) through kernels.attention.attention, or new tokens against a KV cache (decode), reading only the window
where a decision is local. It routes (it calls the layer's router, after the local output where the router reads
it), runs the kernels, and counts the query-key pairs it computed: the routing statistics read that count
(nanoaha/routing_stats.py) instead of re-deriving what ran.

    layer_attention(q, k, v, kind, window, n_sink, route=..., sees_local=..., mode=..., backend=..., cache=...,
                    paths=..., exact_frac=...)

route(local, token) -> (hard, gate, p): the layer's routing decision; local is the heads' local output where the
router reads it (sees_local), else None; token None decides for the whole sequence, an int for that position of
the new tokens (decode). cache: duck-typed like model.KVCache (write, length, window_keys, all_keys, full_slots).
paths (routed layers): None, every head routed, or one int per head: -1 routed, 0 committed to local, 1 committed
to global; a committed head computes only its path (its router's decision must be that path).
mode: 'exact' or 'sparse' (kernels/attention.py), or 'sampled': the first exact_rows(B, exact_frac) sequences of
the batch run 'exact' and carry the router's straight-through gradient, scaled by B / rows (an unbiased estimate
of exact mode's), the others run 'sparse' with no router gradient; so training computes the ideal cost plus
exact_frac of what 'exact' adds.
"""
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels.attention import attention
from kernels.gates import head_index


class LayerAttention(NamedTuple):
    y: torch.Tensor             # (B, H, T, D)
    hard: torch.Tensor | None   # bool (B, H, T): the routed decisions (None unless routed)
    p: torch.Tensor | None      # router probability (B, H, T) (None without a learned router)
    keys: torch.Tensor          # query-key pairs the kernels computed, summed over batch, heads and queries


def keys_read(kind, T, window, n_sink, device=None):
    """Keys each query position of a sequence reads: (T,) for 'dense' and 'local' kinds."""
    t = torch.arange(T, device=device)
    if kind == "dense":
        return t + 1
    return torch.clamp(t + 1, max=window) + torch.clamp(t + 1 - window, min=0).clamp(max=n_sink)


def exact_rows(B, exact_frac):
    """'sampled' mode: how many of a batch's B sequences (the first ones) run 'exact', at least one."""
    return min(B, max(1, round(B * exact_frac)))


def sequence_keys(kind, hard, mode, T, window, n_sink, B=1, H=1, device=None, paths=None, exact_frac=None):
    """Query-key pairs a whole-sequence call computes, summed over (B, H, T): dense and local read their keys;
    a routed layer reads the window for every token, plus every causal key for every token ('exact', which
    needs the full output for the straight-through gradient) or for the global ones only ('sparse'), or each
    for its rows ('sampled', exact_frac). hard: bool (B, H, T) for routed layers. paths: a routed layer's heads
    committed to local or global (head_groups) read that kind's keys alone."""
    if mode == "sampled" and kind == "routed":
        n = exact_rows(hard.shape[0], exact_frac)
        exact = sequence_keys(kind, hard[:n], "exact", T, window, n_sink, device=device, paths=paths)
        return exact if n == hard.shape[0] else \
            exact + sequence_keys(kind, hard[n:], "sparse", T, window, n_sink, device=device, paths=paths)
    groups = head_groups(paths, kind, None if hard is None else hard.shape[1])
    if groups is not None:
        return sum(sequence_keys(group, hard[:, head_index(heads)] if group == "routed" else None, mode, T, window,
                                 n_sink, hard.shape[0], len(heads), device) for group, heads in groups.items())
    if kind != "routed":
        return B * H * keys_read(kind, T, window, n_sink, device).float().sum()
    dense = keys_read("dense", T, window, n_sink, device).float()
    local = keys_read("local", T, window, n_sink, device).float()
    B, H = hard.shape[:2]
    full = B * H * dense.sum() if mode == "exact" else (hard.float() * dense).sum()
    return B * H * local.sum() + full


PATHS = {-1: "routed", 0: "local", 1: "dense"}  # a head's path -> the kind of attention it runs


def head_groups(paths, kind, H):
    """{kind: [heads]} of a routed layer whose heads have committed to a path (PATHS; empty groups left out),
    None where every head is routed (paths None or all -1: the layer runs as one routed call)."""
    if paths is None:
        return None
    if kind != "routed":
        raise ValueError(f"paths={paths!r} is for routed layers (which heads committed to a path); "
                         f"a {kind} layer takes paths=None")
    if not isinstance(paths, (tuple, list)) or len(paths) != H or \
            any(isinstance(path, bool) or path not in PATHS for path in paths):
        raise ValueError(f"paths={paths!r} needs one path per head ({H} heads): -1 routed, 0 committed to local, "
                         f"1 committed to global")
    if all(path == -1 for path in paths):
        return None
    groups = {PATHS[path]: [h for h, each in enumerate(paths) if each == path] for path in PATHS}
    return {group: heads for group, heads in groups.items() if heads}


def layer_attention(q, k, v, kind, window, n_sink=0, route=None, sees_local=False, mode="exact", backend="auto",
                    cache=None, paths=None, exact_frac=None):
    """q, k, v: (B, H, T, D) of the new positions. Returns LayerAttention. A cache that holds positions already
    takes the decode path; an empty one is filled by the sequence path (the prefill)."""
    B, H, T, _ = q.shape
    groups = head_groups(paths, kind, H)
    if cache is not None and cache.length > 0:  # a committed head's decision is its path: decode needs no split
        return _decode(q, k, v, kind, route, sees_local, cache)
    hard = gate = p = local = None
    if kind == "routed":
        if sees_local:  # computed once: the router reads it, the routed kernel combines it
            local = attention(q, k, v, kind="local", window=window, n_sink=n_sink, backend=backend)
        hard, gate, p = route(local, None)
    if mode == "sampled" and kind == "routed":
        y = _sampled_attention(q, k, v, groups, window, n_sink, gate, backend, local, exact_rows(B, exact_frac))
    else:  # a mode means nothing to a dense or local layer
        y = _sequence_attention(q, k, v, kind, groups, window, n_sink, gate, "exact" if mode == "sampled" else mode,
                                backend, local)
    if cache is not None:
        cache.write(k, v)
    return LayerAttention(y, hard, p, sequence_keys(kind, hard, mode, T, window, n_sink, B, H, q.device, paths,
                                                    exact_frac))


def _sequence_attention(q, k, v, kind, groups, window, n_sink, gate, mode, backend, local):
    if groups is None:
        return attention(q, k, v, kind=kind, window=window, n_sink=n_sink, gate=gate, mode=mode, backend=backend,
                         local=local)
    return _committed_attention(q, k, v, groups, window, n_sink, gate, mode, backend, local)


def _sampled_attention(q, k, v, groups, window, n_sink, gate, backend, local, n):
    """'sampled' mode: the first n sequences exact, their gate's gradient scaled by B / n (the router's
    straight-through gradient from a sample of the batch, unbiased: the penalty still sees every token); the
    other sequences sparse, their gate detached (sparse mode's gradient, from gated tokens only, is one-sided)."""
    B = q.shape[0]
    hard = gate.detach()
    exact_gate = hard[:n] + (gate[:n] - hard[:n]) * (B / n)
    def rows(x, part):
        return None if x is None else x[part]
    first, rest = slice(None, n), slice(n, None)
    y = _sequence_attention(q[first], k[first], v[first], "routed", groups, window, n_sink, exact_gate, "exact",
                            backend, rows(local, first))
    if n == B:
        return y
    y_rest = _sequence_attention(q[rest], k[rest], v[rest], "routed", groups, window, n_sink, hard[rest], "sparse",
                                 backend, rows(local, rest))
    return torch.cat([y, y_rest])


def _committed_attention(q, k, v, groups, window, n_sink, gate, mode, backend, local):
    """A routed layer with committed heads: each group of heads runs its own kind (head_groups), the routed ones
    with their gates; the outputs are written back in head order."""
    y = None
    for kind, heads in groups.items():
        i = head_index(heads)
        if kind == "local" and local is not None:
            out = local[:, i]  # the router's local output: not computed again
        else:
            routed = kind == "routed"
            out = attention(q[:, i], k[:, i], v[:, i], kind=kind, window=window, n_sink=n_sink,
                            gate=gate[:, i] if routed else None, mode=mode, backend=backend,
                            local=local[:, i] if routed and local is not None else None)
        if len(heads) == q.shape[1]:
            return out  # every head committed to one path
        if y is None:
            y = out.new_empty(q.shape)
        y[:, i] = out  # autograd records the copy: each group's gradient is its heads' slice
    return y


def _decode(q, k, v, kind, route, sees_local, cache):
    """New queries against the KV cache, one at a time: a local decision reads only the sinks and the window, a
    global one every cached key; no mask is built. Routed layers attend over the window for every head, then
    over the full cache for the global heads only. A router that reads the local output decides each token
    here, once its window output exists; another decides all new tokens first."""
    B, H, T, D = q.shape
    hard = p = None
    if kind == "routed" and not sees_local:
        hard, _, p = route(None, None)
    ys, hards, ps, keys = [], [], [], 0  # a number until a routed layer adds its global heads' keys (a tensor)
    for t in range(T):
        one = slice(t, t + 1)
        cache.write(k[:, :, one], v[:, :, one])
        if kind == "dense":
            all_k, all_v = cache.all_keys()
            ys.append(F.scaled_dot_product_attention(q[:, :, one], all_k, all_v))
            keys += B * H * all_k.shape[2]
            continue
        window_k, window_v = cache.window_keys()
        y = F.scaled_dot_product_attention(q[:, :, one], window_k, window_v)
        keys += B * H * window_k.shape[2]
        if kind == "routed":
            if sees_local:
                hard_t, _, p_t = route(y, t)
            else:
                hard_t, p_t = hard[:, :, one], None if p is None else p[:, :, one]
            y = _decode_global(q[:, :, one], y, hard_t, cache)
            keys = keys + hard_t.sum() * cache.length  # a tensor: no host sync on the GPU
            hards.append(hard_t)
            ps.append(p_t)
        ys.append(y)
    def joined(parts):
        return parts[0] if len(parts) == 1 else torch.cat(parts, 2)
    if kind == "routed":
        hard, p = joined(hards), None if ps[0] is None else joined(ps)
    return LayerAttention(joined(ys), hard, p, torch.as_tensor(keys, device=q.device))


def _decode_global(q, y, hard, cache):
    """A routed layer's decode step after its window output y: the full cache for the global heads. The cache's
    all_keys may hold only some heads (model.SplitKVCache: heads fixed to the local path keep a window);
    its full_slots gives each head's index there."""
    B, H, T, D = q.shape
    slots = cache.full_slots  # None: all_keys holds every head, in head order
    if not decode_gathers(q):  # the CPU reads each global head's keys where they are (a gather copies them)
        heads = [i for i, is_global in enumerate(hard.reshape(B * H).tolist()) if is_global]
        if not heads:
            return y
        keys, values = cache.all_keys()
        for i in heads:  # 4-D slices: SDPA's fused CPU kernel (2-D ones take a path ~3x slower at 8K keys)
            b, h = divmod(i, H)
            slot = h if slots is None else slots[h]
            one, kept = (slice(b, b + 1), slice(h, h + 1)), (slice(b, b + 1), slice(slot, slot + 1))
            y[one] = F.scaled_dot_product_attention(q[one], keys[kept], values[kept])
        return y
    if not hard.any():
        return y
    keys, values = cache.all_keys()
    heads = hard.reshape(B * H).nonzero().squeeze(1)  # the (batch, head) pairs that went global
    kept = heads if slots is None else heads // H * keys.shape[1] + cache.slot_index(heads.device)[heads % H]
    keys, values = (x.reshape(-1, x.shape[2], D)[kept] for x in (keys, values))
    full = F.scaled_dot_product_attention(q.reshape(B * H, 1, D)[heads], keys, values)
    return y.reshape(B * H, 1, D).index_copy(0, heads, full).view(B, H, 1, D)


def decode_gathers(q):
    """Whether decode gathers the global heads' keys into one attention call (CUDA: one launch, no host sync
    per head) rather than attending head by head where the keys lie (the CPU: no copy)."""
    return q.is_cuda
