"""The pieces of training that are not the loop (train.py is the loop): the learning-rate and router-penalty
schedules, the budget-targeted lambda controller, the optimizer, stopping on a signal, and the checks and RNG
restore of resuming."""
import math
import signal
import threading

import torch


def lr_at(it, cfg):
    """Linear warm-up to learning_rate over warmup_iters, then cosine decay to min_lr at lr_decay_iters
    (0: max_iters), min_lr after."""
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / cfg.warmup_iters
    if it >= decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def routers_held_local(it, cfg):
    """Step it is one of router_local_iters' first steps: every routed decision runs local (the threshold is
    infinite), in training and in its evaluations; exact mode still computes full attention, so the straight-through
    gradient tells each router what global attention would have given this backbone."""
    return it < cfg.router_local_iters


def penalty_start(cfg):
    """The first step with a penalty (and a lambda controller): a penalty on routers held local would only close
    them before they decide anything."""
    return max(cfg.router_lambda_start, cfg.router_local_iters)


def lambda_ramp(it, cfg):
    """The penalty's schedule, a factor in [0, 1]: 0 before penalty_start, then a linear ramp."""
    start = penalty_start(cfg)
    if it < start:
        return 0.0
    if cfg.router_lambda_ramp <= 0:
        return 1.0
    return min(1.0, (it - start + 1) / cfg.router_lambda_ramp)


def router_lambda_at(it, cfg):
    return cfg.router_lambda * lambda_ramp(it, cfg)


def routed_mode_at(it, tcfg, mcfg):
    """The mode routed layers train in at step it: 'exact' before sparse_from_iter, then the model's."""
    return "exact" if it < tcfg.sparse_from_iter else mcfg.routed_mode


class LambdaController:
    """Budget-targeted routing: one lambda per routed layer (or one shared) that moves each step towards the value
    at which the measured global fraction meets the target: up while the layer is more global than the target,
    down while less, and below zero (a reward for going global) if a layer stays under the target, so a layer
    that closed can reopen. lambda = router_lambda * sinh(u) / sinh(1) with u += rate * error (relative error,
    clipped to [-1, 1]): steps are multiplicative for a large lambda and additive around zero."""

    def __init__(self, cfg, n_layers):
        self.target, self.rate, self.scale = cfg.router_target_global, cfg.router_target_rate, cfg.router_lambda
        self.per_layer = cfg.router_target_per_layer
        self.u_max = math.asinh(cfg.router_lambda_max / self.scale * math.sinh(1.0))
        self.u = torch.ones(n_layers if self.per_layer else 1)

    @property
    def lam(self):
        return self.scale * torch.sinh(self.u) / math.sinh(1.0)

    def update(self, global_fracs):
        """global_fracs: (n_layers,) the step's global fraction of each routed layer with a learned router."""
        frac = global_fracs if self.per_layer else global_fracs.mean(0, keepdim=True)
        error = ((frac - self.target) / self.target).clamp(-1.0, 1.0)
        self.u = (self.u + self.rate * error).clamp(-self.u_max, self.u_max)

    def weights(self, n_layers):
        return self.lam if self.per_layer else self.lam.expand(n_layers)


def commit_start(cfg):
    """The first step whose decisions count towards a commit (router_commit_after): the penalty at full weight
    and, with router_token_from_iter, per-token routing released (an all-global start, or the per-head phase,
    is not a decision yet). With router_release_global a head budget decides the per-head phase, not the
    penalty (which starts with the tokens' phase): its decisions count from router_lambda_ramp (after any held
    local steps), as those of per-head routers under a budget without a penalty."""
    if cfg.router_release_global:
        return cfg.router_local_iters + cfg.router_lambda_ramp
    return max(penalty_start(cfg) + cfg.router_lambda_ramp, cfg.router_token_from_iter)


class HeadCommitter:
    """router_commit_after=K: a routed head whose decisions were all global (its share of the step's tokens
    >= 1 - router_commit_tol) on each of K steps in a row, or all local (<= router_commit_tol), commits to that
    path: model.Router.commit, after which its router no longer decides for it (and the kernels compute only
    that path). Under a budget (router_target_global: the share of the routed heads it buys; or global_heads,
    the model's router_global_heads) no more heads commit global than it buys, and no more commit local than
    leaves it reachable (committed global heads plus undecided ones). streak: per router and head, + steps all
    global in a row, - steps all local. router_commit_by_iter=N (per-head routers): at step N every head still
    undecided commits to the path it took most over about the last K steps (recent: each head's global share,
    an exponential average of time constant K), the budget's open global places going to the most global.
    router_release_global: at router_token_from_iter the heads committed global are released (release), and the
    deadline, a deadline of the per-head phase, holds no more."""

    def __init__(self, cfg, routers, global_heads=0):
        self.after, self.tol, self.start = cfg.router_commit_after, cfg.router_commit_tol, commit_start(cfg)
        self.deadline = cfg.router_commit_by_iter
        self.deadline_ends = cfg.router_token_from_iter if cfg.router_release_global else None
        self.routers = routers
        n_heads = sum(len(router.paths) for router in routers)
        bought = global_heads or round(cfg.router_target_global * n_heads)
        budget = global_heads > 0 or cfg.router_target_global > 0
        self.max_global, self.min_global = (bought, bought) if budget else (n_heads, 0)
        self.streak = torch.zeros(len(routers), len(routers[0].paths) if routers else 0, dtype=torch.long)
        self.recent = torch.zeros(self.streak.shape) if self.deadline else None  # only a deadline reads it

    def update(self, it, head_fracs):
        """head_fracs: (routers, H) each head's global share of the step's tokens. Returns the commits made,
        [(router index, head, path)]."""
        if it < self.start:
            return []
        all_global, all_local = head_fracs >= 1.0 - self.tol, head_fracs <= self.tol
        self.streak = torch.where(all_global, self.streak.clamp(min=0) + 1,
                                  torch.where(all_local, self.streak.clamp(max=0) - 1, torch.zeros_like(self.streak)))
        if self.recent is not None:
            self.recent += (head_fracs.float() - self.recent) / self.after
        committed = torch.tensor([router.paths for router in self.routers])  # the buffers' mirror: no device sync
        n_global, n_open = int((committed == 1).sum()), int((committed == -1).sum())
        if self.deadline and it >= self.deadline and n_open and (self.deadline_ends is None
                                                                 or it < self.deadline_ends):
            return self.commit_all(committed, n_global)
        made = []
        for r, h in (committed == -1).nonzero().tolist():
            path = 1 if self.streak[r, h] >= self.after else 0 if self.streak[r, h] <= -self.after else None
            if path == 1 and n_global >= self.max_global or path == 0 and n_global + n_open - 1 < self.min_global:
                continue
            if path is not None:
                self.routers[r].commit(h, path)
                n_global, n_open = n_global + path, n_open - 1
                made.append((r, h, path))
        return made

    def release(self):
        """router_release_global: every head committed global routes again (its router decides its tokens), its
        streak from zero. Returns [(router index, head)] released."""
        released = []
        for r, router in enumerate(self.routers):
            for h, path in enumerate(router.paths):
                if path == 1:
                    router.commit(h, -1)
                    self.streak[r, h] = 0
                    released.append((r, h))
        return released

    def commit_all(self, committed, n_global):
        """The deadline: every undecided head commits, the most global over the recent steps first to the open
        global places (all of them where the budget needs its heads; without a budget, the heads global on at
        least half of the recent steps)."""
        open_heads = (committed == -1).nonzero().tolist()
        open_heads.sort(key=lambda rh: -float(self.recent[rh[0], rh[1]]))  # stable: ties to the lower router, head
        places = self.max_global - n_global
        made = []
        for rank, (r, h) in enumerate(open_heads):
            wanted = self.min_global > 0 or self.recent[r, h] >= 0.5
            path = 1 if rank < places and wanted else 0
            self.routers[r].commit(h, path)
            made.append((r, h, path))
        return made


class TrainingStopped(Exception):
    """A run that ends early for a reason the user acts on (divergence, a signal): one line and an exit status."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


class StopSignals:
    """SIGTERM (a cluster's preemption) and SIGINT (Ctrl-C) set a flag that the loop reads after each step: the
    run saves a checkpoint at that step and stops. A second signal interrupts at once."""

    def __init__(self):
        self.received, self.previous = None, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def handle(self, signum, frame):
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


IDENTITY_KEYS = ("encoding", "vocab_size", "dtype", "eot_token", "train_tokens", "val_tokens", "example_len")


def check_same_data(saved_meta, meta, ckpt_path):
    """Resuming on another corpus is refused: the fields of meta.json that identify the data must match."""
    differ = {k: (saved_meta[k], meta[k]) for k in IDENTITY_KEYS
              if k in saved_meta and k in meta and saved_meta[k] != meta[k]}
    if differ:
        raise ValueError(f"cannot resume {ckpt_path}: it was trained on other data (meta.json, checkpoint vs now: "
                         f"{differ}); point dataset/data_dir at that corpus, or fine-tune on this one with "
                         f"--init_from={ckpt_path}")


def restore_rng(rng, generator, rank, world, seed, iter_num):
    """Restore the RNG states a checkpoint saved: the shared one (data windows, forced-global steps) and this
    rank's torch (and CUDA) state. With another number of processes the per-rank states cannot be matched to
    ranks, so every rank is re-seeded from the step and its rank; returns the message that says so, or None."""
    generator.set_state(rng["data"])
    torch_states, cuda_states = rng["torch"], rng["cuda"]  # one per rank
    if len(torch_states) == world:
        torch.set_rng_state(torch_states[rank])
        if torch.cuda.is_available() and cuda_states[rank] is not None:
            torch.cuda.set_rng_state(cuda_states[rank])
        return None
    torch.manual_seed(seed + 1_000_003 * (iter_num + 1) + rank)
    return (f"resuming a run of {len(torch_states)} process(es) with {world}: random routing and dropout are "
            f"re-seeded from step {iter_num} and the rank")


def weights_finite(model):
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def compile_model(model):
    """torch.compile(model), with sparse mode's gated-row count traced as a scalar, not a graph break."""
    torch._dynamo.config.capture_scalar_outputs = True
    return torch.compile(model)


def configure_optimizer(model, cfg, device_type):
    """AdamW; weight decay on matrices only (not on norms, biases or the router's bias). With router_lr_mult != 1
    the routers' parameters form groups of their own whose "lr_mult" train.py applies to each step's rate."""
    routers = {id(p) for name, p in model.named_parameters() if ".router." in name} \
        if cfg.router_lr_mult != 1 else set()
    def two_groups(params, mult):  # weight decay on matrices only
        return [{"params": [p for p in params if p.requires_grad and p.dim() >= 2], "weight_decay": cfg.weight_decay,
                 "lr_mult": mult},
                {"params": [p for p in params if p.requires_grad and p.dim() < 2], "weight_decay": 0.0,
                 "lr_mult": mult}]
    groups = two_groups([p for p in model.parameters() if id(p) not in routers], 1.0)
    if routers:
        groups += two_groups([p for p in model.parameters() if id(p) in routers], cfg.router_lr_mult)
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                             fused=device_type == "cuda")
