"""How the model-free key-token rule (nanoaha/key_tokens.py) agrees with a LongPPL-style label from a model.

    python results/2026-12-02_key_token_labels/compare_labels.py out/grids/stdlib_shape_ladder/l2_w256_G__seed_1

LongPPL (Fang et al., ICLR 2025) calls a target key when a model predicts it much better with the full context
than with a short one: log p_full(y) - log p_short(y) > margin (their long-short difference, LSD), and the
model predicts it reasonably with the full context (their LCL: log p_full(y) > -2). Here the short context is
the reference model itself with every layer's attention limited to its window (schedule "L": the same weights;
dense and local layers have the same parameters), so the label asks the question the copy rule asks, with the
model's own answer instead of a k-gram match. Prints, on the evaluator's fixed val windows, each label's share
of the targets and how the two agree (precision and recall of the copy rule against the LongPPL label, their
overlap), per margin, and the mean LSD on copy-rule key tokens and on the others.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from model import GPT, GPTConfig  # noqa: E402
from nanoaha.checkpoint import load_checkpoint, load_model_state  # noqa: E402
from nanoaha.evaluation import (eval_data, fixed_val_batches, label_key_tokens, target_losses,  # noqa: E402
                                trained_data_dir)


def model_with(ckpt, path, **overrides):
    model = GPT(GPTConfig(**{**ckpt["model_config"], **overrides}))
    load_model_state(model, ckpt["model"], path)
    return model.eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="a run folder or checkpoint of a dense (G) model")
    parser.add_argument("--eval_tokens", type=int, default=65536)
    parser.add_argument("--margins", type=float, nargs="+", default=[0.5, 1.0, 2.0], help="LSD margins, nats")
    parser.add_argument("--min_log_prob", type=float, default=-2.0, help="LongPPL's LCL: log p_full(y) above this")
    args = parser.parse_args()
    path = args.checkpoint
    ckpt = load_checkpoint(path, "cpu")
    config = GPTConfig(**ckpt["model_config"])
    if set(config.kinds) != {"dense"}:
        sys.exit(f"{path} has layers {config.layer_letters}: give a dense (all G) model")
    full, short = model_with(ckpt, path), model_with(ckpt, path, schedule="L")
    data = eval_data(trained_data_dir(path), config, path)
    batches = fixed_val_batches(data, args.eval_tokens, 8)
    copy_labels, k = label_key_tokens(batches, config, data.meta["vocab_size"])
    lsd, log_p, copy = [], [], []
    with torch.no_grad():
        for (x, y), labels in zip(batches, copy_labels):
            loss_full, loss_short = target_losses(full(x, y).logits, y), target_losses(short(x, y).logits, y)
            lsd.append((loss_short - loss_full).flatten())
            log_p.append(-loss_full.flatten())
            copy.append(labels.flatten())
    lsd, log_p, copy = torch.cat(lsd), torch.cat(log_p), torch.cat(copy)
    print(f"checkpoint {path} (layers {config.layer_letters}, window {config.window}), {copy.numel():,} targets; "
          f"copy rule k {k}: {copy.float().mean().item():.1%} key tokens")
    print(f"mean LSD (log p full - log p window-only): copy-rule key tokens {lsd[copy].mean().item():+.3f}, "
          f"others {lsd[~copy].mean().item():+.3f}\n")
    print("| LSD margin | LongPPL-key share | copy rule's precision (copy & LongPPL / copy) | recall "
          "(copy & LongPPL / LongPPL) | overlap (Jaccard) |\n|---|---|---|---|---|")
    for margin in args.margins:
        longppl = (lsd > margin) & (log_p > args.min_log_prob)
        both = (copy & longppl).sum().item()
        print(f"| {margin:g} | {longppl.float().mean().item():.1%} | {both / max(1, copy.sum().item()):.1%} | "
              f"{both / max(1, longppl.sum().item()):.1%} | {both / max(1, (copy | longppl).sum().item()):.1%} |")


if __name__ == "__main__":
    main()
