import io
import json
import math
import os

import numpy as np
import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

import train
from data.loader import TokenData
from helpers import tiny_train_configs
from nanoaha import tensorboard_log
from nanoaha.key_tokens import batch_key_labels
from nanoaha.tensorboard_log import (figure_to_array, head_curves_figure, head_usage_figure, heatmap_figure,
                                     snippet_figure)


def events(log_dir):
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_training_writes_every_view_with_sane_values(tmp_path, tiny_corpus, monkeypatch):
    monkeypatch.setattr(tensorboard_log, "SAMPLE_NEW_TOKENS", 20)  # token-by-token generation is the slow part
    tcfg, mcfg = tiny_train_configs(tmp_path, tiny_corpus, tensorboard=True, n_layer=3, schedule="RLR", max_iters=2,
                         eval_interval=2, log_interval=1)
    result = train.train(tcfg, mcfg)
    log_dir = os.path.join(tcfg.out_dir, "tb")
    assert all(os.path.isfile(os.path.join(log_dir, f)) for f in os.listdir(log_dir))  # one run folder, hparams too
    acc = events(log_dir)
    tags = acc.Tags()
    eval_steps = [0, 2]

    assert [e.step for e in acc.Scalars("val/loss")] == eval_steps
    assert acc.Scalars("val/loss")[-1].value == pytest.approx(result["val_loss"])
    # grouped per layer; the local layer has none but its heads' previous-token scores (the repeat probe's)
    assert not [t for t in tags["scalars"] if "_heads/" in t or "layer1" in t and "val_probe_previous" not in t]
    assert [acc.Scalars(f"val_probe_previous_layer1/head{h}")[-1].step for h in range(2)] == [2, 2]
    assert "val_probe_induction_layer2/head1" in tags["scalars"] and "val_probe_induction_layer1/head0" not in \
        tags["scalars"]
    assert [e.step for e in acc.Scalars("val/copy_gain")] == eval_steps  # the repeat probe: layers that read far
    assert sorted(t for t in tags["scalars"] if t.startswith("val_probe/")) == [
        "val_probe/induction_max/layer0", "val_probe/induction_max/layer2"]
    assert [e.step for e in acc.Scalars("train/tokens_per_s")] == [1, 2]
    assert all(e.value > 0 for e in acc.Scalars("train/tflops_per_device"))
    assert [e.value for e in acc.Scalars("train/nonfinite_steps")] == [0, 0]
    assert "train/mfu" not in tags["scalars"]  # no peak FLOP/s known for a CPU
    for prefix in ("val_routing", "train_routing"):
        for layer in (0, 2):
            heads = [acc.Scalars(f"{prefix}_heads_layer{layer}/head{h}")[-1].value for h in range(mcfg.n_head)]
            assert all(0 <= v <= 1 for v in heads)
            assert np.mean(heads) == pytest.approx(acc.Scalars(f"{prefix}_layers/global_frac_layer{layer}")[-1].value)
    layout = layout_pb2.Layout.FromString(acc.Tensors("custom_scalars__config__")[-1].tensor_proto.string_val[0])
    charts = {c.title: [(ch.title, list(ch.multiline.tag) or [s.value for s in ch.margin.series]) for ch in c.chart]
              for c in layout.category}
    assert charts["val_routing: global fraction per head"] == [
        ("layer 0", ["val_routing_heads_layer0/head0", "val_routing_heads_layer0/head1"]),
        ("layer 2", ["val_routing_heads_layer2/head0", "val_routing_heads_layer2/head1"])]
    assert charts["train_routing: global fraction per head"] == [("layer 0", [r"train_routing_heads_layer0/head(0|1)$"]),
                                                                  ("layer 2", [r"train_routing_heads_layer2/head(0|1)$"])]
    evaluation = dict(charts[tensorboard_log.EVALUATION_CHARTS])  # each of its tags is one the run logged
    assert evaluation["val loss on key tokens and on the others"] == ["val/key_loss", "val/other_loss"]
    assert all(tag in tags["scalars"] for chart in evaluation.values() for tag in chart if tag != "val/key_loss")

    decisions = tcfg.batch_size * mcfg.n_head * mcfg.block_size  # (B, H, T) router decisions of the first val batch
    histograms = [tag for tag in tags["tensors"] if acc.SummaryMetadata(tag).plugin_data.plugin_name == "histograms"]
    assert histograms == ["router_p/layer0", "router_p/layer2"] and not tags["histograms"]
    for tag in histograms:
        assert acc.SummaryMetadata(tag).display_name == f"{tag} (global at p \u2265 0.5)"
        hists = acc.Tensors(tag)
        assert [h.step for h in hists] == eval_steps
        for h in hists:
            buckets = tensor_util.make_ndarray(h.tensor_proto)  # (left, right, count): every bin, [0, 1]
            edges = np.linspace(0, 1, 51)
            assert buckets[:, :2].tolist() == np.stack([edges[:-1], edges[1:]], 1).tolist()
            assert buckets[:, 2].sum() == decisions
    assert [(e.step, e.value) for e in acc.Scalars("router_p/threshold")] == [(0, 0.5), (2, 0.5)]
    first = tensor_util.make_ndarray(hists[0].tensor_proto)
    assert first[25].tolist() == [0.5, 0.52, decisions]  # zero-initialised routers: p = 0.5, in the bin from 0.5

    assert sorted(tags["images"]) == ["val_routing/global_frac_heatmap", "val_routing/head_curves",
                                      "val_routing/head_usage_sorted", "val_routing/snippet"]
    for tag in tags["images"]:
        images = acc.Images(tag)
        assert [i.step for i in images] == eval_steps
        png = images[-1].encoded_image_string
        assert png.startswith(b"\x89PNG")
        image = np.asarray(Image.open(io.BytesIO(png)))
        assert 150 <= image.shape[0] <= 1500 and 300 <= image.shape[1] <= 1500
        assert image.std() > 10  # not blank

    text = acc.Tensors("val/sample/text_summary")
    assert [t.step for t in text] == eval_steps
    sample = text[-1].tensor_proto.string_val[0].decode()
    first_window = TokenData(str(tiny_corpus), mcfg.block_size, mcfg.vocab_size).val_batches(1, 1)[0][0][0]
    prompt = bytes(first_window[:tensorboard_log.SAMPLE_PROMPT_TOKENS].tolist()).decode()
    assert "**greedy continuation** (20 tokens, temperature 0)" in sample
    shown = prompt.replace(" ", "\u00b7").replace("\n", "\u21b5\n")  # whitespace as signs, in a code block
    assert "\n".join("    " + line for line in shown.split("\n")) in sample

    # the images are the figures of the logged numbers: redrawn from the per-head scalars, pixel for pixel
    logged = {tag: np.asarray(Image.open(io.BytesIO(acc.Images(tag)[-1].encoded_image_string)))
              for tag in tags["images"]}
    frac = torch.tensor([[acc.Scalars(f"val_routing_heads_layer{layer}/head{h}")[-1].value if kind == "routed"
                          else math.nan for h in range(mcfg.n_head)] for layer, kind in enumerate(mcfg.kinds)])
    assert np.array_equal(logged["val_routing/global_frac_heatmap"], figure_to_array(heatmap_figure(frac, mcfg.kinds)))
    assert np.array_equal(logged["val_routing/head_usage_sorted"],
                          figure_to_array(head_usage_figure(frac, mcfg.kinds)))
    history = [[step, [[acc.Scalars(f"val_routing_heads_layer{layer}/head{h}")[i].value if kind == "routed"
                        else (1.0 if kind == "dense" else 0.0) for h in range(mcfg.n_head)]
                       for layer, kind in enumerate(mcfg.kinds)]] for i, step in enumerate(eval_steps)]
    assert np.array_equal(logged["val_routing/head_curves"], figure_to_array(head_curves_figure(history, mcfg.kinds)))
    snippet = first_window[:tensorboard_log.SNIPPET_TOKENS].tolist()
    pieces, _ = tensorboard_log.token_pieces(snippet, {"encoding": "bytes"})
    n_global = 2 * mcfg.n_head  # two routed layers
    assert logged["val_routing/snippet"].shape == figure_to_array(snippet_figure(pieces, [0] * len(pieces),
                                                                                 n_global)).shape

    hparams = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["n_layer"].number_value == 3 and start.hparams["layers"].string_value == "RLR"
    assert start.hparams["learning_rate"].number_value == pytest.approx(tcfg.learning_rate)
    assert start.hparams["dtype"].string_value == "float32"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/experiment"]).experiment
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics == list(tensorboard_log.HPARAMS_METRICS)
    # HParams shows their latest values; 32-token windows hold no key token, so that cell stays empty
    assert set(metrics) - set(tags["scalars"]) == {"val/key_loss"}


def test_runs_of_different_schedules_share_one_experiment(tmp_path, tiny_corpus, monkeypatch):
    """A fixed-schedule run and a routed one in one logdir: TensorBoard's HParams tab reads the first experiment it
    finds for all runs, so both write the same one; and the fixed-schedule run logs no router quantities."""
    monkeypatch.setattr(tensorboard_log, "SAMPLE_NEW_TOKENS", 2)
    runs = {}
    for schedule in ("LG", "R"):
        tcfg, mcfg = tiny_train_configs(tmp_path / schedule, tiny_corpus, tensorboard=True, schedule=schedule,
                                        max_iters=2, eval_interval=2, log_interval=1)
        train.train(tcfg, mcfg)
        runs[schedule] = events(os.path.join(tcfg.out_dir, "tb"))
    fixed, routed = runs["LG"], runs["R"]
    experiment = fixed.PluginTagToContent("hparams")["_hparams_/experiment"]
    assert experiment == routed.PluginTagToContent("hparams")["_hparams_/experiment"]
    metrics = [m.name.tag for m in plugin_data_pb2.HParamsPluginData.FromString(experiment).experiment.metric_infos]
    assert "val_routing/global_frac" in metrics and "val/key_loss" in metrics
    assert "val_routing/global_frac" in routed.Tags()["scalars"]
    assert "val_routing/global_frac" not in fixed.Tags()["scalars"]  # no routed layer: HParams shows an empty cell

    router_quantities = {"train/lambda", "train/penalty_added", "train/mean_p"}
    assert router_quantities <= set(routed.Tags()["scalars"])
    assert not router_quantities & set(fixed.Tags()["scalars"])
    assert not [tag for tag in fixed.Tags()["scalars"] if "mean_p" in tag or "_heads_" in tag]
    assert not [tag for kind in ("histograms", "tensors", "scalars") for tag in fixed.Tags()[kind] if "router_p" in tag]


def test_key_and_other_loss_are_logged_at_every_evaluation(tmp_path, tiny_corpus, monkeypatch):
    monkeypatch.setattr(tensorboard_log, "SAMPLE_NEW_TOKENS", 4)
    # 64-token windows hold two lines or more: 8-byte copies from beyond the window of 8 (key tokens)
    tcfg, mcfg = tiny_train_configs(tmp_path, tiny_corpus, tensorboard=True, block_size=64, max_iters=2,
                                    eval_interval=1)
    result = train.train(tcfg, mcfg)
    summary = json.load(open(os.path.join(tcfg.out_dir, "train_summary.json")))
    labels = [batch_key_labels(x, y, 8, mcfg.window) for x, y in
              TokenData(str(tiny_corpus), 64, 256).val_batches(tcfg.batch_size, tcfg.eval_iters)]
    assert summary["key_frac"] == pytest.approx(torch.cat(labels).float().mean().item()) and summary["key_frac"] > 0
    assert summary["key_tokens"] == {"k": 8, "window": 8, "n_sink": 0}
    share = summary["key_frac"]
    assert share * summary["key_loss"] + (1 - share) * summary["other_loss"] == pytest.approx(summary["val_loss"])
    acc = events(os.path.join(tcfg.out_dir, "tb"))
    for name in ("key_loss", "other_loss"):
        scalars = acc.Scalars(f"val/{name}")
        assert [e.step for e in scalars] == [0, 1, 2]
        assert scalars[-1].value == pytest.approx(summary[name]) and summary[name] == result[name]


def test_logging_leaves_training_unchanged(tmp_path, tiny_corpus, monkeypatch):
    """The evaluation views run the model (random routing draws from the RNG): training must not notice."""
    monkeypatch.setattr(tensorboard_log, "SAMPLE_NEW_TOKENS", 5)
    common = {"routing": "random", "dropout": 0.1, "max_iters": 4, "eval_interval": 2, "save_checkpoint": False}
    quiet = train.train(*tiny_train_configs(tmp_path / "a", tiny_corpus, tensorboard=False, **common))
    logged = train.train(*tiny_train_configs(tmp_path / "b", tiny_corpus, tensorboard=True, **common))
    assert os.listdir(tmp_path / "b" / "out" / "tb") and not os.path.exists(tmp_path / "a" / "out" / "tb")
    assert logged["losses"] == quiet["losses"]
