"""nanoAHA: a GPT whose attention layers are dense, local (sliding window) or routed (All-or-Here).

Where things are:
- Router.forward              per-head router: logits from the layer input (and optionally the head's local
                              attention output), sigmoid, hard threshold, STE
- Attention.forward           q, k, v and the router, then kernels/layer.py: the layer's attention for a whole
                              sequence or per cached token, and the query-key pairs it computed
- run_mode                    which routed mode a call runs ('exact', 'sparse' or 'sampled')
- Routing                     how one call's routed layers decide (mode, threshold, forced global or local)
- router_penalty              the loss is LM loss + lambda * mean router probability (the L1 penalty)
- check_model_config          (the end of the file) the config's one-line errors
- nanoaha/routing_stats.py    global fraction, mean p, ideal and computed attention FLOPs per layer and head
- kernels/layer.py            one layer's attention (sequence and decode) and the pairs it computed
- kernels/attention.py        attention(), the one entry point (reference / torch / triton backends)
"""
import dataclasses
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.attention import BACKENDS
from kernels.layer import layer_attention

KIND_OF_LETTER = {"G": "dense", "L": "local", "R": "routed"}
ROUTED_MODES = ("exact", "sparse", "sampled")
RUNTIME_KEYS = {"attention_backend", "routed_mode", "routed_exact_frac", "router_threshold",
                "router_explore"}  # may change between runs


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 1024
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    schedule: str = "R"             # one letter per layer, repeated to n_layer: G dense, L local, R routed
    window: int = 32                # a local query at t sees keys t-window+1 .. t
    n_sink: int = 0                 # ... plus the first n_sink positions
    routing: str = "learned"        # 'learned' router, or 'random': global with probability random_global_q
    random_global_q: float | list = 0.1  # one rate, or one per layer (to match a learned model layer by layer),
                                         # a layer's rate may be one per head: [1, 0, 0, 0] is one fixed global head
    router_threshold: float = 0.5   # gate = p >= threshold; may be changed at inference
    router_init_bias: float = 0.0   # 0 with zero weights: p = 0.5 >= 0.5, so step 0 is all-global
    router_init_std: float = 0.0
    router_explore: float = 0.0     # training only: this fraction of local decisions runs global anyway, so
                                    # routers that went local still learn what global would have given
    router_sees_local: bool = False  # each head's router also reads that head's local attention output (what
                                    # the window already found), not only the layer input
    router_per_token: bool = True   # False: one learned decision per head for every token, p = sigmoid(b_h)
                                    # with no input (a per-head schedule the model learns); with routing='random',
                                    # one draw per head and sequence instead of per token
    router_global_heads: int = 0    # > 0: a budget of heads: the k routed heads (over every layer) with the
                                    # highest router bias may go global, the others are local; with
                                    # router_per_token=False the k are global for every token (no threshold),
                                    # with router_per_token=True they route per token (p >= threshold)
    routed_mode: str = "exact"      # 'exact': full + local for every token; 'sparse': full only where gated;
                                    # 'sampled': exact for the first routed_exact_frac of each batch's sequences
                                    # (the routers' gradient, scaled up), sparse for the rest (kernels/layer.py)
    routed_exact_frac: float = 0.25  # 'sampled' mode's share of exact sequences (at least one per batch)
    attention_backend: str = "auto"
    rope_base: float = 10000.0
    position_embedding: str = "rope"  # 'rope', or 'learned' absolute positions (GPT-2's, for init_from='gpt2')
    gelu_approximate: str = "none"  # 'tanh': GPT-2's GELU

    def __post_init__(self):
        check_model_config(self)  # one-line errors for values that cannot work (at the end of this file)

    @property
    def layer_letters(self):
        """The schedule repeated to n_layer letters, e.g. 'LLLLLG' with n_layer=8 -> 'LLLLLGLL'."""
        return repeated_schedule(self.schedule, self.n_layer)

    @property
    def kinds(self):
        return [KIND_OF_LETTER[letter] for letter in self.layer_letters]

    def with_schedule(self, schedule):
        """This config with another schedule (a reference model of the same shape, a pruned one): a budget of
        heads (router_global_heads) keeps its count where the schedule leaves that many routed heads, and is
        capped at the routed heads left (none: no budget)."""
        routed_heads = repeated_schedule(schedule, self.n_layer).count("R") * self.n_head
        return dataclasses.replace(self, schedule=schedule,
                                   router_global_heads=min(self.router_global_heads, routed_heads))


def repeated_schedule(schedule, n_layer):
    """A schedule's letters repeated to n_layer layers."""
    return "".join(schedule[i % len(schedule)] for i in range(n_layer))


@dataclass
class GPTOutput:
    logits: torch.Tensor
    lm_loss: torch.Tensor = None    # the training loss is lm_loss + router_penalty(output, lambda, budget)
    layer_p: torch.Tensor = None    # per routed layer, its mean router probability (zeros(1) without routers)
    gates: list = field(default_factory=list)  # per layer: bool (B, H, T) hard gate, or None (not routed)
    probs: list = field(default_factory=list)  # per layer: router p (B, H, T), or None
    seq_len: int = 0
    routed_mode: str = "exact"      # the mode routed layers ran in (forced-global steps run 'exact')
    attention_keys: list = field(default_factory=list)  # per layer: query-key pairs its kernels computed
    paths: list = field(default_factory=list)  # per layer: its heads' committed paths (Attention.paths), or None


@dataclass(frozen=True)
class Routing:
    """How the routed layers decide and compute at one call of GPT.forward; the default is the trained model.
    mode: what they compute in a call with a gradient, 'exact', 'sparse' or 'sampled' (None: config.routed_mode;
    a call without a gradient runs 'sparse', run_mode). threshold: gate = p >= threshold (None:
    config.router_threshold; evaluation sweeps it). force: 'global' or 'local', every decision of the routed
    layers in `layers` (None: all of them) runs that path whatever the router says, while the router still gets
    its straight-through gradient (exact mode) from both paths."""
    mode: str | None = None
    threshold: float | None = None
    force: str | None = None
    layers: frozenset | None = None

    def __post_init__(self):
        if self.mode not in (None, *ROUTED_MODES):
            raise ValueError(f"Routing(mode={self.mode!r}): use 'exact', 'sparse', 'sampled' or None")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"Routing(threshold={self.threshold}) must be in [0, 1]")
        if self.force not in (None, "global", "local"):
            raise ValueError(f"Routing(force={self.force!r}): use 'global', 'local' or None")
        if self.layers is not None and self.force is None:
            raise ValueError("Routing(layers=...) names the layers `force` applies to: set force too")

    def forced(self, layer):
        """What this call forces layer `layer` to do: 'global', 'local' or None."""
        return self.force if self.layers is None or layer in self.layers else None


def router_penalty(output, weight, budget=0.0):
    """The router penalty training adds to output.lm_loss: weight * mean over routed layers of max(0,
    mean_p(layer) - budget), mean_p(layer) the layer's mean router probability; with budget 0 a plain L1 push
    towards local, with a budget no layer is pushed below that rate (per layer, so one busy layer cannot hide
    another's collapse). weight: a number, or a tensor with one per routed layer."""
    layer_p = output.layer_p
    weight = torch.as_tensor(weight, dtype=layer_p.dtype, device=layer_p.device)
    return (weight * torch.clamp(layer_p - budget, min=0.0)).mean()


def rotary_tables(head_dim, length, base):
    """(cos, sin), each (length, head_dim): cos of each pair's angle twice, sin negated for the first half,
    so that apply_rotary is four elementwise ops (decoding one token is bound by the number of ops)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(length).float(), inv_freq)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)


def apply_rotary(x, cos, sin):
    """x: (..., T, D); cos, sin: (T, D) from rotary_tables. Rotates pairs (x1, x2) = (x[..., :D/2], x[..., D/2:])
    to (x1 cos - x2 sin, x2 cos + x1 sin); rolling x by D/2 puts x2 beside x1 and x1 beside x2."""
    xf = x.float()
    return (xf * cos + xf.roll(x.shape[-1] // 2, -1) * sin).to(x.dtype)


class Router(nn.Module):
    """Per-head All-or-Here router: p = sigmoid(W x + b) for each head, gate = p >= threshold; with
    router_sees_local, p = sigmoid(W x + b + u_h . o_h), o_h the head's local attention output at the token;
    without router_per_token, p = sigmoid(b_h) for every token of head h (no W: the decision reads no input).
    The returned gate holds the hard 0/1 decision in the forward pass and the gradient of p in the
    backward pass (straight-through estimator: g = hard + p - p.detach())."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        # built without drawing from the RNG (reset_parameters sets it): a model with routers then gets, seed for
        # seed, the backbone init of the same model without them, so a grid's rows differ in routing, not in init
        self.logits = nn.utils.skip_init(nn.Linear, config.n_embd, config.n_head, bias=True) \
            if config.router_per_token else None
        self.bias = None if config.router_per_token else nn.Parameter(torch.empty(config.n_head))
        head_dim = config.n_embd // config.n_head
        self.local_weight = nn.Parameter(torch.empty(config.n_head, head_dim)) if config.router_sees_local else None
        # per head: -1 routed, 0 committed to local, 1 committed to global (training's router_commit_after). Part
        # of the model, so evaluation and generation keep a committed head's path whatever the threshold.
        self.register_buffer("committed", torch.full((config.n_head,), -1, dtype=torch.int8))
        self.paths = (-1,) * config.n_head  # the buffer as Python ints: the kernels split heads without a sync
        self.register_load_state_dict_post_hook(lambda module, keys: module._read_paths())

    def _read_paths(self):
        self.paths = tuple(int(c) for c in self.committed.tolist())

    def commit(self, head, path):
        """Head `head` runs `path` (0 local, 1 global) from now on: its router no longer decides for it (-1: it
        decides again, training's router_release_global)."""
        self.committed[head] = path
        self._read_paths()

    @property
    def head_bias(self):
        """(H,) each head's bias: the whole decision of a per-head router, the token-independent part of a
        per-token one (what the head budget ranks heads by)."""
        return self.bias if self.logits is None else self.logits.bias

    def head_decisions(self, threshold=None, chosen=None):
        """A per-head router's decisions, bool (H,), as forward takes them: committed heads their path, the
        others chosen (the head budget's) or p >= threshold."""
        hard = chosen if chosen is not None else torch.sigmoid(self.bias.detach().float()) >= (
            self.config.router_threshold if threshold is None else threshold)
        return torch.where(self.committed >= 0, self.committed == 1, hard)

    def forward(self, x, threshold=None, force=None, local=None, chosen=None):
        """threshold: None for the trained one (config.router_threshold). force: 'global' or 'local' (Routing).
        local: (B, H, T, D) the heads' local attention outputs, with router_sees_local. chosen: bool (H,), the
        heads the model's head budget lets go global (router_global_heads): a per-head router's chosen heads are
        global instead of the threshold, a per-token router's route their tokens by it; the others are local."""
        if self.logits is not None:
            logits = self.logits(x).float().transpose(1, 2)  # (B, H, T)
        else:
            logits = self.bias.float().view(1, -1, 1).expand(x.shape[0], -1, x.shape[1])
        if self.local_weight is not None:
            logits = logits + torch.einsum("bhtd,hd->bht", local.float(), self.local_weight.float())
        p = torch.sigmoid(logits)
        by_threshold = p >= (self.config.router_threshold if threshold is None else threshold)
        if chosen is not None:
            chosen = chosen.view(1, -1, 1).expand_as(p)
            hard = chosen & by_threshold if self.logits is not None else chosen
        else:
            hard = by_threshold
        if self.training and self.config.router_explore > 0:
            hard = hard | (torch.rand_like(p) < self.config.router_explore)
        if any(path >= 0 for path in self.paths):  # a committed head's p is its path: no gradient, no penalty
            fixed = (self.committed >= 0).view(1, -1, 1)
            path = (self.committed == 1).view(1, -1, 1)
            hard, p = torch.where(fixed, path, hard), torch.where(fixed, path.to(p.dtype), p)
        if force is not None:
            hard = torch.full_like(hard, force == "global")
        gate = hard.to(p.dtype)
        return hard, gate + (p - p.detach()) if torch.is_grad_enabled() else gate, p  # no gradient: no STE ops

    def reset_parameters(self):
        if self.logits is None:
            nn.init.constant_(self.bias, self.config.router_init_bias)
            return
        nn.init.normal_(self.logits.weight, std=self.config.router_init_std) if self.config.router_init_std \
            else nn.init.zeros_(self.logits.weight)
        nn.init.constant_(self.logits.bias, self.config.router_init_bias)
        if self.local_weight is not None:  # zero: the router starts as the one without it, then learns to read it
            nn.init.zeros_(self.local_weight)


class Attention(nn.Module):
    def __init__(self, config, kind, layer):
        super().__init__()
        self.config, self.kind, self.layer = config, kind, layer
        self.n_head, self.head_dim = config.n_head, config.n_embd // config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        learned = kind == "routed" and config.routing == "learned"
        self.router = Router(config) if learned else None

    def forward(self, x, cos, sin, mode, threshold=None, force=None, cache=None, chosen=None):
        """mode: what routed layers compute ('exact', 'sparse' or 'sampled', from run_mode); threshold: the router's
        (None: the trained one); force: 'global' or 'local' (Routing); chosen: the head budget's global heads
        (GPT.chosen_heads). Returns (output, hard gate, p, query-key pairs computed)."""
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        if cos is not None:  # rotary positions (else learned absolute ones were added to the input)
            (q, k), v = apply_rotary(qkv[:2], cos, sin), qkv[2]  # q and k in one call: half the ops to decode
        else:
            q, k, v = qkv
        cfg = self.config

        def route(local, token):  # token: one position of x (decode with a router that reads its local output)
            inputs = x if token is None else x[:, token:token + 1]
            return self.route(inputs, threshold, force, local, cache, chosen)

        out = layer_attention(q, k, v, self.kind, cfg.window, cfg.n_sink, route=route,
                              sees_local=self.router is not None and cfg.router_sees_local, mode=mode,
                              backend=cfg.attention_backend, cache=cache, paths=self.paths(force),
                              exact_frac=cfg.routed_exact_frac)
        y = out.y.transpose(1, 2).reshape(B, T, C)
        return self.dropout(self.proj(y)), out.hard, out.p, out.keys

    def paths(self, force=None):
        """Per head, the path it is fixed to, which is all it computes (kernels/layer.py): -1 routed, 0 local, 1
        global; None where every head is routed. A committed head's (Router.committed), or random routing's
        head whose rate is 0 or 1 (a fixed layout, e.g. one always-global head); None in a forced call, whose
        decisions are not those."""
        if self.kind != "routed" or force is not None:
            return None
        if self.router is not None:
            return self.router.paths if any(path >= 0 for path in self.router.paths) else None
        q = self.config.random_global_q
        q = q[self.layer] if isinstance(q, list) else q
        return tuple(int(rate) for rate in q) if isinstance(q, list) and set(q) <= {0, 1} else None

    def route(self, x, threshold, force, local=None, cache=None, chosen=None):
        """(hard gate, STE gate, p) for routed layers, (None, None, None) otherwise. cache: a generation's
        KVCache, which keeps a per-head random draw for the sequence's later tokens."""
        if self.kind != "routed":
            return None, None, None
        if self.router is not None:
            return self.router(x, threshold, force, local, chosen)
        B, T, _ = x.shape
        q = self.config.random_global_q
        q = q[self.layer] if isinstance(q, list) else q
        q = torch.tensor(q, device=x.device).view(1, -1, 1) if isinstance(q, list) else q  # per head
        # per token, or without router_per_token one draw per head and sequence (a random per-head schedule)
        if self.config.router_per_token:
            hard = torch.rand(B, self.n_head, T, device=x.device) < q
        else:
            heads = cache.random_heads if cache is not None and cache.random_heads is not None else \
                torch.rand(B, self.n_head, 1, device=x.device) < q
            if cache is not None:
                cache.random_heads = heads
            hard = heads.expand(B, self.n_head, T).contiguous()
        if force is not None:
            hard = torch.full_like(hard, force == "global")
        return hard, hard.float(), None


def trained_mode(config, routed_mode=None):
    """The mode routed layers train in: routed_mode (None: config.routed_mode) with learned routers; 'sparse' with
    random routing, whose gate carries no gradient ('exact' computes the full output of local tokens only for the
    routers' straight-through gradient: the same outputs and weight gradients, at the cost of full attention)."""
    return "sparse" if config.routing == "random" else routed_mode or config.routed_mode


def run_mode(routed_mode, force_global, generating=False):
    """The mode routed layers run in at one call, given the mode they train in (trained_mode): an all-global step
    runs 'exact' (the dense kernel is cheapest); without a gradient (evaluation) or with a KV cache (generation)
    'sparse', since 'exact' computes full attention for every token only so that the straight-through gradient
    is exact."""
    if force_global:
        return "exact"
    return routed_mode if torch.is_grad_enabled() and not generating else "sparse"


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.approximate = config.gelu_approximate

    def forward(self, x):
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate=self.approximate)))


class Block(nn.Module):
    def __init__(self, config, kind, layer):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = Attention(config, kind, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mode, threshold=None, force=None, cache=None, chosen=None):
        a, hard, p, keys = self.attn(self.ln_1(x), cos, sin, mode, threshold, force, cache, chosen)
        x = x + a
        return x + self.mlp(self.ln_2(x)), hard, p, keys


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.position_embedding == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, kind, layer) for layer, kind in enumerate(config.kinds))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        cos, sin = rotary_tables(config.n_embd // config.n_head, config.block_size, config.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    def forward(self, idx, targets=None, routing=None, cache=None):
        """idx: (B, T) token ids. targets: (B, T), -1 = ignored: the output then has lm_loss and layer_p, from
        which training adds router_penalty. routing: a Routing (None: Routing(), the trained model). cache: list
        of KVCache (generation); positions continue from what the cache has seen."""
        routing = routing or Routing()
        B, T = idx.shape
        start = cache[0].length if cache else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size={self.config.block_size}")
        trained = trained_mode(self.config, routing.mode)
        mode = run_mode(trained, routing.force == "global" and routing.layers is None, generating=bool(cache))
        x = self.wte(idx)
        if self.wpe is not None:
            x, cos, sin = x + self.wpe(torch.arange(start, start + T, device=idx.device)), None, None
        else:
            cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        x = self.drop(x)
        gates, probs, keys, paths = [], [], [], []
        chosen = self.chosen_heads()
        for i, block in enumerate(self.blocks):
            x, hard, p, layer_keys = block(x, cos, sin, mode, routing.threshold, routing.forced(i),
                                           cache[i] if cache else None, chosen[i])
            gates.append(hard)
            probs.append(p)
            keys.append(layer_keys)
            paths.append(block.attn.paths(routing.forced(i)))
        x = self.ln_f(x)
        if targets is None:
            return GPTOutput(logits=self.lm_head(x[:, -1:]), gates=gates, probs=probs, seq_len=T, routed_mode=mode,
                             attention_keys=keys, paths=paths)
        logits = self.lm_head(x)
        lm_loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        layer_p = [p.mean() for p in probs if p is not None]
        layer_p = torch.stack(layer_p) if layer_p else lm_loss.new_zeros(1)
        return GPTOutput(logits, lm_loss, layer_p, gates, probs, T, mode, keys, paths)

    def routers(self):
        """The learned routers, in layer order."""
        return [block.attn.router for block in self.blocks if block.attn.router is not None]

    def chosen_heads(self):
        """Per layer, the heads the head budget makes global (router_global_heads: the k routed heads of highest
        router bias, committed global ones first, committed local ones never; ties to the lower layer and head),
        bool (H,); None per layer without it."""
        k = self.config.router_global_heads
        if not k:
            return [None] * len(self.blocks)
        routers = self.routers()
        committed = torch.stack([router.committed for router in routers])
        score = torch.stack([router.head_bias.detach().float() for router in routers])
        score = score.masked_fill(committed == 1, float("inf")).masked_fill(committed == 0, float("-inf"))
        order = torch.sort(score.flatten(), descending=True, stable=True).indices
        chosen = torch.zeros(score.numel(), dtype=torch.bool, device=score.device)
        chosen[order[:k]] = True
        chosen = iter(chosen.view_as(score) & (committed != 0))
        return [None if block.attn.router is None else next(chosen) for block in self.blocks]

    def init_weights(self):
        """GPT-2's init: normal(0.02), residual projections scaled down by depth; routers last, from a forked RNG."""
        routers = [block.attn.router for block in self.blocks if block.attn.router is not None]
        router_modules = {module for router in routers for module in router.modules()}
        for module in self.modules():
            if module not in router_modules:
                self._init_weights(module)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # GPT-2: scale the residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))
        with torch.random.fork_rng(devices=[]):  # the routers' draws leave the RNG as a router-less init does
            for router in routers:
                router.reset_parameters()

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def window_heads(self):
        """Per layer, the heads whose KV cache holds only the window (and sinks): every head of a local layer,
        and a routed layer's heads fixed to the local path (committed, or random routing at rate 0 for the
        head), which read nothing else; the others keep every position (a later query may go global)."""
        return [list(range(self.config.n_head)) if kind == "local" else
                [h for h, path in enumerate(block.attn.paths() or ()) if path == 0] if kind == "routed" else []
                for block, kind in zip(self.blocks, self.config.kinds)]

    def new_cache(self, capacity=None):
        """One KV cache per layer, for up to `capacity` positions (default block_size), holding what its
        window_heads need: a KVCache of the layer's kind, a local one where every head reads only its window, or
        a SplitKVCache where some do."""
        cfg, capacity = self.config, capacity or self.config.block_size
        caches = []
        for kind, window in zip(cfg.kinds, self.window_heads()):
            if 0 < len(window) < cfg.n_head:
                caches.append(SplitKVCache(capacity, cfg.window, cfg.n_sink, cfg.n_head, window))
            else:
                caches.append(KVCache("local" if window else kind, capacity, cfg.window, cfg.n_sink))
        return caches

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_kv_cache=True, generator=None):
        """Sample tokens after idx (B, T). The context is the last block_size tokens at most; once it would
        grow past block_size it restarts from its last block_size // 2 tokens (positions from 0 again). With the
        KV cache, each new token reads the cached keys; a restart refills the cache from the kept tokens, once per
        block_size // 2 new tokens. Both paths see the same context, so they give the same tokens at
        temperature 0. (nanoaha/generation_timing.py times the prefill and decode steps from outside.)"""
        block = self.config.block_size
        start, cache = max(0, idx.shape[1] - block), None
        for i in range(max_new_tokens):
            if idx.shape[1] - start > block:
                start, cache = idx.shape[1] - block // 2, None
            if not use_kv_cache or cache is None:
                context = idx[:, start:]
                if use_kv_cache:
                    cache = self.new_cache(min(block, context.shape[1] + max_new_tokens - i))
                logits = self(context, cache=cache).logits
            else:
                logits = self(idx[:, -1:], cache=cache).logits
            logits = logits[:, -1].float()
            if temperature == 0:
                next_id = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_id = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            idx = torch.cat([idx, next_id], dim=1)
        return idx


class KVCache:
    """Keys and values of one layer during generation, preallocated on the first write (as gpt-fast does).
    Dense and routed layers hold every position up to `capacity` (a later query may go global); local layers
    only what a later query of theirs can read: the first n_sink positions and a ring buffer of the last
    `window`."""

    def __init__(self, kind, capacity, window, n_sink):
        self.kind, self.capacity, self.window = kind, capacity, window
        self.local = kind == "local"
        self.slots = min(capacity, window) if self.local else capacity
        # a local layer keeps sinks apart only for positions that can leave its window
        self.n_sink = min(n_sink, max(0, capacity - window)) if self.local else n_sink
        self.k = self.v = self.sink_k = self.sink_v = None
        self.length = 0  # positions written so far
        self.random_heads = None  # routing='random' without router_per_token: the sequence's draw per head

    @property
    def bytes(self):
        tensors = (self.k, self.v, self.sink_k, self.sink_v)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def write(self, k, v):
        """Append positions length .. length + T - 1."""
        B, H, T, D = k.shape
        if self.length + T > self.capacity:
            raise ValueError(f"the KV cache holds {self.capacity} positions; {self.length} + {T} do not fit")
        if self.k is None:
            self.k, self.v = (k.new_empty(B, H, self.slots, D) for _ in range(2))
            if self.local:
                self.sink_k, self.sink_v = (k.new_empty(B, H, self.n_sink, D) for _ in range(2))
        start, end = self.length, self.length + T
        if not self.local:
            self.k[:, :, start:end], self.v[:, :, start:end] = k, v
        else:
            if start < self.n_sink:
                n = min(end, self.n_sink) - start
                self.sink_k[:, :, start:start + n], self.sink_v[:, :, start:start + n] = k[:, :, :n], v[:, :, :n]
            if T == 1:  # a decode step: one slot
                self.k[:, :, start % self.slots], self.v[:, :, start % self.slots] = k[:, :, 0], v[:, :, 0]
            else:
                first = max(start, end - self.slots)  # only the last `slots` positions stay
                slots = torch.arange(first, end, device=k.device) % self.slots
                self.k[:, :, slots], self.v[:, :, slots] = k[:, :, first - start:], v[:, :, first - start:]
        self.length = end

    def all_keys(self):
        """(keys, values) of every position written (dense and routed layers)."""
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def window_keys(self):
        """(keys, values) that the newest position reads when local: its window and the sinks before it, in
        any order (the query's rotary position is in q, so attention does not depend on the order)."""
        n_early = min(max(0, self.length - self.window), self.n_sink)  # sinks that left the window
        if self.local:
            keys, values = self.k[:, :, :min(self.length, self.slots)], self.v[:, :, :min(self.length, self.slots)]
        else:
            first = max(0, self.length - self.window)
            keys, values = self.k[:, :, first:self.length], self.v[:, :, first:self.length]
        if n_early == 0:
            return keys, values
        sink_k, sink_v = (self.sink_k, self.sink_v) if self.local else (self.k, self.v)
        return torch.cat([sink_k[:, :, :n_early], keys], 2), torch.cat([sink_v[:, :, :n_early], values], 2)

    def positions(self):
        """The positions held, sorted: the sinks kept apart (local layers), then the buffer's."""
        if not self.local:
            return list(range(self.length))
        return list(range(min(self.length, self.n_sink))) + list(range(max(0, self.length - self.slots), self.length))

    full_slots = None  # all_keys holds every head, in head order (SplitKVCache maps heads to its slots)


class SplitKVCache:
    """A routed layer's KV cache when some of its heads are fixed to the local path (GPT.window_heads): those
    heads keep a local layer's cache (window and sinks), the others every position. window_keys gives every
    head's window in head order; all_keys only the heads that keep every position (full_slots: each head's index
    there, -1 for a window head), the only ones that can go global."""

    def __init__(self, capacity, window, n_sink, n_head, window_heads):
        self.n_head, self.window_heads = n_head, list(window_heads)
        self.full_heads = [h for h in range(n_head) if h not in self.window_heads]
        self.full_slots = [self.full_heads.index(h) if h in self.full_heads else -1 for h in range(n_head)]
        self._slot_index = None  # full_slots as a tensor on the decode's device, made once
        self.local = KVCache("local", capacity, window, n_sink)
        self.full = KVCache("routed", capacity, window, n_sink)
        self.random_heads = None

    @property
    def length(self):
        return self.full.length

    @property
    def bytes(self):
        return self.local.bytes + self.full.bytes

    def write(self, k, v):
        self.full.write(k[:, self.full_heads], v[:, self.full_heads])
        self.local.write(k[:, self.window_heads], v[:, self.window_heads])

    def window_keys(self):
        """Every head's window and sinks, in head order (both parts hold the same number of positions)."""
        (full_k, full_v), (local_k, local_v) = self.full.window_keys(), self.local.window_keys()
        B, _, n, D = full_k.shape
        keys, values = full_k.new_empty(B, self.n_head, n, D), full_v.new_empty(B, self.n_head, n, D)
        keys[:, self.full_heads], values[:, self.full_heads] = full_k, full_v
        keys[:, self.window_heads], values[:, self.window_heads] = local_k, local_v
        return keys, values

    def all_keys(self):
        """(keys, values) of every position, for the heads that keep them (full_slots)."""
        return self.full.all_keys()

    def slot_index(self, device):
        """full_slots as a tensor on `device` (the decode's gather path), made on the first call."""
        if self._slot_index is None or self._slot_index.device != device:
            self._slot_index = torch.tensor(self.full_slots, device=device)
        return self._slot_index


def check_model_config(cfg):
    """Values of a GPTConfig that cannot work, each with a one-line error naming the key."""
    for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"{key}={getattr(cfg, key)} must be at least 1")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"dropout={cfg.dropout} must be in [0, 1)")
    if not 0.0 <= cfg.router_threshold <= 1.0:
        raise ValueError(f"router_threshold={cfg.router_threshold} must be in [0, 1]")
    if cfg.router_init_std < 0 or not cfg.rope_base > 0:
        raise ValueError(f"router_init_std={cfg.router_init_std} must not be negative and "
                         f"rope_base={cfg.rope_base} must be positive")
    if cfg.attention_backend not in BACKENDS:
        raise ValueError(f"attention_backend={cfg.attention_backend!r}: use one of {', '.join(BACKENDS)}")
    if not cfg.schedule or set(cfg.schedule) - set(KIND_OF_LETTER):
        raise ValueError(f"schedule={cfg.schedule!r}: use the letters G (dense), L (local), R (routed)")
    if cfg.n_embd % cfg.n_head:
        raise ValueError(f"n_embd={cfg.n_embd} must be divisible by n_head={cfg.n_head}")
    if cfg.position_embedding not in ("rope", "learned"):
        raise ValueError(f"position_embedding={cfg.position_embedding!r}: use 'rope' or 'learned'")
    if cfg.gelu_approximate not in ("none", "tanh"):
        raise ValueError(f"gelu_approximate={cfg.gelu_approximate!r}: use 'none' or 'tanh'")
    if cfg.position_embedding == "rope" and (cfg.n_embd // cfg.n_head) % 2:
        raise ValueError("head size n_embd // n_head must be even for rotary embeddings")
    if not 1 <= cfg.window <= cfg.block_size:
        raise ValueError(f"window={cfg.window} must be between 1 and block_size={cfg.block_size}; "
                         "a window as long as the block is dense attention (schedule 'G')")
    if not 0 <= cfg.n_sink <= cfg.window:
        raise ValueError(f"n_sink={cfg.n_sink} must be between 0 and window={cfg.window}")
    if cfg.routing not in ("learned", "random"):
        raise ValueError(f"routing={cfg.routing!r}: use 'learned' or 'random'")
    routed_heads = cfg.layer_letters.count("R") * cfg.n_head
    if cfg.router_global_heads and (cfg.routing != "learned" or not 0 < cfg.router_global_heads <= routed_heads):
        raise ValueError(f"router_global_heads={cfg.router_global_heads} picks heads by their learned routers: it "
                         f"needs routing='learned' and at most the {routed_heads} routed heads")
    if not cfg.router_per_token and (cfg.router_sees_local or cfg.router_init_std > 0):
        raise ValueError("router_per_token=False decides per head from no input: it has no router_sees_local and "
                         "no weights for router_init_std; drop those settings")
    if cfg.router_global_heads and cfg.router_explore > 0:
        raise ValueError("router_global_heads decides which heads may go global and router_explore sends others "
                         "global anyway: drop router_explore")
    if not 0.0 <= cfg.router_explore <= 1.0:
        raise ValueError(f"router_explore={cfg.router_explore} must be a fraction in [0, 1]")
    if cfg.routed_mode not in ROUTED_MODES:
        raise ValueError(f"routed_mode={cfg.routed_mode!r}: use 'exact', 'sparse' or 'sampled'")
    if isinstance(cfg.routed_exact_frac, bool) or not 0.0 < cfg.routed_exact_frac <= 1.0:
        raise ValueError(f"routed_exact_frac={cfg.routed_exact_frac} must be a fraction in (0, 1]: the share of "
                         f"each batch's sequences that 'sampled' mode runs exact")
    rates = cfg.random_global_q if isinstance(cfg.random_global_q, list) else [cfg.random_global_q]
    if isinstance(cfg.random_global_q, list) and len(rates) != cfg.n_layer:
        raise ValueError(f"random_global_q has {len(rates)} rates for {cfg.n_layer} layers: give one per layer")
    def probability(q):
        return isinstance(q, (int, float)) and not isinstance(q, bool) and 0.0 <= q <= 1.0

    if not all(probability(q) or (isinstance(q, list) and len(q) == cfg.n_head and all(map(probability, q)))
               for q in rates):
        raise ValueError(f"random_global_q={cfg.random_global_q} must be a probability, or one per layer, each a "
                         f"probability or a list of {cfg.n_head} (one per head)")
