"""The settings of a training run (train.py's schema, beside model.GPTConfig), and the checks of combinations that
cannot work. A module, so that the grid runner checks a grid's runs with the same schema before starting any."""
import os
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def corpus_dir(data_dir, dataset):
    """The corpus a training config reads (its data_dir and dataset): data_dir, else the repository's
    data/<dataset>/."""
    return data_dir or os.path.join(REPO, "data", dataset)


@dataclass
class TrainConfig:
    out_dir: str = "out"
    dataset: str = "python_stdlib"       # reads data/<dataset>/ unless data_dir is set
    data_dir: str = ""
    doc_aligned_windows: bool = False    # training and val windows start at a document start (data/loader.py)
    init_from: str = "scratch"           # 'scratch', 'resume' (from out_dir), or a checkpoint path to fine-tune
    overwrite: bool = False              # a new run may replace the checkpoints in out_dir (else it refuses)
    trainable: str = "all"               # 'all', or 'router': only the routers learn (the rest stays frozen)
    batch_size: int = 4
    grad_accum: int = 1
    max_iters: int = 750
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 50
    lr_decay_iters: int = 0              # 0: decay over max_iters
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0               # 0: no clipping
    router_lambda: float = 0.01          # weight of the L1 router penalty (mean router probability)
    router_lambda_start: int = 0         # penalty is zero before this step (and before router_local_iters) ...
    router_lambda_ramp: int = 200        # ... then ramps linearly to router_lambda over this many steps
    router_lr_mult: float = 1.0          # the routers' learning rate is learning_rate times this (same schedule)
    router_budget: float = 0.0           # no penalty on a routed layer whose mean router probability is below this
    router_target_global: float = 0.0    # > 0: lambda adapts so the routed global fraction approaches this
    router_target_per_layer: bool = False  # ... each routed layer on its own (else the mean over routed layers)
    router_target_rate: float = 0.05     # how fast lambda adapts (LambdaController) ...
    router_lambda_max: float = 1.0       # ... within +- this: a lambda that dominates the LM loss would also
                                         # dominate the clipped gradient norm
    router_local_iters: int = 0          # routed decisions all local for this many steps (routers still learn)
    router_token_from_iter: int = 0      # > 0: per-token routers decide per head (their token weights held at
                                         # zero) before this step, then per token from the layout they found
    router_commit_after: int = 0         # > 0: a head whose decisions were all local (or all global) on this many
                                         # steps in a row commits to that path and computes only it (HeadCommitter)
    router_commit_tol: float = 0.01      # ... "all": at most this share of its tokens decided the other way
    router_commit_by_iter: int = 0       # > 0 (per-head routers): at this step every head still undecided commits
                                         # to the path it took most of late (a deadline for decisions that flicker)
    router_release_global: bool = False  # per-token routers under a head budget: heads commit in the per-head
                                         # phase too, and at router_token_from_iter those committed global are
                                         # released to route their tokens (those committed local stay local)
    sparse_from_iter: int = 0            # with routed_mode='sparse': exact mode before this step
    p_dense: float = 0.0                 # probability that a step runs every routed head globally
    collapse_frac: float = 0.005         # warn when a routed layer's global fraction falls below this
    max_nonfinite_steps: int = 10        # a non-finite loss or gradient skips the step; this many in a row stop
    eval_interval: int = 250
    eval_iters: int = 20
    probe_spans: int = 8                 # the repeat probe at every evaluation (copy gain, induction heads;
                                         # nanoaha/copy_probe.py) on this many val spans; 0: off
    log_interval: int = 10
    save_checkpoint: bool = True
    tensorboard: bool = True
    device: str = "auto"                 # 'auto', 'cpu', 'cuda', 'cuda:1', 'mps'
    dtype: str = "auto"                  # 'auto' (bf16 on CUDA and bf16 CPUs, else fp32), 'float32', 'bfloat16', 'float16'
    compile: bool = False
    peak_flops: float = 0.0              # per device, for MFU; 0: a known GPU's 16-bit peak (nanoaha/device.py), else none
    seed: int = 1337
    data_order: int = 0                  # which data order (windows drawn, forced-global steps) at this seed:
                                         # 0 the seed's own; k > 0 another one, the same init on other batches
                                         # (the noise floor of a same-seed comparison)
    progress_bar: bool = True

    def __post_init__(self):
        """Ranges of single settings (combinations: check_config). The parser turns these into one-line errors."""
        at_least = {"batch_size": 1, "grad_accum": 1, "eval_interval": 1, "eval_iters": 1, "log_interval": 1,
                    "max_nonfinite_steps": 1, "max_iters": 0, "warmup_iters": 0, "lr_decay_iters": 0,
                    "router_lambda_start": 0, "router_lambda_ramp": 0, "sparse_from_iter": 0,
                    "router_commit_after": 0, "router_commit_by_iter": 0, "router_local_iters": 0, "probe_spans": 0,
                    "data_order": 0}
        for key, low in at_least.items():
            if getattr(self, key) < low:
                raise ValueError(f"{key}={getattr(self, key)} must be at least {low}")
        fractions = ("router_budget", "router_target_global", "router_commit_tol", "p_dense", "collapse_frac", "beta1",
                     "beta2")
        for key in fractions:
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"{key}={getattr(self, key)} must be in [0, 1]")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate} must be positive")
        if not 0.0 <= self.min_lr <= self.learning_rate:
            raise ValueError(f"min_lr={self.min_lr} must be in [0, learning_rate={self.learning_rate}]")
        for key in ("weight_decay", "grad_clip", "router_lambda", "peak_flops"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}={getattr(self, key)} must not be negative")
        for key in ("router_target_rate", "router_lambda_max", "router_lr_mult"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key}={getattr(self, key)} must be positive")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={self.dtype!r}: use 'auto', 'float32', 'bfloat16' or 'float16'")
        if self.trainable not in ("all", "router"):
            raise ValueError(f"trainable={self.trainable!r}: use 'all' or 'router'")
        if not self.out_dir:
            raise ValueError("out_dir is empty: name the folder for checkpoints and logs")

    @property
    def data_order_seed(self):
        return self.seed + 100_003 * self.data_order


def check_config(tcfg, mcfg):
    """Combinations of keys that cannot work, with what to change."""
    learned = mcfg.routing == "learned" and "R" in mcfg.layer_letters
    if tcfg.trainable == "router" and not learned:
        raise ValueError("trainable='router' needs learned routers: a schedule with R and routing='learned'")
    if tcfg.router_target_global > 0 and not learned:
        raise ValueError("router_target_global needs learned routers: a schedule with R and routing='learned'")
    if tcfg.router_local_iters > 0 and not learned:
        raise ValueError("router_local_iters holds learned routers local: a schedule with R and routing='learned'")
    held = tcfg.router_local_iters
    if held > 0 and mcfg.routed_mode == "sparse" and tcfg.sparse_from_iter < held:  # exact before sparse_from_iter
        raise ValueError(f"router_local_iters={held}: the routers learn from both attentions, which sparse mode "
                         f"does not compute for local tokens; use routed_mode='exact' or 'sampled', or "
                         f"sparse_from_iter={held} or later (exact mode through the held steps)")
    if tcfg.router_local_iters > 0 and mcfg.router_explore > 0:
        raise ValueError("router_local_iters holds every routed decision local, router_explore sends some global: "
                         "set one of them to 0")
    if tcfg.router_token_from_iter > 0 and not (learned and mcfg.router_per_token and mcfg.router_init_std == 0):
        raise ValueError("router_token_from_iter holds per-token routers' weights at zero (a decision per head) at "
                         "first: it needs learned routers with router_per_token=True and router_init_std=0")
    if tcfg.router_commit_after > 0 and not learned:
        raise ValueError("router_commit_after commits learned routers' heads: a schedule with R and "
                         "routing='learned'")
    if tcfg.router_release_global and not (tcfg.router_token_from_iter > 0 and tcfg.router_commit_after > 0
                                           and mcfg.router_global_heads > 0):
        raise ValueError("router_release_global releases the heads a budget's per-head phase committed global to "
                         "route their tokens: set router_token_from_iter > 0 (per-token routers that decide per "
                         "head first), router_commit_after > 0 and router_global_heads > 0 with it")
    if tcfg.router_commit_by_iter > 0 and (tcfg.router_commit_after <= 0 or mcfg.router_per_token
                                           and not tcfg.router_release_global):
        raise ValueError("router_commit_by_iter commits per-head routers' heads still undecided at that step, by "
                         "their decisions over the last router_commit_after steps: set router_commit_after > 0 "
                         "and router_per_token=False with it (or, for per-token routers' per-head phase, "
                         "router_release_global=True)")
    if tcfg.router_release_global and tcfg.router_commit_by_iter > tcfg.router_token_from_iter:
        raise ValueError(f"router_commit_by_iter={tcfg.router_commit_by_iter} with router_release_global is a "
                         f"deadline of the per-head phase: set it to at most router_token_from_iter="
                         f"{tcfg.router_token_from_iter}")
    if tcfg.router_commit_by_iter > 0:
        from nanoaha.training import commit_start  # torch: only where a deadline is set
        earliest = commit_start(tcfg) + tcfg.router_commit_after
        if tcfg.router_commit_by_iter < earliest:
            raise ValueError(f"router_commit_by_iter={tcfg.router_commit_by_iter} comes before the decisions it "
                             f"reads: set it to at least {earliest} (the first counted step, {commit_start(tcfg)}, "
                             f"plus router_commit_after={tcfg.router_commit_after})")
    if not mcfg.router_per_token and "R" not in mcfg.layer_letters:
        raise ValueError(f"router_per_token=False decides per head in routed layers, and schedule={mcfg.schedule!r} "
                         f"has none: drop router_per_token=False, or add R to the schedule")
    if tcfg.sparse_from_iter > 0 and mcfg.routed_mode != "sparse":
        raise ValueError("sparse_from_iter switches exact -> sparse: set routed_mode='sparse' with it")
    if tcfg.router_target_global > 0 and tcfg.router_lambda == 0:
        raise ValueError("router_target_global scales lambda from router_lambda: set router_lambda > 0 with it")
