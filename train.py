"""Train a nanoAHA GPT from scratch (or resume, or fine-tune a checkpoint) on a tokenized corpus.

    python train.py configs/quickstart.py [--key=value ...]              # one CPU or GPU
    torchrun --standalone --nproc_per_node=8 train.py configs/NAME.py     # DDP

Every setting is a field of nanoaha/train_config.TrainConfig or of model.GPTConfig (--help lists them).
"""
import math
import os
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from nanoaha.atomic_files import write_json
from nanoaha.checkpoint import (BEST_NAME, load_checkpoint, load_model_state, load_resume_checkpoint, save_best,
                        save_checkpoint)
from nanoaha.configurator import parse_args_or_exit, run_main
from data.loader import TokenData
from nanoaha.device import autocast_context, peak_flops, pick_device, pick_dtype
from nanoaha.evaluation import evaluate_loss
from nanoaha.gpt2_weights import gpt2_state_dict, is_pretrained
from model import GPT, RUNTIME_KEYS, GPTConfig
from nanoaha.routing_stats import (format_routing, mean_stats, routing_stats, routing_summary, training_flops_per_token,
                           warn_collapse)
from nanoaha.tensorboard_log import Logger
from nanoaha.train_config import TrainConfig, check_config


def lr_at(it, cfg):
    decay_iters = cfg.lr_decay_iters or cfg.max_iters
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / cfg.warmup_iters
    if it >= decay_iters:
        return cfg.min_lr
    ratio = (it - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def lambda_ramp(it, cfg):
    """The penalty's schedule, a factor in [0, 1]: 0 before router_lambda_start, then a linear ramp."""
    if it < cfg.router_lambda_start:
        return 0.0
    if cfg.router_lambda_ramp <= 0:
        return 1.0
    return min(1.0, (it - cfg.router_lambda_start + 1) / cfg.router_lambda_ramp)


def router_lambda_at(it, cfg):
    return cfg.router_lambda * lambda_ramp(it, cfg)


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


def train(tcfg, mcfg):
    """Run training; returns a dict with the per-step losses and the final val loss/routing."""
    with StopSignals() as signals:
        return _train(tcfg, mcfg, signals)


def _train(tcfg, mcfg, signals):
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
    try:
        return _train_on(tcfg, mcfg, signals, ddp, rank, world, device)
    finally:
        if ddp:
            dist.destroy_process_group()


def _train_on(tcfg, mcfg, signals, ddp, rank, world, device):
    check_config(tcfg, mcfg)
    master = rank == 0
    dtype = pick_dtype(tcfg.dtype, device)
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    autocast = autocast_context(device, dtype)
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    data_dir = tcfg.data_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", tcfg.dataset)
    data = TokenData(data_dir, mcfg.block_size, mcfg.vocab_size, tcfg.doc_aligned_windows)
    ckpt_path, best_path = os.path.join(tcfg.out_dir, "ckpt.pt"), os.path.join(tcfg.out_dir, BEST_NAME)
    if tcfg.init_from != "resume" and os.path.exists(ckpt_path):
        if not tcfg.overwrite:
            raise ValueError(f"{ckpt_path} exists: continue that run with --init_from=resume, or start over in "
                             f"this folder with --overwrite (or choose another --out_dir)")
        if master and os.path.exists(best_path):
            os.remove(best_path)  # the best of the replaced run

    # Every rank draws the same data windows and forced-global steps (generator, seeded alike) and takes its own
    # slice of the global batch; random routing and dropout draw from torch's RNG, seeded per rank.
    torch.manual_seed(tcfg.seed + rank)
    generator = torch.Generator().manual_seed(tcfg.seed)
    model = GPT(mcfg).to(device)
    n_routers = sum(block.attn.router is not None for block in model.blocks)
    controller = LambdaController(tcfg, n_routers) if tcfg.router_target_global > 0 else None
    trained_mode = mcfg.routed_mode  # sparse_from_iter runs exact first; checkpoints keep the trained mode
    if tcfg.trainable == "router":
        for name, param in model.named_parameters():
            param.requires_grad_(".router." in name)
    optimizer = configure_optimizer(model, tcfg, device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == torch.float16)  # fp16 needs loss scaling
    iter_num, best_val, val_history = 0, float("inf"), []
    global_batch = tcfg.batch_size * tcfg.grad_accum * world
    if tcfg.init_from == "resume":
        resumed_from, ckpt = load_resume_checkpoint(tcfg.out_dir, device)
        changed = {k: (v, asdict(mcfg).get(k)) for k, v in ckpt["model_config"].items()
                   if asdict(mcfg).get(k) != v and k not in RUNTIME_KEYS}
        if changed:
            raise ValueError(f"cannot resume {resumed_from}: model config differs (checkpoint, now): {changed}")
        if ckpt["optimizer"] is None:
            raise ValueError(f"cannot resume {resumed_from}: it holds no optimizer state (a pruned checkpoint); "
                             f"fine-tune it with --init_from={resumed_from} instead")
        check_same_data(ckpt["data_meta"], data.meta, resumed_from)
        load_model_state(model, ckpt["model"], resumed_from)
        optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt["scaler"] is not None:
            scaler.load_state_dict(ckpt["scaler"])
        iter_num, best_val, val_history = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["val_history"]
        if controller is not None and ckpt["router_lambda_state"] is not None:
            controller.u = ckpt["router_lambda_state"]
        message = restore_rng(ckpt["rng"], generator, rank, world, tcfg.seed, iter_num)
        saved = ckpt["train_config"]
        saved_batch = saved["batch_size"] * saved["grad_accum"] * len(ckpt["rng"]["torch"])
        if message and master:
            order = "continues unchanged" if saved_batch == global_batch else \
                f"changes: the global batch is now {global_batch} windows (was {saved_batch})"
            print(f"{message}; the data order {order}")
    elif is_pretrained(tcfg.init_from):
        load_model_state(model, gpt2_state_dict(tcfg.init_from, mcfg), tcfg.init_from, allow_new_routers=True)
    elif tcfg.init_from != "scratch":
        ckpt = load_checkpoint(tcfg.init_from, device)
        load_model_state(model, ckpt["model"], tcfg.init_from, allow_new_routers=True)
    raw_model = model
    if tcfg.compile:
        torch._dynamo.config.capture_scalar_outputs = True  # sparse mode's gated-row count: traced, not a break
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[int(device.split(":")[1])] if device_type == "cuda" else None)

    if master:
        os.makedirs(tcfg.out_dir, exist_ok=True)
        print(f"{raw_model.num_params() / 1e6:.2f}M parameters, layers {mcfg.layer_letters}, "
              f"window {mcfg.window}, device {device}, {dtype}, {world} process(es)")
    logger = Logger(os.path.join(tcfg.out_dir, "tb"), tcfg.tensorboard and master)
    val_batches = data.val_batches(tcfg.batch_size, tcfg.eval_iters)
    tokens_per_iter = global_batch * mcfg.block_size
    params = [p for p in raw_model.parameters() if p.requires_grad]
    n_params, peak = raw_model.num_params(), tcfg.peak_flops or peak_flops(device, dtype)
    history, result = [], {}
    nonfinite_run, nonfinite_total = 0, 0
    saved_at = [None, None]  # the steps of the latest and the best checkpoint this run wrote

    def gathered(obj):
        if not ddp:
            return [obj]
        out = [None] * world
        dist.all_gather_object(out, obj)
        return out

    def checkpoint_state():
        cuda = torch.cuda.get_rng_state() if device_type == "cuda" else None
        return {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler.is_enabled() else None,
                "model_config": {**asdict(mcfg), "routed_mode": trained_mode}, "train_config": asdict(tcfg),
                "iter_num": iter_num, "best_val_loss": best_val, "val_history": val_history,
                "router_lambda_state": controller.u if controller is not None else None, "data_meta": data.meta,
                "rng": {"torch": gathered(torch.get_rng_state()), "cuda": gathered(cuda),
                        "data": generator.get_state()}}

    def save(is_best):
        """Every rank takes part (the RNG states are gathered); rank 0 writes. Never from non-finite weights."""
        if not tcfg.save_checkpoint:
            return False
        if not weights_finite(raw_model):
            if master:
                tqdm.write(f"WARNING step {iter_num}: the weights are not finite; no checkpoint written "
                           f"({ckpt_path} keeps the last good one)")
            return False
        state = checkpoint_state()
        if master:
            save_checkpoint(ckpt_path, state)
            if is_best:
                save_best(ckpt_path, best_path)
        saved_at[0] = iter_num
        saved_at[1] = iter_num if is_best else saved_at[1]
        return True

    def eval_and_save(final=False):
        nonlocal best_val
        val_loss, stats = evaluate_loss(raw_model, val_batches, autocast)  # fixed RNG: training does not move
        finite = math.isfinite(val_loss)
        is_best = finite and val_loss < best_val
        best_val = min(best_val, val_loss) if finite else best_val
        val_history.append([iter_num, val_loss])
        result.update(val_loss=val_loss, routing=stats)
        if master:
            tqdm.write(f"step {iter_num}: val loss {val_loss:.4f} | {format_routing(stats)}")
            if finite:
                warn_collapse(stats, mcfg.kinds, tcfg.collapse_frac, iter_num)
                logger.evaluation(iter_num, val_loss, stats, raw_model, val_batches[0][0].to(device), data.meta,
                                  autocast)
            else:
                tqdm.write(f"WARNING step {iter_num}: val loss is not finite (the model diverged); no checkpoint "
                           f"written ({ckpt_path} keeps the last good one)")
        if finite:
            save(is_best)
        if master:
            write_json(os.path.join(tcfg.out_dir, "train_summary.json"), run_summary(val_loss, stats, final))

    def run_summary(val_loss, stats, final):
        routing = routing_summary(stats, mcfg.kinds)
        return {"iter_num": iter_num, "max_iters": tcfg.max_iters, "complete": final, "val_loss": val_loss,
                "tokens_per_s": steps_timed * tokens_per_iter / train_time if train_time else None,
                "wall_s": time.time() - started, "routed_global_frac": routing["global_frac"],
                "model_ideal_flop_frac": routing["attention_flop_frac_ideal"],
                "model_computed_flop_frac": routing["attention_flop_frac_computed"],
                "global_frac_per_layer": routing["global_frac_per_layer"], "val_history": val_history,
                "router_lambdas": controller.lam.tolist() if controller is not None else None,
                "nonfinite_steps": nonfinite_total}

    def log_step(out, lr, lam, force_global, dt):
        """The log line and TensorBoard scalars, from every rank's numbers (every rank takes part)."""
        ranks = gathered({"stats": routing_stats(out, raw_model.config),
                          "losses": [out.loss.item(), out.lm_loss.item(), out.penalty.item(), out.mean_p.item()]})
        if not master:
            return
        stats = mean_stats([r["stats"] for r in ranks])
        loss, lm_loss, penalty, mean_p = (sum(v) / len(ranks) for v in zip(*(r["losses"] for r in ranks)))
        eta, tok_s = dt * (tcfg.max_iters - iter_num), tokens_per_iter / dt
        flops = training_flops_per_token(mcfg, n_params, stats["model_computed_flop_frac"]) * tok_s / world
        mfu = f", MFU {flops / peak:.1%}" if peak else ""
        lam = float(torch.as_tensor(lam).float().mean())
        tqdm.write(f"iter {iter_num}: loss {loss:.4f} (lm {lm_loss:.4f} + penalty {penalty:.2g}; mean p "
                   f"{mean_p:.3f}, lambda {lam:.2g}) | {format_routing(stats)}"
                   f"{' [forced global]' if force_global else ''} | lr {lr:.2e} | {tok_s:,.0f} tok/s "
                   f"({flops / 1e12:.3g} TFLOP/s per device{mfu}) | ETA {eta / 60:.1f} min")
        scalars = {"train/loss": loss, "train/lm_loss": lm_loss, "train/penalty_added": penalty,
                   "train/mean_p": mean_p, "train/lambda": lam, "train/lr": lr, "train/tokens_per_s": tok_s,
                   "train/tflops_per_device": flops / 1e12, "train/nonfinite_steps": nonfinite_total}
        logger.scalars(iter_num, {**scalars, **({"train/mfu": flops / peak} if peak else {})})
        logger.routing(iter_num, "train_routing", stats, mcfg.kinds)

    show_bar = master and tcfg.progress_bar and sys.stderr.isatty()
    bar = tqdm(total=tcfg.max_iters, initial=iter_num, disable=not show_bar, dynamic_ncols=True, leave=False)
    t_last, iters_timed = time.time(), 0
    started, train_time, steps_timed = time.time(), 0.0, 0  # training steps only, for tokens/s
    try:
        while iter_num < tcfg.max_iters:
            if iter_num % tcfg.eval_interval == 0:
                eval_and_save()
                t_last, iters_timed = time.time(), 0
            step_start = time.time()
            lr = lr_at(iter_num, tcfg)
            lam = router_lambda_at(iter_num, tcfg) if controller is None else \
                controller.weights(n_routers) * lambda_ramp(iter_num, tcfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            raw_model.config.routed_mode = "exact" if iter_num < tcfg.sparse_from_iter else trained_mode
            force_global = bool(torch.rand((), generator=generator) < tcfg.p_dense)
            starts = data.train_starts(global_batch, generator)
            loss_ok = torch.ones((), dtype=torch.bool, device=device)
            for micro in range(tcfg.grad_accum):
                first = (micro * world + rank) * tcfg.batch_size
                x, y = data.batch("train", starts[first:first + tcfg.batch_size])
                x, y = x.to(device), y.to(device)
                sync = not ddp or micro == tcfg.grad_accum - 1
                with nullcontext() if sync else model.no_sync():
                    with autocast:
                        out = model(x, y, penalty_weight=lam, router_budget=tcfg.router_budget,
                                    force_global=force_global)
                    scaler.scale(out.loss / tcfg.grad_accum).backward()
                loss_ok &= torch.isfinite(out.loss.detach())
            if scaler.is_enabled():
                scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, tcfg.grad_clip) if tcfg.grad_clip > 0 else \
                torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
            # one reduction per step: any rank's non-finite loss or gradient, or a stop signal, counts for all
            flags = torch.stack([~loss_ok, ~torch.isfinite(grad_norm),
                                 torch.tensor(signals.received is not None, device=device)]).float()
            if ddp:
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            bad_loss, bad_grad, stop = (bool(f) for f in flags.tolist())
            # with fp16 an overflowing gradient is the scaler's business: it skips the step and scales down
            skip = bad_loss or (bad_grad and not scaler.is_enabled())
            if skip:
                optimizer.zero_grad(set_to_none=True)
                if scaler.is_enabled():
                    scaler.update()
                nonfinite_run, nonfinite_total = nonfinite_run + 1, nonfinite_total + 1
                if master:
                    tqdm.write(f"WARNING step {iter_num}: non-finite {'loss' if bad_loss else 'gradient'}, step "
                               f"skipped ({nonfinite_run} in a row, {nonfinite_total} in all)")
                if nonfinite_run >= tcfg.max_nonfinite_steps:
                    kept = f"{ckpt_path} holds step {saved_at[0]} and {best_path} step {saved_at[1]} (val loss " \
                        f"{best_val:.4f})" if saved_at[0] is not None else "no checkpoint was written"
                    raise TrainingStopped(
                        f"the run diverged: {nonfinite_run} non-finite steps in a row at step {iter_num}; lower "
                        f"learning_rate={tcfg.learning_rate:g} or raise warmup_iters={tcfg.warmup_iters}; {kept}")
            else:
                nonfinite_run = 0
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                if controller is not None and not force_global and iter_num >= tcfg.router_lambda_start:
                    fracs = torch.stack([g.float().mean() for g, p in zip(out.gates, out.probs) if p is not None])
                    if ddp:
                        dist.all_reduce(fracs)
                        fracs = fracs / world
                    controller.update(fracs.cpu())
            history.append(out.loss.item())
            train_time, steps_timed = train_time + time.time() - step_start, steps_timed + 1
            iter_num += 1
            iters_timed += 1
            bar.update(1)
            if iter_num % tcfg.log_interval == 0 or iter_num == tcfg.max_iters:
                log_step(out, lr, lam, force_global, (time.time() - t_last) / iters_timed)
                t_last, iters_timed = time.time(), 0
            if stop:
                name = signal.Signals(signals.received).name if signals.received else "a signal on another rank"
                saved = save(is_best=False)
                if master and "routing" in result:
                    write_json(os.path.join(tcfg.out_dir, "train_summary.json"),
                               run_summary(result["val_loss"], result["routing"], False))
                where = f"saved {ckpt_path} at step {iter_num}; continue with --init_from=resume" if saved else \
                    f"no checkpoint written at step {iter_num}"
                raise TrainingStopped(f"stopped by {name}: {where}", 128 + (signals.received or signal.SIGTERM))
        bar.close()
        raw_model.config.routed_mode = trained_mode
        eval_and_save(final=True)
        logger.hparams({**asdict(tcfg), **asdict(mcfg)})
    finally:
        bar.close()
        logger.close()
    result["losses"] = history
    return result


def configure_optimizer(model, cfg, device_type):
    """AdamW; weight decay on matrices only (not on norms, biases or the router's bias)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2),
                             fused=device_type == "cuda")


def main(argv):
    tcfg, mcfg = parse_args_or_exit(argv, TrainConfig, GPTConfig, usage=__doc__)
    try:
        train(tcfg, mcfg)
    except TrainingStopped as e:
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
