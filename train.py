"""Train a nanoAHA GPT from scratch (or resume, or fine-tune a checkpoint) on a tokenized corpus.

    python train.py configs/quickstart.py [--key=value ...]              # one CPU or GPU
    torchrun --standalone --nproc_per_node=8 train.py configs/NAME.py     # DDP

Every setting is a field of train_config.TrainConfig or of model.GPTConfig.
"""
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from checkpoint import load_checkpoint, load_model_state, save_checkpoint
from configurator import parse_args_or_exit
from data.loader import TokenData
from device import autocast_context, pick_device, pick_dtype
from model import GPT, RUNTIME_KEYS, GPTConfig
from routing_stats import format_routing, mean_stats, routing_stats, routing_summary, warn_collapse
from tensorboard_log import Logger
from train_config import TrainConfig, check_config


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


def write_json(path, obj):
    """Atomic like the checkpoint: readers never see half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


@torch.no_grad()
def evaluate(model, batches, autocast):
    """Mean val LM loss and routing statistics over the fixed val batches. Runs on a forked, fixed RNG
    (random routing draws from it), so evaluating neither changes training nor varies between calls."""
    model.eval()
    losses, stats = [], []
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(0)
        for x, y in batches:
            with autocast:
                out = model(x, y)
            losses.append(out.lm_loss.item())
            stats.append(routing_stats(out, model.config))
    model.train()
    return sum(losses) / len(losses), mean_stats(stats)


def train(tcfg, mcfg):
    """Run training; returns a dict with the per-step losses and the final val loss/routing."""
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
    master = rank == 0
    dtype = pick_dtype(tcfg.dtype, device)
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    autocast = autocast_context(device, dtype)

    data_dir = tcfg.data_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", tcfg.dataset)
    data = TokenData(data_dir, mcfg.block_size, mcfg.vocab_size, tcfg.doc_aligned_windows)
    ckpt_path = os.path.join(tcfg.out_dir, "ckpt.pt")

    torch.manual_seed(tcfg.seed + rank)
    generator = torch.Generator().manual_seed(tcfg.seed + rank)  # data windows and forced-global draws
    check_config(tcfg, mcfg)
    model = GPT(mcfg).to(device)
    n_routers = sum(block.attn.router is not None for block in model.blocks)
    controller = LambdaController(tcfg, n_routers) if tcfg.router_target_global > 0 else None
    trained_mode = mcfg.routed_mode  # sparse_from_iter runs exact first; checkpoints keep the trained mode
    if tcfg.trainable == "router":
        for name, param in model.named_parameters():
            param.requires_grad_(".router." in name)
    optimizer = configure_optimizer(model, tcfg, device_type)
    iter_num, best_val, val_history = 0, float("inf"), []
    if tcfg.init_from == "resume":
        ckpt = load_checkpoint(ckpt_path, device)
        changed = {k: (v, asdict(mcfg).get(k)) for k, v in ckpt["model_config"].items()
                   if asdict(mcfg).get(k) != v and k not in RUNTIME_KEYS}
        if changed:
            raise ValueError(f"cannot resume {ckpt_path}: model config differs (checkpoint, now): {changed}")
        if ckpt.get("optimizer") is None:
            raise ValueError(f"cannot resume {ckpt_path}: it holds no optimizer state (a pruned checkpoint); "
                             f"fine-tune it with --init_from={ckpt_path} instead")
        load_model_state(model, ckpt["model"], ckpt_path)
        optimizer.load_state_dict(ckpt["optimizer"])
        iter_num, best_val, val_history = ckpt["iter_num"], ckpt["best_val_loss"], ckpt.get("val_history", [])
        if controller is not None and ckpt.get("router_lambda_state") is not None:
            controller.u = ckpt["router_lambda_state"]
        torch.set_rng_state(ckpt["rng"]["torch"])
        if torch.cuda.is_available() and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        generator.set_state(ckpt["rng"]["data"][rank] if isinstance(ckpt["rng"]["data"], list) else ckpt["rng"]["data"])
    elif tcfg.init_from != "scratch":
        ckpt = load_checkpoint(tcfg.init_from, device)
        load_model_state(model, ckpt["model"], tcfg.init_from, allow_new_routers=True)
    raw_model = model
    if tcfg.compile:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[int(device.split(":")[1])] if device_type == "cuda" else None)

    if master:
        os.makedirs(tcfg.out_dir, exist_ok=True)
        print(f"{raw_model.num_params() / 1e6:.2f}M parameters, layers {mcfg.layer_letters}, "
              f"window {mcfg.window}, device {device}, {dtype}, {world} process(es)")
    logger = Logger(os.path.join(tcfg.out_dir, "tb"), tcfg.tensorboard and master)
    val_batches = data.val_batches(tcfg.batch_size, tcfg.eval_iters)
    tokens_per_iter = tcfg.batch_size * mcfg.block_size * tcfg.grad_accum * world
    history, result = [], {}

    def checkpoint_state():
        rng_data = generator.get_state()
        if ddp:
            gathered = [None] * world
            dist.all_gather_object(gathered, rng_data)
            rng_data = gathered
        return {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                "model_config": {**asdict(mcfg), "routed_mode": trained_mode}, "train_config": asdict(tcfg),
                "iter_num": iter_num, "best_val_loss": best_val, "val_history": val_history,
                "router_lambda_state": controller.u if controller is not None else None, "data_meta": data.meta,
                "rng": {"torch": torch.get_rng_state(), "data": rng_data,
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}

    def eval_and_save(final=False):
        nonlocal best_val
        val_loss, stats = evaluate(raw_model, [(x.to(device), y.to(device)) for x, y in val_batches], autocast)
        best_val = min(best_val, val_loss)
        val_history.append([iter_num, val_loss])
        result.update(val_loss=val_loss, routing=stats)
        if master:
            tqdm.write(f"step {iter_num}: val loss {val_loss:.4f} | {format_routing(stats)}")
            warn_collapse(stats, mcfg.kinds, tcfg.collapse_frac, iter_num)
            logger.evaluation(iter_num, val_loss, stats, raw_model, val_batches[0][0].to(device), data.meta, autocast)
        state = checkpoint_state() if tcfg.save_checkpoint else None
        if master and state is not None:
            save_checkpoint(ckpt_path, state)
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
                "router_lambdas": controller.lam.tolist() if controller is not None else None}

    bar = tqdm(total=tcfg.max_iters, initial=iter_num, disable=not (master and tcfg.progress_bar and sys.stderr.isatty()),
               dynamic_ncols=True, leave=False)
    t_last, iters_timed = time.time(), 0
    started, train_time, steps_timed = time.time(), 0.0, 0  # training steps only, for tokens/s
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
        for micro in range(tcfg.grad_accum):
            x, y = data.train_batch(tcfg.batch_size, generator)
            x, y = x.to(device), y.to(device)
            sync = not ddp or micro == tcfg.grad_accum - 1
            with (nullcontext() if sync else model.no_sync()), autocast:
                out = model(x, y, penalty_weight=lam, router_budget=tcfg.router_budget, force_global=force_global)
                (out.loss / tcfg.grad_accum).backward()
        if tcfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tcfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if controller is not None and not force_global and iter_num >= tcfg.router_lambda_start:
            controller.update(torch.stack([g.float().mean() for g, p in zip(out.gates, out.probs) if p is not None]).cpu())
        history.append(out.loss.item())
        train_time, steps_timed = train_time + time.time() - step_start, steps_timed + 1
        iter_num += 1
        iters_timed += 1
        bar.update(1)
        if master and (iter_num % tcfg.log_interval == 0 or iter_num == tcfg.max_iters):
            dt = (time.time() - t_last) / iters_timed
            stats = routing_stats(out, raw_model.config)
            eta = dt * (tcfg.max_iters - iter_num)
            tok_s = tokens_per_iter / dt
            lam = float(torch.as_tensor(lam).float().mean())
            tqdm.write(f"iter {iter_num}: loss {out.loss.item():.4f} (lm {out.lm_loss.item():.4f} + penalty "
                       f"{out.penalty.item():.2g}; mean p {out.mean_p.item():.3f}, lambda {lam:.2g}) | "
                       f"{format_routing(stats)}{' [forced global]' if force_global else ''} | lr {lr:.2e} | "
                       f"{tok_s:,.0f} tok/s | ETA {eta / 60:.1f} min")
            logger.scalars(iter_num, {"train/loss": out.loss.item(), "train/lm_loss": out.lm_loss.item(),
                                      "train/penalty_added": out.penalty.item(), "train/mean_p": out.mean_p.item(),
                                      "train/lambda": lam, "train/lr": lr, "train/tokens_per_s": tok_s})
            logger.routing(iter_num, "train_routing", stats, mcfg.kinds)
            t_last, iters_timed = time.time(), 0
    bar.close()
    raw_model.config.routed_mode = trained_mode
    eval_and_save(final=True)
    logger.hparams({**asdict(tcfg), **asdict(mcfg)})
    logger.close()
    if ddp:
        dist.destroy_process_group()
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
    tcfg, mcfg = parse_args_or_exit(argv, TrainConfig, GPTConfig)
    train(tcfg, mcfg)


if __name__ == "__main__":
    main(sys.argv[1:])
