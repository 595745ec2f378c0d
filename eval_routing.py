"""Score a checkpoint on a synthetic task (data/synthetic/): accuracy on the answer tokens, and how well its
routers pick the tokens that need global attention, against the task's needs_global labels.

    python eval_routing.py --out_dir=out/recall --data_dir=data/recall [--max_examples=500] [--router_threshold=0.7]

A token counts as routed global in a layer when any head of the layer attended globally for it; the table also
lists each head. Precision: of the tokens routed global, the fraction that need it; recall: of the tokens that
need it, the fraction routed global. Tokens whose need is unknown (mixed-in real text) count in neither, but in
the global fraction. Labels describe the prediction of a target, so they are aligned with the query position
that makes it, where the router decides.
"""
import math
import sys
from dataclasses import dataclass

import torch

from checkpoint import load_model
from configurator import parse_args_or_exit
from data.loader import TokenData
from data.synthetic.tasks import UNKNOWN_LABEL
from device import pick_device
from routing_stats import label_counts, mean_stats, precision_recall, ratio, routing_stats


@dataclass
class EvalConfig:
    out_dir: str = "out"            # the checkpoint's folder (or a ckpt.pt path)
    data_dir: str = ""              # a task prepared by data/synthetic/prepare.py
    split: str = "val"
    max_examples: int = 500         # the first ones of the split
    batch_size: int = 16
    device: str = "auto"
    router_threshold: float | None = None  # override the trained threshold


@torch.no_grad()
def evaluate_routing(model, data, split="val", max_examples=500, batch_size=16):
    """Answer loss (train.py's val loss, over these examples), answer accuracy (all, and split by whether the
    answer needs global context), the model's attention FLOPs vs dense (ideal and computed, routing_stats.py)
    and per routed layer the global fraction, precision and recall of its routing, for the layer ('any' head)
    and each head."""
    if "needs_global" not in data.arrays or "answer" not in data.arrays:
        raise ValueError(f"{data.data_dir} has no answer/needs_global labels: evaluate on a task written by "
                         f"data/synthetic/prepare.py")
    device = next(model.parameters()).device
    starts = data.starts[split][:max_examples].tolist()
    answers = torch.zeros(3, 2, dtype=torch.float64)  # rows: within window, needs global, unknown; (correct, all)
    loss_sum, scored = 0.0, 0  # over the targets that carry loss (y != -1: the answers)
    counts, stats = {}, []
    model.eval()
    with torch.random.fork_rng(devices=[]):  # random routing draws from the global RNG: the same draws each run
        torch.manual_seed(0)
        for i in range(0, len(starts), batch_size):
            batch = starts[i:i + batch_size]
            x, y = data.batch(split, batch)
            targets = data.windows(split, batch, 1)
            is_answer = data.token_array(split, "answer", batch) == 1
            labels = data.token_array(split, "needs_global", batch)
            out = model(x.to(device), y.to(device))
            stats.append(routing_stats(out, model.config))
            n_scored = int((y != -1).sum())
            loss_sum, scored = loss_sum + out.lm_loss.item() * n_scored, scored + n_scored
            correct = out.logits.argmax(-1).cpu() == targets
            for row, label in enumerate((0, 1, UNKNOWN_LABEL)):
                chosen = is_answer & (labels == label)
                answers[row] += torch.tensor([(correct & chosen).sum(), chosen.sum()])
            for layer, gates in enumerate(out.gates):
                if gates is None:
                    continue
                gates = gates.cpu()
                for head, gate in [("any", gates.any(1))] + list(enumerate(gates.unbind(1))):
                    counts[layer, head] = counts.get((layer, head), 0) + label_counts(gate, labels)
    total, stats = answers.sum(0), mean_stats(stats)
    return {
        "examples": len(starts), "answers": int(total[1]), "answer_loss": loss_sum / scored if scored else math.nan,
        "accuracy": ratio(total[0], total[1]),
        "accuracy_within_window": ratio(*answers[0]), "accuracy_needs_global": ratio(*answers[1]),
        "answers_needs_global": int(answers[1, 1]),
        "routed_mode": model.config.routed_mode,
        "attention_flop_frac_ideal": stats["model_ideal_flop_frac"].item(),
        "attention_flop_frac_computed": stats["model_computed_flop_frac"].item(),
        "routing": [dict(layer=layer, head=head, **dict(zip(("global_frac", "precision", "recall"), precision_recall(c))))
                    for (layer, head), c in counts.items()],
    }


def percent(value):
    return "     -" if math.isnan(value) else f"{100 * value:5.1f}%"


def format_report(result):
    lines = [f"{result['examples']} examples, {result['answers']} answer tokens "
             f"({result['answers_needs_global']} need context beyond the window)",
             f"answer loss {result['answer_loss']:.4f}",
             f"answer accuracy {percent(result['accuracy'])}: needs global {percent(result['accuracy_needs_global'])}, "
             f"within window {percent(result['accuracy_within_window'])}",
             f"attention FLOPs vs dense: ideal {percent(result['attention_flop_frac_ideal'])}, "
             f"computed {percent(result['attention_flop_frac_computed'])} (routed_mode {result['routed_mode']})"]
    if not result["routing"]:
        return "\n".join(lines + ["no routed layers: nothing to compare with the labels"])
    lines.append("layer  head  global  precision  recall")
    for row in result["routing"]:
        lines.append(f"{row['layer']:5}  {row['head']:>4}  {percent(row['global_frac'])}     "
                     f"{percent(row['precision'])}  {percent(row['recall'])}")
    return "\n".join(lines)


def main(argv):
    (cfg,) = parse_args_or_exit(argv, EvalConfig)
    if not cfg.data_dir:
        sys.exit("pass --data_dir: the task to evaluate on, as prepared by data/synthetic/prepare.py")
    model, trained_on = load_model(cfg.out_dir, pick_device(cfg.device), cfg.router_threshold)
    data = TokenData(cfg.data_dir, model.config.block_size, model.config.vocab_size)
    print(f"checkpoint {cfg.out_dir}: layers {model.config.layer_letters}, "
          f"window {model.config.window}, threshold {model.config.router_threshold}; "
          f"data {cfg.data_dir}: task {data.meta.get('task')}, labels for window {data.meta.get('window')}, "
          f"{data.meta.get('n_sink', 0)} sinks")
    label_local = (data.meta.get("window"), data.meta.get("n_sink", 0))
    if label_local != (model.config.window, model.config.n_sink):
        print(f"note: the labels are for window {label_local[0]} and {label_local[1]} sinks, the model has window "
              f"{model.config.window} and {model.config.n_sink} sinks; prepare the task with "
              f"--window={model.config.window} --n_sink={model.config.n_sink} for matching labels")
    if trained_on.get("task") != data.meta.get("task"):
        print(f"note: the checkpoint was trained on {trained_on.get('task') or trained_on.get('source')}")
    print(format_report(evaluate_routing(model, data, cfg.split, cfg.max_examples, cfg.batch_size)))


if __name__ == "__main__":
    main(sys.argv[1:])
