import json
import math
import os

import numpy as np
import pytest
import torch

import evaluate
import train
from nanoaha.configurator import ConfigError, parse_args
from data.loader import TokenData
from data.prepare import prepare
from data.synthetic.prepare import SyntheticConfig, generate, parse
from data.synthetic.tasks import UNKNOWN, Copy, Needle, Recall, needs_global
from nanoaha.evaluation import evaluate_routing
from model import GPTConfig
from nanoaha.checkpoint import load_model
from nanoaha.train_config import TrainConfig

U = UNKNOWN


def test_recall_labels_by_hand():
    # ids: filler 0-1, keys 2-5, values 6-9. Pairs (key 3, value 0) at 0-1 and (key 1, value 2) at 2-3;
    # the second pair is asked at 4 (answer at 5), the first at 7 (answer at 8).
    task = Recall(n_pairs=2, n_queries=2, n_keys=4, n_values=4, n_filler=2)
    ex = task.build(10, keys=[3, 1], values=[0, 2], asked=[1, 0], query_starts=[4, 7],
                    filler=[1, 1, 1, 1, 1, 1, 0, 1, 1, 0])
    assert ex.tokens.tolist() == [5, 6, 3, 8, 3, 8, 0, 5, 6, 0]
    assert ex.answer.tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 1, 0]
    assert ex.source.tolist() == [-1, -1, -1, -1, -1, 3, -1, -1, 1, -1]
    # the answer at 5 is predicted at 4, which needs position 3: one back. The answer at 8, predicted at 7,
    # needs position 1: six back.
    assert needs_global(ex.source, 1).tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 1, 0]
    assert needs_global(ex.source, 2).tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 1, 0]
    assert needs_global(ex.source, 6).tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 1, 0]
    assert needs_global(ex.source, 7).tolist() == [0] * 10


def test_recall_repeated_queries_by_hand():
    # ids: filler 0, keys 1-2, values 3-4. One pair (key 1, value 0) at 0-1, asked at 2 (answer 3) and at 8
    # (answer 9): the second answer's source is the first answer, not the pair.
    task = Recall(n_pairs=1, n_queries=2, n_keys=2, n_values=2, n_filler=1, repeat_queries=True)
    ex = task.build(10, keys=[1], values=[0], asked=[0, 0], query_starts=[2, 8], filler=[0] * 10)
    assert ex.tokens.tolist() == [2, 3, 2, 3, 0, 0, 0, 0, 2, 3]
    assert ex.source.tolist() == [-1, -1, -1, 1, -1, -1, -1, -1, -1, 3]
    assert needs_global(ex.source, 5).tolist() == [0] * 9 + [1]
    assert needs_global(ex.source, 6).tolist() == [0] * 10
    asked = Recall(n_pairs=2, n_queries=20, repeat_queries=True).example(np.random.default_rng(0), 64).answer
    assert asked.sum() == 20


def test_needs_global_exempts_the_sinks_by_hand():
    # the example of test_recall_labels_by_hand: the answer at 5 (predicted at 4) needs position 3, the answer
    # at 8 (predicted at 7) needs position 1. A local query also reads the first n_sink positions.
    source = np.array([-1, -1, -1, -1, -1, 3, -1, -1, 1, -1])
    assert needs_global(source, 1, n_sink=0).tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 1, 0]
    assert needs_global(source, 1, n_sink=1).tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 1, 0]  # position 0 is no source
    assert needs_global(source, 1, n_sink=2).tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0]  # position 1 is a sink
    assert needs_global(source, 1, n_sink=3).tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert needs_global(source, 1, n_sink=4).tolist() == [0] * 10                        # so is position 3
    assert needs_global(source, 2, n_sink=2).tolist() == [0] * 10
    assert needs_global(source, 2, n_sink=1).tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 1, 0]
    # unknown sources stay unknown, whatever the sinks
    assert needs_global(np.array([U, U, -1, 0, 0]), 1, n_sink=1).tolist() == [255, 255, 0, 0, 0]
    assert needs_global(np.array([U, U, -1, 0, 0]), 1, n_sink=0).tolist() == [255, 255, 0, 1, 1]


def test_copy_labels_by_hand():
    # ids: filler 0-1, symbols 2-5, COPY 6. The span (3, 0) at 1-2, COPY at 5, the repeat at 6-7.
    task = Copy(span_len=2, n_symbols=4, n_filler=2)
    ex = task.build(10, span=[3, 0], first=1, repeat=6, filler=[0] * 10, offset=100)
    assert ex.tokens.tolist() == [100, 105, 102, 100, 100, 106, 105, 102, 100, 100]
    assert ex.answer.tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    assert ex.source.tolist() == [-1, -1, -1, -1, -1, -1, 1, 2, -1, -1]
    assert needs_global(ex.source, 4).tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 0, 0]  # both 4 back
    assert needs_global(ex.source, 5).tolist() == [0] * 10


def test_needle_labels_by_hand():
    # task ids after a text vocabulary of 200: FACT 200, ASK 201, keys 202-205, values 206-209.
    # The needle "FACT key2 v1 v3" at 2-5, the question "ASK key2 v1 v3" at 8-11, text everywhere else.
    task = Needle(n_needles=1, value_len=2, n_keys=4, n_values=4)
    ex = task.build(12, keys=[2], values=[[1, 3]], asked=0, needle_starts=[2], text=np.arange(100, 112), offset=200)
    assert ex.tokens.tolist() == [100, 101, 200, 204, 207, 209, 102, 103, 201, 204, 207, 209]
    assert ex.answer.tolist() == [0] * 10 + [1, 1]
    assert ex.source.tolist() == [U, U, -1, -1, -1, -1, U, U, -1, 3, 4, 5]  # one needle: its key is known too
    assert needs_global(ex.source, 5).tolist() == [255, 255, 0, 0, 0, 0, 255, 255, 0, 1, 1, 1]
    assert needs_global(ex.source, 6).tolist() == [255, 255, 0, 0, 0, 0, 255, 255, 0, 0, 0, 0]


@pytest.mark.parametrize("task", [Recall(n_pairs=4, n_queries=3, min_gap=10, max_gap=40),
                                  Copy(span_len=5, min_distance=20, max_distance=30),
                                  Needle(n_needles=3, value_len=2, min_distance=20, max_distance=50)])
def test_generated_examples_are_seeded_and_answer_what_they_ask(task):
    text = np.arange(1000) % 97
    make = lambda seed: task.example(np.random.default_rng(seed), 64, offset=100, text=text)  # noqa: E731
    for seed in range(20):
        ex = make(seed)
        assert all(np.array_equal(a, b) for a, b in zip(ex, make(seed)))
        answers = np.flatnonzero(ex.answer)
        assert len(answers) and (ex.source[answers] >= 0).all()
        assert (ex.tokens[answers] == ex.tokens[ex.source[answers]]).all()  # the answer is the needed token
        assert ex.tokens.min() >= (0 if isinstance(task, Needle) else 100)
        if isinstance(task, Recall):
            keys = ex.tokens[answers - 1]  # the query key before each answer sits right before its source
            assert (ex.tokens[ex.source[answers] - 1] == keys).all()
            assert 2 * 4 + 10 <= answers.min() - 1 and answers.max() < 2 * 4 + 40
        elif isinstance(task, Copy):
            assert 20 <= answers[0] - ex.source[answers[0]] <= 30
        else:
            assert 20 <= 64 - 4 - (ex.source[answers[0]] - 2) <= 50 and (ex.source == UNKNOWN).sum() == 64 - 4 * 4
    assert not np.array_equal(make(0).tokens, make(1).tokens)


def tiny_recall(out_dir, **overrides):
    cfg = SyntheticConfig(**{"task": "recall", "out_dir": str(out_dir), "block_size": 32, "window": 4,
                             "n_train": 400, "n_val": 40, **overrides})
    return generate(cfg, Recall(n_pairs=4, n_queries=4, n_keys=8, n_values=8, n_filler=4))


def test_prepared_task_windows_are_examples_with_masked_loss(tmp_path):
    meta = tiny_recall(tmp_path)
    assert meta["example_len"] == 33 and meta["vocab_size"] == 20 and meta["window"] == 4 and meta["n_sink"] == 0
    assert set(meta["token_arrays"]) == {"answer", "needs_global", "loss_mask"}
    assert meta["task_tokens"] == {"filler": [0, 4], "keys": [4, 12], "values": [12, 20]}
    for split, n in (("train", 400), ("val", 40)):
        assert os.path.getsize(tmp_path / f"{split}.bin") == 2 * 33 * n
        assert os.path.getsize(tmp_path / f"{split}.needs_global.bin") == 33 * n
    data = TokenData(str(tmp_path), 32, 20)
    x, y = data.train_batch(16, torch.Generator().manual_seed(0))
    assert ((x[:, 0] >= 4) & (x[:, 0] < 12)).all()  # every window starts with the first pair's key
    assert ((y == -1) | ((y >= 12) & (y < 20))).all() and ((y != -1).sum(1) == 4).all()  # loss on the 4 answers
    starts = data.val_starts(40)
    assert starts == list(range(0, 40 * 33, 33))
    labels = data.token_array("val", "needs_global", starts[:8])
    answer = data.token_array("val", "answer", starts[:8])
    assert (labels <= answer).all() and labels.sum() > 0  # only answers need distant context here
    with pytest.raises(ValueError, match="set --block_size=32"):
        TokenData(str(tmp_path), 16, 20)
    meta = tiny_recall(tmp_path, loss_on="all")  # a re-run replaces the files, without a loss mask now
    assert not os.path.exists(tmp_path / "train.loss_mask.bin.tmp") and "loss_mask" not in meta["token_arrays"]
    _, y = TokenData(str(tmp_path), 32, 20).train_batch(16, torch.Generator().manual_seed(0))
    assert (y >= 0).all()


def recall_sources(tokens, answer, n_pairs):
    """The source of every answer, from the tokens alone: its query key names a pair (keys are distinct),
    whose value sits at 2 * pair + 1."""
    sources = []
    for example, answers in zip(tokens, answer):
        keys = example[0:2 * n_pairs:2].tolist()
        sources.append([(a, 2 * keys.index(example[a - 1]) + 1) for a in np.flatnonzero(answers)])
    return sources


@pytest.mark.parametrize("window,n_sink", [(4, 0), (4, 4), (8, 3), (2, 2)])
def test_prepared_labels_follow_the_window_and_the_sinks(tmp_path, window, n_sink):
    meta = tiny_recall(tmp_path, window=window, n_sink=n_sink, n_train=50)
    assert meta["window"] == window and meta["n_sink"] == n_sink
    tokens = np.fromfile(tmp_path / "train.bin", np.uint16).reshape(-1, 33)
    answer = np.fromfile(tmp_path / "train.answer.bin", np.uint8).reshape(-1, 33)
    labels = np.fromfile(tmp_path / "train.needs_global.bin", np.uint8).reshape(-1, 33)
    expected = np.zeros_like(labels)
    for row, pairs in enumerate(recall_sources(tokens, answer, 4)):
        for a, source in pairs:  # predicted at a - 1, which reads a - window .. a - 1 and 0 .. n_sink - 1
            expected[row, a] = a - 1 - source >= window and source >= n_sink
    assert np.array_equal(labels, expected)
    if n_sink:  # the sinks exempt some answers that the window alone would not
        plain = np.zeros_like(labels)
        for row, pairs in enumerate(recall_sources(tokens, answer, 4)):
            for a, source in pairs:
                plain[row, a] = a - 1 - source >= window
        assert (expected < plain).any()
    assert (expected == 1).any()


def test_sinks_from_the_command_line(tmp_path):
    cfg, _ = parse(["--task=recall", "--window=8", "--n_sink=2", f"--out_dir={tmp_path}"])
    assert cfg.n_sink == 2 and cfg.window == 8
    assert parse(["--task=recall"])[0].n_sink == 0
    for bad in (dict(n_sink=-1), dict(n_sink=5), dict(window=0)):
        with pytest.raises(ValueError, match="n_sink"):
            tiny_recall(tmp_path, **bad)


def test_mixing_with_text_and_needle_haystack(tmp_path):
    texts = [f"line {i}: the quick brown fox jumps over the lazy dog\n" * 3 for i in range(60)]
    prepare(lambda: iter(texts), str(tmp_path / "text"), encoding="bytes", val_fraction=0.2, progress=False)
    meta = tiny_recall(tmp_path / "mixed", text_dir=str(tmp_path / "text"), text_ratio=0.5, n_train=200)
    assert meta["vocab_size"] == 256 + 20 and meta["encoding"] == "bytes" and meta["task_tokens"]["keys"] == [260, 268]
    assert 70 < meta["train_text_examples"] < 130
    tokens = np.fromfile(tmp_path / "mixed" / "train.bin", np.uint16).reshape(-1, 33)
    labels = np.fromfile(tmp_path / "mixed" / "train.needs_global.bin", np.uint8).reshape(-1, 33)
    loss = np.fromfile(tmp_path / "mixed" / "train.loss_mask.bin", np.uint8).reshape(-1, 33)
    is_text = (tokens < 256).all(1)
    assert is_text.sum() == meta["train_text_examples"]
    assert (labels[is_text] == 255).all() and (loss[is_text] == 1).all()  # text: unknown needs, full LM loss
    assert (labels[~is_text] <= 1).all() and (loss[~is_text].sum(1) == 4).all()

    needle = SyntheticConfig(task="needle", out_dir=str(tmp_path / "needle"), block_size=48, window=8, n_train=50,
                             n_val=10, text_dir=str(tmp_path / "text"))
    meta = generate(needle, Needle(value_len=2))
    tokens = np.fromfile(tmp_path / "needle" / "val.bin", np.uint16).reshape(-1, 49)
    assert ((tokens < 256).sum(1) == 49 - 8).all() and meta["task_tokens"]["fact_marker"] == [256, 257]
    with pytest.raises(ValueError, match="needle task needs text_dir"):
        generate(SyntheticConfig(task="needle", out_dir=str(tmp_path / "x")), Needle())


def test_command_line_options_belong_to_the_chosen_task(tmp_path):
    cfg, task = parse(["--task=copy", "--span_len=3", f"--out_dir={tmp_path}"])
    assert isinstance(task, Copy) and task.span_len == 3 and cfg.out_dir == str(tmp_path)
    with pytest.raises(ConfigError, match="n_pairs is not an option of task 'copy'"):
        parse(["--task=copy", "--n_pairs=3"])
    with pytest.raises(ConfigError, match="choose one of recall, copy, needle"):
        parse(["--task=sort"])
    with pytest.raises(ValueError, match="repeat_queries=True"):
        generate(SyntheticConfig(out_dir=str(tmp_path)), Recall(n_pairs=2, n_queries=3))


def tiny_run(tmp_path, data_dir, **overrides):
    values = {"data_dir": str(data_dir), "out_dir": str(tmp_path / "out"), "vocab_size": 20, "block_size": 32,
              "n_layer": 2, "n_head": 2, "n_embd": 32, "window": 4, "batch_size": 4, "max_iters": 6,
              "eval_interval": 6, "eval_iters": 1, "log_interval": 3, "warmup_iters": 2, "learning_rate": 3e-3,
              "tensorboard": False, "progress_bar": False, "device": "cpu", **overrides}
    return parse_args([f"--{k}={v!r}" if isinstance(v, str) else f"--{k}={v}" for k, v in values.items()],
                      TrainConfig, GPTConfig)


def test_evaluate_reports_task_accuracy_precision_and_recall(tmp_path, capsys):
    tiny_recall(tmp_path / "task")
    train.train(*tiny_run(tmp_path, tmp_path / "task"))
    evaluate.main([str(tmp_path / "out"), f"--data_dir={tmp_path / 'task'}", "--device=cpu"])
    report = capsys.readouterr().out
    assert "40 examples, 160 answer tokens" in report and "layer  head  global  precision  recall" in report
    assert len([line for line in report.splitlines() if line.lstrip().startswith(("0 ", "1 "))]) == 2 * 3
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
