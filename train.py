"""Train a nanoAHA GPT from scratch (or resume, or fine-tune a checkpoint) on a tokenized corpus.

    python train.py configs/quickstart.py [--key=value ...]              # one CPU or GPU
    torchrun --standalone --nproc_per_node=8 train.py configs/NAME.py     # DDP

Every setting is a field of nanoaha/train_config.TrainConfig or of model.GPTConfig (--help lists them).
"""
import gc
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from data.loader import TokenData
from model import GPT, RUNTIME_KEYS, GPTConfig, GPTOutput, Routing, router_penalty
from data.atomic_files import write_json
from nanoaha.checkpoint import (BEST_NAME, load_checkpoint, load_model_state, load_resume_checkpoint, save_best,
                                save_checkpoint)
from nanoaha.configurator import parse_args_or_exit, run_main
from nanoaha.formats import stamp
from nanoaha.copy_probe import probe_during_training, training_spans
from nanoaha.device import DTYPES, autocast_context, dtype_label, dtype_name, peak_flops, pick_device, pick_dtype
from nanoaha.evaluation import evaluate_losses, label_key_tokens
from nanoaha.formatting import fixed
from nanoaha.gpt2_weights import gpt2_state_dict, is_pretrained
from nanoaha.routing_stats import (decision_stability, format_routing, mean_stats, routing_stats, routing_summary,
                                   stability_scalars, training_flops_per_token, warn_collapse)
from nanoaha.tensorboard_log import Logger, run_hparams
from nanoaha.train_config import TrainConfig, check_config, corpus_dir
from nanoaha.training import (HeadCommitter, LambdaController, StopSignals, TrainingStopped, check_same_data,
                              compile_model, configure_optimizer, lambda_ramp, lr_at, penalty_start, restore_rng,
                              routed_mode_at, router_lambda_at, routers_held_local, weights_finite)


@dataclass
class Run:
    """One training run's state, shared by the functions below. model is what the steps call (compiled and/or
    wrapped in DDP), raw_model the GPT itself (evaluation, checkpoints). setup() sets everything up to
    val_batches; the fields from iter_num on are what the loop moves."""
    tcfg: TrainConfig
    mcfg: GPTConfig
    ddp: bool
    rank: int
    world: int
    device: str
    dtype: torch.dtype
    data: TokenData
    raw_model: GPT
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    controller: LambdaController | None
    n_routers: int                      # layers with a learned router (the controller's lambdas)
    committer: HeadCommitter | None     # router_commit_after: heads whose decisions held commit to their path
    trainable_params: list              # what the optimizer updates (all, or the routers): clipped, checked
    generator: torch.Generator          # data windows and forced-global steps: seeded alike on every rank
    logger: Logger | None = None
    val_batches: list | None = None     # the fixed val windows of every evaluation
    val_key_labels: list | None = None  # their key-token labels (nanoaha/key_tokens.py), computed once
    key_k: int = 0                      # the k of those labels (the corpus' default)
    probe_sequences: torch.Tensor | None = None  # the repeat probe's val spans, each twice (None: no probe)
    iter_num: int = 0
    best_val: float = math.inf
    val_history: list = field(default_factory=list)  # [step, val loss] of every evaluation
    key_history: list = field(default_factory=list)  # [step, key-token loss, other tokens' loss] of every evaluation
    head_history: list = field(default_factory=list)  # [step, per layer and head global fraction] of every evaluation
    # [step, copy gain, per layer strongest induction score, per layer and head scores (copy_probe.HEAD_SCORES)]
    copy_history: list = field(default_factory=list)
    # [step, flicker, margin, near, per-head flips per step, bias gradients] of every evaluation
    # (routing_stats.decision_stability; flips: the share of steps since the last evaluation whose per-head
    # decision differed from the step before; bias gradients: per learned router's head, the mean gradient of its
    # bias over those steps, negative where the loss pulls the head towards global)
    decision_history: list = field(default_factory=list)
    commit_history: list = field(default_factory=list)  # [step, layer, head, path (0 local, 1 global, -1 released)]
    val_gates: list = None                             # the last evaluation's decisions on the val tokens
    head_decisions: torch.Tensor = None                # per-head routers' decisions after the last step
    head_flips: torch.Tensor = None                    # ... and how often each changed since the last evaluation
    flip_steps: int = 0
    # each learned router's head-bias gradients summed since the last evaluation, (routers, H), and their count:
    # the loss's pull on each head's decision before the optimizer rescales it (Adam moves every bias whose
    # gradient keeps its sign at about the same rate, however strong the pull)
    bias_grads: torch.Tensor = None
    bias_grad_steps: int = 0
    last_eval: dict = field(default_factory=dict)    # val, key and other loss and routing of the latest evaluation
    losses: list = field(default_factory=list)       # every step's training loss (this rank's last micro-step)
    saved_step: int | None = None                    # the step of the latest checkpoint this run wrote ...
    best_step: int | None = None                     # ... and of the best one
    nonfinite_run: int = 0                           # skipped steps in a row, and in all
    nonfinite_total: int = 0
    started: float = 0.0                             # the loop's start, for wall_s
    wall_before: float | None = 0.0                  # training wall time behind the resumed checkpoint (None: unknown)
    train_time: float = 0.0                          # seconds in training steps (no evaluation), for tokens/s
    steps_timed: int = 0
    # attention FLOPs relative to dense, ideal and computed, summed over the logged steps of the whole run (every
    # log_interval-th, over resumes), and their count: what training cost where decisions changed (commits);
    # None: unknown (resumed from a checkpoint that kept none)
    flop_sums: list | None = field(default_factory=lambda: [0.0, 0.0, 0])

    @property
    def master(self):
        return self.rank == 0

    @property
    def device_type(self):
        return "cuda" if self.device.startswith("cuda") else "cpu"

    @property
    def autocast(self):
        return autocast_context(self.device, self.dtype)

    @property
    def ckpt_path(self):
        return os.path.join(self.tcfg.out_dir, "ckpt.pt")

    @property
    def best_path(self):
        return os.path.join(self.tcfg.out_dir, BEST_NAME)

    @property
    def global_batch(self):
        return self.tcfg.batch_size * self.tcfg.grad_accum * self.world


@dataclass
class Step:
    """What a training step leaves for the log line and the loop."""
    out: GPTOutput      # the last micro-step's output
    loss: list          # its [loss, lm_loss, penalty added, mean p] as numbers
    lr: float
    lam: object         # the penalty weight: a number, or a tensor with one weight per routed layer
    force_global: bool
    held_local: bool    # router_local_iters: every routed decision ran local
    stop: bool          # a stop signal reached some rank


def end_ddp(run, finished):
    """Tear DDP down in one order on every rank. The DDP wrapper's reducer holds the process group and its pending
    work: left to the garbage collector, it can be destroyed while the interpreter shuts down, after the group,
    and gloo then aborts the process ("terminate called without an active exception", exit status 1 after a
    finished run). So the wrapper goes first; after a finished run the ranks then wait for each other (rank 0
    still writes the last checkpoint while the others are done), and only then is the group destroyed."""
    if run is not None:
        run.model = None
    gc.collect()
    if finished:
        dist.barrier()
    dist.destroy_process_group()


def claim_out_dir(tcfg, master):
    """A new run refuses a folder that holds a checkpoint, unless told to overwrite it."""
    ckpt_path, best_path = os.path.join(tcfg.out_dir, "ckpt.pt"), os.path.join(tcfg.out_dir, BEST_NAME)
    if tcfg.init_from == "resume" or not os.path.exists(ckpt_path):
        return
    if not tcfg.overwrite:
        raise ValueError(f"{ckpt_path} exists: continue that run with --init_from=resume, or start over in "
                         f"this folder with --overwrite (or choose another --out_dir)")
    if master and os.path.exists(best_path):
        os.remove(best_path)  # the best of the replaced run


def keep_precision(run, trained_in):
    """A run resumed under dtype='auto' continues in the precision it trained in (auto picks per machine, and a
    checkpoint may move to one that picks another); a dtype named on the command line is used as given."""
    if trained_in is None or trained_in == dtype_name(run.dtype):
        return
    if run.tcfg.dtype == "auto":
        run.dtype = DTYPES[trained_in]
        run.scaler = torch.amp.GradScaler(run.device_type, enabled=run.dtype == torch.float16)
        note = f"continues in {trained_in}, the precision it trained in (dtype=auto; --dtype=NAME to change it)"
    else:
        note = f"trained in {trained_in} so far, continues in {run.tcfg.dtype} (--dtype={run.tcfg.dtype})"
    if run.master:
        print(f"resuming: the run {note}")


def resume(run):
    """The run continues where its checkpoint left off: weights, optimizer, scaler, step, best val loss,
    lambda controller and every RNG (exactly, with the same number of processes)."""
    tcfg = run.tcfg
    resumed_from, ckpt = load_resume_checkpoint(tcfg.out_dir, run.device)
    keep_precision(run, ckpt["dtype"])  # None: unknown (nanoaha/formats.py)
    now = asdict(run.mcfg)
    changed = {k: (v, now.get(k)) for k, v in ckpt["model_config"].items() if now.get(k) != v and k not in RUNTIME_KEYS}
    if changed:
        raise ValueError(f"cannot resume {resumed_from}: model config differs (checkpoint, now): {changed}")
    if ckpt["optimizer"] is None:
        raise ValueError(f"cannot resume {resumed_from}: it holds no optimizer state (a pruned checkpoint); "
                         f"fine-tune it with --init_from={resumed_from} instead")
    check_same_data(ckpt["data_meta"], run.data.meta, resumed_from)
    load_model_state(run.raw_model, ckpt["model"], resumed_from)
    run.optimizer.load_state_dict(ckpt["optimizer"])
    if ckpt["scaler"] is not None:
        run.scaler.load_state_dict(ckpt["scaler"])
    run.iter_num, run.best_val, run.val_history = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["val_history"]
    run.key_history, run.head_history = ckpt["key_history"], ckpt["head_history"]
    run.copy_history, run.decision_history = ckpt["copy_history"], ckpt["decision_history"]
    run.commit_history = ckpt["commit_history"]
    # a signal before the resumed run's first evaluation still writes the summary at the step it stopped
    run.last_eval = ckpt["last_eval"]
    if run.committer is not None and ckpt["commit_streak"] is not None:
        run.committer.streak = ckpt["commit_streak"]
    if run.committer is not None and run.committer.recent is not None and ckpt["commit_recent"] is not None:
        run.committer.recent = ckpt["commit_recent"]
    run.wall_before = ckpt["train_wall_s"]  # None: unknown (an old checkpoint kept no wall time)
    run.flop_sums = ckpt["attention_flop_sums"]
    # what the folder holds, for the divergence message: the resumed checkpoint, the best of the earlier steps
    run.saved_step = run.iter_num if resumed_from == run.ckpt_path else None
    run.best_step = next((step for step, loss in run.val_history if loss == run.best_val), None)
    if run.controller is not None and ckpt["router_lambda_state"] is not None:
        run.controller.u = ckpt["router_lambda_state"]
    message = restore_rng(ckpt["rng"], run.generator, run.rank, run.world, tcfg.seed, run.iter_num)
    saved = ckpt["train_config"]
    saved_batch = saved["batch_size"] * saved["grad_accum"] * len(ckpt["rng"]["torch"])
    if message and run.master:
        order = "continues unchanged" if saved_batch == run.global_batch else \
            f"changes: the global batch is now {run.global_batch} windows (was {saved_batch})"
        print(f"{message}; the data order {order}")


def start_from(run):
    """init_from: 'scratch' keeps the fresh weights; 'resume' continues the run in out_dir; GPT-2 weights or a
    checkpoint's are fine-tuned (routers they lack start fresh), a checkpoint's on the data that follows its own."""
    init_from = run.tcfg.init_from
    if init_from == "resume":
        resume(run)
    elif is_pretrained(init_from):
        load_model_state(run.raw_model, gpt2_state_dict(init_from, run.mcfg), init_from, allow_new_routers=True)
    elif init_from != "scratch":
        ckpt = load_checkpoint(init_from, run.device)
        load_model_state(run.raw_model, ckpt["model"], init_from, allow_new_routers=True)
        # the data stream goes on from where the checkpoint's left it: re-seeded from `seed`, a fine-tuning run
        # would train on the very batches its start trained on (at equal seeds, those of its dense half)
        if ckpt.get("rng") and ckpt["rng"].get("data") is not None:
            run.generator.set_state(ckpt["rng"]["data"])
        elif run.master:
            tqdm.write(f"{init_from} keeps no data stream (a pruned checkpoint): its batches start from seed "
                       f"{run.tcfg.seed}'s data order {run.tcfg.data_order}, and may repeat what it trained on")


def setup(tcfg, mcfg, ddp, rank, world, device):
    """The run, ready for its first step: data, model, optimizer, what it starts from, the wrapped model."""
    check_config(tcfg, mcfg)
    dtype = pick_dtype(tcfg.dtype, device)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    data = TokenData(corpus_dir(tcfg.data_dir, tcfg.dataset), mcfg.block_size, mcfg.vocab_size,
                     tcfg.doc_aligned_windows)
    claim_out_dir(tcfg, rank == 0)

    # Every rank draws the same data windows and forced-global steps (generator, seeded alike) and takes its own
    # slice of the global batch; random routing and dropout draw from torch's RNG, seeded per rank.
    torch.manual_seed(tcfg.seed + rank)
    generator = torch.Generator().manual_seed(tcfg.data_order_seed)
    model = GPT(mcfg).to(device)
    n_routers = len(model.routers())
    controller = LambdaController(tcfg, n_routers) if tcfg.router_target_global > 0 else None
    committer = HeadCommitter(tcfg, model.routers(), mcfg.router_global_heads) \
        if tcfg.router_commit_after > 0 else None
    if tcfg.trainable == "router":
        for name, param in model.named_parameters():
            param.requires_grad_(".router." in name)
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    run = Run(tcfg, mcfg, ddp, rank, world, device, dtype, data, raw_model=model, model=model,
              optimizer=configure_optimizer(model, tcfg, device_type),
              scaler=torch.amp.GradScaler(device_type, enabled=dtype == torch.float16),  # fp16 needs loss scaling
              controller=controller, n_routers=n_routers, committer=committer,
              trainable_params=[p for p in model.parameters() if p.requires_grad], generator=generator)
    start_from(run)
    if tcfg.compile:
        run.model = compile_model(run.model)
    if ddp:
        run.model = DDP(run.model, device_ids=[int(device.split(":")[1])] if device_type == "cuda" else None)
    if run.master:
        os.makedirs(tcfg.out_dir, exist_ok=True)
        print(f"{model.num_params() / 1e6:.2f}M parameters, layers {mcfg.layer_letters}, "
              f"window {mcfg.window}, device {device}, {dtype_label(tcfg.dtype, device, run.dtype)}, "
              f"{world} process(es)")
    run.logger = Logger(os.path.join(tcfg.out_dir, "tb"), tcfg.tensorboard and run.master)
    run.val_batches = data.val_batches(tcfg.batch_size, tcfg.eval_iters)
    run.val_key_labels, run.key_k = label_key_tokens(run.val_batches, mcfg, data.meta["vocab_size"])
    spans = training_spans(data, mcfg.block_size, mcfg.window, tcfg.probe_spans) if run.master else None
    run.probe_sequences = None if spans is None else spans.to(device)
    return run


def forward_backward(run, lam, routing):
    """This rank's slice of the global batch in grad_accum micro-steps (DDP syncs gradients on the last one), each
    micro-step's loss its LM loss plus the router penalty at weight lam; returns the last micro-step's output,
    its [loss, lm_loss, penalty, mean p] and whether every micro-step's loss was finite."""
    tcfg = run.tcfg
    starts = run.data.train_starts(run.global_batch, run.generator)
    loss_ok = torch.ones((), dtype=torch.bool, device=run.device)
    for micro in range(tcfg.grad_accum):
        first = (micro * run.world + run.rank) * tcfg.batch_size
        x, y = run.data.batch("train", starts[first:first + tcfg.batch_size])
        x, y = x.to(run.device), y.to(run.device)
        sync = not run.ddp or micro == tcfg.grad_accum - 1
        with nullcontext() if sync else run.model.no_sync():
            with run.autocast:
                out = run.model(x, y, routing)
                penalty = router_penalty(out, lam, tcfg.router_budget)
                loss = out.lm_loss + penalty
            run.scaler.scale(loss / tcfg.grad_accum).backward()
        loss_ok &= torch.isfinite(loss.detach())
    parts = torch.stack([loss.detach(), out.lm_loss.detach(), penalty.detach(), out.layer_p.detach().mean()])
    return out, parts.tolist(), loss_ok


def any_rank(run, *flags):
    """Each flag, true if it is true on any rank: one reduction per step."""
    flags = torch.stack([torch.as_tensor(flag, device=run.device) for flag in flags]).float()
    if run.ddp:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return [bool(flag) for flag in flags.tolist()]


def train_wall(run):
    """Seconds of training behind the model now, summed over the processes that trained it: what the resumed
    checkpoint carried plus this process's loop. A process killed without a checkpoint counts up to its last
    one (its later steps are trained again); None where an old checkpoint left it unknown."""
    return None if run.wall_before is None else run.wall_before + time.time() - run.started


def mean_flop_fracs(sums):
    """{'ideal', 'computed', 'logged_steps'}: the attention FLOPs relative to dense, mean over the run's logged
    steps; None where unknown or none was logged."""
    if sums is None or not sums[2]:
        return None
    return {"ideal": sums[0] / sums[2], "computed": sums[1] / sums[2], "logged_steps": sums[2]}


def run_summary(run, final):
    """train_summary.json: where the run is and its latest evaluation (the grid runner reads it)."""
    routing = routing_summary(run.last_eval["routing"], run.mcfg.kinds)
    tokens = run.steps_timed * run.global_batch * run.mcfg.block_size
    return {"iter_num": run.iter_num, "max_iters": run.tcfg.max_iters, "complete": final, "dtype": dtype_name(run.dtype),
            "val_loss": run.last_eval["val_loss"], "key_loss": run.last_eval["key_loss"],
            "other_loss": run.last_eval["other_loss"], "key_frac": run.last_eval["key_frac"],
            "key_tokens": {"k": run.key_k, "window": run.mcfg.window, "n_sink": run.mcfg.n_sink},
            "tokens_per_s": tokens / run.train_time if run.train_time else None,
            "wall_s": time.time() - run.started, "train_wall_s": train_wall(run),
            "routed_global_frac": routing["global_frac"],
            "model_ideal_flop_frac": routing["attention_flop_frac_ideal"],
            "model_computed_flop_frac": routing["attention_flop_frac_computed"],
            "attention_flop_frac_training": mean_flop_fracs(run.flop_sums),
            "global_frac_per_layer": routing["global_frac_per_layer"], "val_history": run.val_history,
            "key_history": run.key_history, "copy_history": run.copy_history, "decision_history": run.decision_history,
            "commit_history": run.commit_history,
            "router_lambdas": run.controller.lam.tolist() if run.controller is not None else None,
            "nonfinite_steps": run.nonfinite_total}


def write_summary(run, final=False):
    """train_summary.json (rank 0), once an evaluation has given it numbers."""
    if run.master and run.last_eval:
        summary = stamp("train_summary", run_summary(run, final))
        write_json(os.path.join(run.tcfg.out_dir, "train_summary.json"), summary)


def skip_step(run, bad_loss):
    """A non-finite loss or gradient: no update; max_nonfinite_steps in a row end the run."""
    run.optimizer.zero_grad(set_to_none=True)
    if run.scaler.is_enabled():
        run.scaler.update()
    run.nonfinite_run, run.nonfinite_total = run.nonfinite_run + 1, run.nonfinite_total + 1
    if run.master:
        tqdm.write(f"WARNING step {run.iter_num}: non-finite {'loss' if bad_loss else 'gradient'}, step skipped "
                   f"({run.nonfinite_run} in a row, {run.nonfinite_total} in all)")
    if run.nonfinite_run >= run.tcfg.max_nonfinite_steps:
        write_summary(run)  # the summary of the last evaluation counted none of these steps
        kept = [f"{run.ckpt_path} holds step {run.saved_step}"] if run.saved_step is not None else []
        if run.best_step is not None:
            kept.append(f"{run.best_path} holds step {run.best_step} (val loss {run.best_val:.4f})")
        raise TrainingStopped(
            f"the run diverged: {run.nonfinite_run} non-finite steps in a row at step {run.iter_num}; lower "
            f"learning_rate={run.tcfg.learning_rate:g} or raise warmup_iters={run.tcfg.warmup_iters}; "
            f"{' and '.join(kept) or 'no checkpoint was written'}")


def update_controller(run, out, force_global):
    """Budget-targeted lambda: each routed layer's global fraction of the step (mean over ranks) moves it. A
    forced-global step says nothing about the routers' choice, and before penalty_start (router_lambda_start,
    router_local_iters) there is none.
    The fraction is the routers' own (p >= threshold): router_explore's extra global decisions are training's
    only, so counting them would leave the trained model below its target by the explored share. Under a head
    budget the decisions are the gates it left (its unchosen heads are local whatever their p; router_explore is
    refused with it)."""
    if run.controller is None or force_global or run.iter_num < penalty_start(run.tcfg):
        return
    budget = run.mcfg.router_global_heads > 0
    fracs = torch.stack([(gate if budget else p >= run.mcfg.router_threshold).float().mean()
                         for gate, p in zip(out.gates, out.probs) if p is not None])
    if run.ddp:
        dist.all_reduce(fracs)
        fracs = fracs / run.world
    run.controller.update(fracs.cpu())


def learned_router_layers(run):
    """The layers with a learned router, in order (the rows of run.raw_model.routers())."""
    return [i for i, block in enumerate(run.raw_model.blocks) if block.attn.router is not None]


def per_head_routers(run):
    """The layers whose routers decide per head (router_per_token=False), in order."""
    return [i for i in learned_router_layers(run) if run.raw_model.blocks[i].attn.router.bias is not None]


def over_layers(run, layers, rows):
    """rows, one per layer of `layers`, as a list over every layer: None where a layer has no row."""
    by_layer = dict(zip(layers, rows))
    return [by_layer.get(i) for i in range(len(run.raw_model.blocks))]


def commit_heads(run, out, force_global, held_local):
    """router_commit_after: each learned router's heads' global share of the step's tokens (mean over ranks)
    moves the HeadCommitter; a forced step's decisions are not the routers'."""
    if run.committer is None or force_global or held_local:
        return
    layers = learned_router_layers(run)
    fracs = torch.stack([out.gates[i].float().mean((0, 2)) for i in layers])
    if run.ddp:
        dist.all_reduce(fracs)
        fracs = fracs / run.world
    for router, head, path in run.committer.update(run.iter_num, fracs.cpu()):
        run.commit_history.append([run.iter_num, layers[router], head, path])
        if run.master:
            tqdm.write(f"step {run.iter_num}: layer {layers[router]} head {head} commits to "
                       f"{'global' if path else 'local'} attention")


def release_global_heads(run):
    """router_release_global, at router_token_from_iter: the heads the per-head phase committed global route
    their tokens from this step on (their token weights, held at zero until now, start to learn)."""
    layers = learned_router_layers(run)
    for router, head in run.committer.release():
        run.commit_history.append([run.iter_num, layers[router], head, -1])
        if run.master:
            tqdm.write(f"step {run.iter_num}: layer {layers[router]} head {head} released: its router decides its "
                       f"tokens")


def count_head_flips(run):
    """Per-head routers (router_per_token=False) decide from no input (Router.head_decisions): count, per head,
    the steps whose decision differs from the step before's (the decisions' flicker step by step;
    decision_stability measures every router's on the val tokens at each evaluation)."""
    layers = per_head_routers(run)
    if not layers:
        return
    chosen = run.raw_model.chosen_heads()
    decisions = torch.stack([run.raw_model.blocks[i].attn.router.head_decisions(chosen=chosen[i])
                             for i in layers]).cpu()
    if run.head_decisions is not None:
        flips = (decisions != run.head_decisions).float()
        run.head_flips = flips if run.head_flips is None else run.head_flips + flips
        run.flip_steps += 1
    run.head_decisions = decisions


def step_bias_grads(run):
    """Each learned router's head-bias gradient of this step, (routers, H), on the device (every micro-step's,
    all-reduced: the same on every rank; committed heads' are zero), before clipping rescales it; None without
    routers. The step, once taken, adds it to run.bias_grads: evaluation reports their mean per head."""
    routers = run.raw_model.routers()
    if not routers or any(router.head_bias.grad is None for router in routers):
        return None
    grads = torch.stack([router.head_bias.grad.detach().float() for router in routers])
    return torch.where(torch.isfinite(grads), grads, 0.0)  # fp16: the scaler skips such a step; no sync to find out


def hold_token_weights(run):
    """router_token_from_iter: before it, the routers' token weights (W, and the weights on the local output)
    get no update, so they stay at zero and every router decides from its bias alone, one decision per head: a
    per-head schedule first, from which per-token routing starts."""
    for block in run.raw_model.blocks:
        router = block.attn.router
        for weight in () if router is None or router.logits is None else (router.logits.weight, router.local_weight):
            if weight is not None:
                weight.grad = None  # AdamW skips a parameter without a gradient: no step, no weight decay


def train_step(run, signals):
    """One guarded optimizer step at run.iter_num: forward and backward over the micro-steps; then, agreed by
    every rank, a non-finite loss or gradient skips the step (skip_step) and a taken step moves the lambda
    controller (update_controller)."""
    tcfg, it = run.tcfg, run.iter_num
    step_start = time.time()
    lr = lr_at(it, tcfg)
    lam = router_lambda_at(it, tcfg) if run.controller is None else \
        run.controller.weights(run.n_routers) * lambda_ramp(it, tcfg)
    for group in run.optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)
    held_local = routers_held_local(it, tcfg)
    if tcfg.router_release_global and it == tcfg.router_token_from_iter:
        release_global_heads(run)
    # drawn every step, so the data order does not depend on router_local_iters; held local wins
    force_global = bool(torch.rand((), generator=run.generator) < tcfg.p_dense) and not held_local
    routing = Routing(mode=routed_mode_at(it, tcfg, run.mcfg),
                      force="local" if held_local else "global" if force_global else None)
    out, loss, loss_ok = forward_backward(run, lam, routing)
    if it < tcfg.router_token_from_iter:
        hold_token_weights(run)
    if run.scaler.is_enabled():
        run.scaler.unscale_(run.optimizer)
    bias_grads = step_bias_grads(run)
    params = run.trainable_params
    grad_norm = torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip) if tcfg.grad_clip > 0 else \
        torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    bad_loss, bad_grad, stop = any_rank(run, ~loss_ok, ~torch.isfinite(grad_norm), signals.received is not None)
    # with fp16 an overflowing gradient is the scaler's business: it skips the step and scales down
    if bad_loss or (bad_grad and not run.scaler.is_enabled()):
        skip_step(run, bad_loss)
    else:
        run.nonfinite_run = 0
        if bias_grads is not None:  # summed on the device until evaluation
            run.bias_grads = bias_grads if run.bias_grads is None else run.bias_grads + bias_grads
            run.bias_grad_steps += 1
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.optimizer.zero_grad(set_to_none=True)
        update_controller(run, out, force_global)
        commit_heads(run, out, force_global, held_local)
        count_head_flips(run)
    run.losses.append(loss[0])
    run.train_time, run.steps_timed = run.train_time + time.time() - step_start, run.steps_timed + 1
    return Step(out, loss, lr, lam, force_global, held_local, stop)


def gathered(run, obj):
    """obj from every rank, in rank order (every rank takes part)."""
    if not run.ddp:
        return [obj]
    out = [None] * run.world
    dist.all_gather_object(out, obj)
    return out


def checkpoint_state(run):
    """What resuming needs (nanoaha/checkpoint.py describes the dict). model_config is the config as given: a
    run in sparse_from_iter's exact steps records the mode it trains towards."""
    cuda = torch.cuda.get_rng_state() if run.device_type == "cuda" else None
    return {"model": run.raw_model.state_dict(), "optimizer": run.optimizer.state_dict(),
            "scaler": run.scaler.state_dict() if run.scaler.is_enabled() else None,
            "model_config": asdict(run.mcfg), "train_config": asdict(run.tcfg), "dtype": dtype_name(run.dtype),
            "iter_num": run.iter_num, "best_val_loss": run.best_val, "val_history": run.val_history,
            "key_history": run.key_history, "head_history": run.head_history, "copy_history": run.copy_history,
            "decision_history": run.decision_history, "commit_history": run.commit_history,
            "commit_streak": run.committer.streak if run.committer is not None else None,
            "commit_recent": run.committer.recent if run.committer is not None else None,
            "train_wall_s": train_wall(run), "attention_flop_sums": run.flop_sums, "last_eval": run.last_eval,
            "router_lambda_state": run.controller.u if run.controller is not None else None,
            "data_meta": run.data.meta,
            "rng": {"torch": gathered(run, torch.get_rng_state()), "cuda": gathered(run, cuda),
                    "data": run.generator.get_state()}}


def save(run, is_best):
    """Every rank takes part (the RNG states are gathered); rank 0 writes. Never from non-finite weights.
    Returns whether a checkpoint was written."""
    if not run.tcfg.save_checkpoint:
        return False
    if not weights_finite(run.raw_model):
        if run.master:
            tqdm.write(f"WARNING step {run.iter_num}: the weights are not finite; no checkpoint written "
                       f"({run.ckpt_path} keeps the last good one)")
        return False
    state = checkpoint_state(run)
    if run.master:
        save_checkpoint(run.ckpt_path, state)
        if is_best:
            save_best(run.ckpt_path, run.best_path)
    run.saved_step = run.iter_num
    run.best_step = run.iter_num if is_best else run.best_step
    return True


def record_at(history, entry):
    """Append [step, ...] to an evaluation history; a resume at an evaluation's step evaluates it again and
    replaces that entry."""
    if history and history[-1][0] == entry[0]:
        history[-1] = entry
    else:
        history.append(entry)


def evaluate_and_save(run, final=False):
    """Val loss (and apart on key tokens and the others) and routing on the fixed val batches, logged; a
    checkpoint (and the best one) if the loss is finite; train_summary.json."""
    tcfg, mcfg, it = run.tcfg, run.mcfg, run.iter_num
    # evaluate_losses draws from a fixed RNG (training's does not move); its 'computed' FLOPs count the model's
    # routed_mode, also during sparse_from_iter's exact steps
    # while router_local_iters holds the routers local, the model that trains is the all-local one
    held = Routing(force="local") if routers_held_local(it, tcfg) else None
    decisions = []
    losses, stats = evaluate_losses(run.raw_model, run.val_batches, run.autocast, held, run.val_key_labels,
                                    decisions=decisions)
    stability = decision_stability(run.val_gates, decisions, mcfg.router_threshold)
    run.val_gates = stability.pop("gates")
    # the means since the last evaluation, per layer; then the sums restart
    flips = None if run.head_flips is None else \
        over_layers(run, per_head_routers(run), (run.head_flips / max(1, run.flip_steps)).tolist())
    bias_grads = None if run.bias_grads is None else \
        over_layers(run, learned_router_layers(run), (run.bias_grads / run.bias_grad_steps).cpu().tolist())
    run.head_flips, run.flip_steps, run.bias_grads, run.bias_grad_steps = None, 0, None, 0
    val_loss = losses["val_loss"]
    finite = math.isfinite(val_loss)
    is_best = finite and val_loss < run.best_val
    run.best_val = min(run.best_val, val_loss) if finite else run.best_val
    for history, entry in ((run.val_history, [it, val_loss]),
                           (run.key_history, [it, losses["key_loss"], losses["other_loss"]]),
                           (run.head_history, [it, stats["global_frac"].tolist()]),
                           (run.decision_history, [it, stability["flicker"], stability["margin"], stability["near"],
                                                   flips, bias_grads])):
        record_at(history, entry)
    run.last_eval = {**losses, "routing": stats}
    copy = ""
    if run.probe_sequences is not None and finite:  # rank 0 only (setup); no collective inside
        gain, induction, heads = probe_during_training(run.raw_model, run.probe_sequences, run.autocast)
        record_at(run.copy_history, [it, gain, induction, heads])
        run.logger.scalars(it, {"val/copy_gain": gain, **{f"val_probe/induction_max/layer{i}": v for i, (v, kind)
                                                          in enumerate(zip(induction, mcfg.kinds)) if kind != "local"},
                                # per head, one section per layer; previous-token scores of local layers too
                                **{f"val_probe_{score}_layer{i}/head{h}": value
                                   for score in ("previous", "induction") for i, layer in enumerate(heads[score])
                                   if score == "previous" or mcfg.kinds[i] != "local"
                                   for h, value in enumerate(layer)}})
        copy = f" | copy gain {gain:+.3f}"
    if run.master:
        tqdm.write(f"step {it}: val loss {val_loss:.4f} (key tokens {fixed(losses['key_loss'])}, other "
                   f"{fixed(losses['other_loss'])}){copy} | {format_routing(stats)}")
        if finite:
            # a layer whose heads all committed decided its path, one that a head budget gave no head is local by
            # design: no collapse
            chosen = run.raw_model.chosen_heads()
            decided = [i for i, block in enumerate(run.raw_model.blocks)
                       if (paths := block.attn.paths()) is not None and -1 not in paths
                       or chosen[i] is not None and not chosen[i].any()]
            warn_collapse(stats, mcfg.kinds, tcfg.collapse_frac, it, decided)
            run.logger.scalars(it, stability_scalars(stability, flips, bias_grads))
            run.logger.evaluation(it, losses, stats, run.raw_model, run.val_batches[0][0].to(run.device),
                                  run.data.meta, run.autocast, head_history=run.head_history)
        else:
            tqdm.write(f"WARNING step {it}: val loss is not finite (the model diverged); no checkpoint written "
                       f"({run.ckpt_path} keeps the last good one)")
    if finite:
        save(run, is_best)
    write_summary(run, final)


def log_step(run, step, dt):
    """The log line and TensorBoard scalars of the step just taken, from every rank's numbers (every rank takes
    part). dt: seconds per step since the last log line."""
    out, tcfg, mcfg = step.out, run.tcfg, run.mcfg
    ranks = gathered(run, {"stats": routing_stats(out, run.raw_model.config),
                           "losses": step.loss})
    if not run.master:
        return
    stats = mean_stats([r["stats"] for r in ranks])
    if run.flop_sums is not None:
        run.flop_sums = [run.flop_sums[0] + stats["model_ideal_flop_frac"].item(),
                         run.flop_sums[1] + stats["model_computed_flop_frac"].item(), run.flop_sums[2] + 1]
    loss, lm_loss, penalty, mean_p = (sum(v) / len(ranks) for v in zip(*(r["losses"] for r in ranks)))
    eta, tok_s = dt * (tcfg.max_iters - run.iter_num), run.global_batch * mcfg.block_size / dt
    n_params, peak = run.raw_model.num_params(), tcfg.peak_flops or peak_flops(run.device, run.dtype)
    flops = training_flops_per_token(mcfg, n_params, stats["model_computed_flop_frac"]) * tok_s / run.world
    mfu = f", MFU {flops / peak:.1%}" if peak else ""
    lam = float(torch.as_tensor(step.lam).float().mean())
    # the router's numbers only where a layer has a learned router: elsewhere lambda would ramp over nothing
    router = {"train/penalty_added": penalty, "train/mean_p": mean_p, "train/lambda": lam} if run.n_routers else {}
    loss_parts = f" (lm {lm_loss:.4f} + penalty {penalty:.2g}; mean p {mean_p:.3f}, lambda {lam:.2g})" \
        if run.n_routers else ""
    tqdm.write(f"iter {run.iter_num}: loss {loss:.4f}{loss_parts} | {format_routing(stats)}"
               f"{' [forced global]' if step.force_global else ''}{' [held local]' if step.held_local else ''} | lr {step.lr:.2e} | {tok_s:,.0f} tok/s "
               f"({flops / 1e12:.3g} TFLOP/s per device{mfu}) | ETA {eta / 60:.1f} min")
    scalars = {"train/loss": loss, "train/lm_loss": lm_loss, **router, "train/lr": step.lr,
               "train/tokens_per_s": tok_s, "train/tflops_per_device": flops / 1e12,
               "train/nonfinite_steps": run.nonfinite_total}
    run.logger.scalars(run.iter_num, {**scalars, **({"train/mfu": flops / peak} if peak else {})})
    run.logger.routing(run.iter_num, "train_routing", stats, mcfg.kinds)


def minutes(seconds):
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def closing_line(run, wall):
    """The run's last line: steps, this process's wall time (and the run's in all, where it resumed), the best
    val loss (training's evaluation, on its own val windows: evaluate.py's fixed ones give another number) and
    where the checkpoints are."""
    n_windows = sum(len(x) for x, _ in run.val_batches)
    step = next((step for step, loss in run.val_history if loss == run.best_val), None)
    at = f"step {step}; " if step is not None else ""
    best = f"best val loss {run.best_val:.4f} ({at}training's evaluation on its {n_windows} val windows)" \
        if math.isfinite(run.best_val) else "no finite val loss"
    total = train_wall(run)
    resumed = f" ({minutes(total)} with the steps it resumed)" if total is not None and total > wall + 1 else ""
    saved = f"checkpoint {run.ckpt_path}, best {run.best_path}" if run.tcfg.save_checkpoint else \
        "no checkpoint written (save_checkpoint=False)"
    return f"done: {run.iter_num:,} steps in {minutes(wall)}{resumed}; {best}; {saved}"


def stop_on_signal(run, signals):
    """SIGTERM or SIGINT (on any rank): save this step, write the summary, end with 128 + the signal."""
    name = signal.Signals(signals.received).name if signals.received else "a signal on another rank"
    saved = save(run, is_best=False)
    write_summary(run)
    where = f"saved {run.ckpt_path} at step {run.iter_num}; continue with --init_from=resume" if saved else \
        f"no checkpoint written at step {run.iter_num}"
    raise TrainingStopped(f"stopped by {name}: {where}", 128 + (signals.received or signal.SIGTERM))


def train_loop(run, signals):
    """Evaluate and save every eval_interval steps and at the end, log every log_interval steps; a stop signal
    saves the step it arrived at and ends the run."""
    tcfg = run.tcfg
    show_bar = run.master and tcfg.progress_bar and sys.stderr.isatty()
    bar = tqdm(total=tcfg.max_iters, initial=run.iter_num, disable=not show_bar, dynamic_ncols=True, leave=False)
    run.started = time.time()
    t_last, iters_timed = time.time(), 0  # the steps since the last log line, for its step time
    try:
        while run.iter_num < tcfg.max_iters:
            if run.iter_num % tcfg.eval_interval == 0:
                evaluate_and_save(run)
                t_last, iters_timed = time.time(), 0
            step = train_step(run, signals)
            run.iter_num += 1
            iters_timed += 1
            bar.update(1)
            if run.iter_num % tcfg.log_interval == 0 or run.iter_num == tcfg.max_iters:
                log_step(run, step, (time.time() - t_last) / iters_timed)
                t_last, iters_timed = time.time(), 0
            if step.stop:
                stop_on_signal(run, signals)
        bar.close()
        evaluate_and_save(run, final=True)
        run.logger.hparams(run_hparams(tcfg, run.mcfg, dtype_name(run.dtype)))
        if run.master:
            print(closing_line(run, time.time() - run.started))
    finally:
        bar.close()
        run.logger.close()
    return {**run.last_eval, "losses": run.losses}


def train(tcfg, mcfg):
    """Run training; returns a dict with the per-step losses and the final val loss/routing."""
    with StopSignals() as signals:
        ddp = int(os.environ.get("RANK", -1)) != -1
        if ddp:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend)
            rank, world = dist.get_rank(), dist.get_world_size()
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if backend == "nccl" else "cpu"
            if backend == "nccl":
                torch.cuda.set_device(device)
        else:
            rank, world, device = 0, 1, pick_device(tcfg.device)
        run, finished = None, False
        try:
            run = setup(tcfg, mcfg, ddp, rank, world, device)
            result = train_loop(run, signals)
            finished = True
            return result
        finally:
            if ddp:
                end_ddp(run, finished)


def main(argv):
    tcfg, mcfg = parse_args_or_exit(argv, TrainConfig, GPTConfig, usage=__doc__)
    try:
        train(tcfg, mcfg)
    except TrainingStopped as e:
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
