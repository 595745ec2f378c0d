import json
import math

import pytest
import torch

import evaluate
import train
from data.loader import TokenData
from data.prepare import prepare
from helpers import CPU_FP32, tiny_recall, train_configs
from nanoaha.checkpoint import load_model
from nanoaha.evaluation import evaluate_routing


def tiny_run(tmp_path, data_dir, **overrides):
    values = {"data_dir": str(data_dir), "out_dir": str(tmp_path / "out"), "vocab_size": 20, "block_size": 32,
              "n_layer": 2, "n_head": 2, "n_embd": 32, "window": 4, "batch_size": 4, "max_iters": 6,
              "eval_interval": 6, "eval_iters": 1, "log_interval": 3, "warmup_iters": 2, "learning_rate": 3e-3,
              "tensorboard": False, "progress_bar": False, **CPU_FP32, **overrides}
    return train_configs(values)


def test_evaluate_reports_task_accuracy_precision_and_recall(tmp_path, capsys):
    tiny_recall(tmp_path / "task")
    train.train(*tiny_run(tmp_path, tmp_path / "task"))
    evaluate.main([str(tmp_path / "out"), f"--data_dir={tmp_path / 'task'}", "--device=cpu"])
    report = capsys.readouterr().out
    assert "40 examples, 160 answer tokens" in report and "layer  head  global  precision  recall" in report
    # per routed layer one 'any' row and a row per head: against the task's labels, and (printed before them)
    # against the key tokens of the text
    routers, synthetic = report.split("40 examples")
    assert len([line for line in synthetic.splitlines() if line.lstrip().startswith(("0 ", "1 "))]) == 2 * 3
    key_rows = routers[routers.index("routers against key tokens"):].splitlines()[1:]
    assert len([line for line in key_rows if line.lstrip().startswith(("0 ", "1 "))]) == 2 * 3
    written = json.load(open(tmp_path / "out" / "eval.json"))
    assert written["synthetic"]["examples"] == 40 and len(written["synthetic"]["routing"]) == 2 * 3
    assert written["bits_per_byte"] is None and written["eval_tokens"] == 40 * 32

    model, _ = load_model(str(tmp_path / "out"), "cpu")
    data = TokenData(str(tmp_path / "task"), 32, 20)
    labels = data.token_array("val", "needs_global", data.val_starts(40))
    for bias, recall in ((30.0, 1.0), (-30.0, 0.0)):  # every token global, then none
        for block in model.blocks:
            torch.nn.init.constant_(block.attn.router.logits.bias, bias)
        result = evaluate_routing(model, data, max_examples=40, batch_size=16)
        assert result["examples"] == 40 and result["answers"] == 160
        assert result["answers_needs_global"] == (labels == 1).sum()
        x, y = data.batch("val", data.starts["val"][:40].tolist())
        with torch.no_grad():
            out = model(x, y)
        assert result["answer_loss"] == pytest.approx(out.lm_loss.item(), rel=1e-5)
        # accuracy recomputed from the logits: argmax right on the scored targets (the answers), split by label
        correct, scored, needs = out.logits.argmax(-1) == y, y != -1, labels == 1
        assert scored.sum() == 160 and (needs <= scored).all()
        for key, chosen in (("accuracy", scored), ("accuracy_needs_global", needs),
                            ("accuracy_within_window", scored & ~needs)):
            assert result[key] == correct[chosen].sum().item() / chosen.sum().item(), key
        for row in result["routing"]:
            assert row["global_frac"] == recall and row["recall"] == recall
        if recall:  # all global: precision is the fraction of tokens that need it
            assert result["routing"][0]["precision"] == pytest.approx((labels == 1).float().mean().item())
        else:  # nothing routed global: precision is undefined
            assert all(math.isnan(row["precision"]) for row in result["routing"])
        # every layer routed: ideal FLOPs 1 when all global; exact mode computes local and full for all
        local = result["attention_flop_frac_computed"] - 1
        assert result["attention_flop_frac_ideal"] == pytest.approx(1.0 if recall else local)
    prepare(lambda: iter(["some text"] * 100), str(tmp_path / "text"), encoding="bytes", val_fraction=0.5,
            progress=False)
    with pytest.raises(ValueError, match="no answer/needs_global labels"):
        evaluate_routing(model, TokenData(str(tmp_path / "text"), 32, 256))
