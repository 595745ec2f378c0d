import os
import re

import matplotlib
import numpy as np
import pytest
import torch
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
from tensorboard.util import tensor_util

from helpers import tiny_train_configs
from nanoaha.tensorboard_log import (
    HPARAMS_SHOWN,
    Logger,
    custom_scalars_layout,
    figure_to_array,
    group_head_tags,
    head_curves_figure,
    head_usage_figure,
    heatmap_figure,
    hparams_experiment,
    hparams_summaries,
    layout_tokens,
    router_p_histogram,
    run_hparams,
    sample_text,
    snippet_figure,
    visible,
)
from nanoaha import tensorboard_log
from nanoaha.formatting import percent

KINDS = ["routed", "local", "dense"]


def pixel(pixels, ax, x, y):
    """The rendered colour (0..1) at data coordinates (x, y) of ax."""
    px, py = ax.transData.transform((x, y))
    return pixels[int(round(pixels.shape[0] - py)), int(round(px))] / 255


def row_text(ax, row):
    """A snippet row as drawn: its dark-text and light-text overlays merged (each is blank where the other draws)."""
    parts = [t.get_text() for t in ax.texts if t.get_position()[1] == row + 0.5]
    return "".join(max(chars) for chars in zip(*parts))


def test_disabled_logger_does_nothing(tmp_path):
    class Unrunnable:
        def __getattr__(self, name):
            raise AssertionError("a disabled logger must not touch the model")

    logger = Logger(str(tmp_path / "tb"), enabled=False)
    logger.evaluation(0, {"val_loss": 1.0}, {}, Unrunnable(), torch.zeros(1, 4, dtype=torch.long),
                      {"encoding": "bytes"})
    logger.hparams({"n_layer": 2.0})
    logger.close()
    assert not os.path.exists(tmp_path / "tb")


def test_per_head_tags_are_grouped_by_layer():
    values = {"val_routing/global_frac": 0.1, "val_routing_layers/global_frac_layer3": 0.2,
              "val_routing_heads/layer3_head11": 0.3, "train_routing_heads/layer10_head0": 0.4}
    assert group_head_tags(values) == {"val_routing/global_frac": 0.1, "val_routing_layers/global_frac_layer3": 0.2,
                                       "val_routing_heads_layer3/head11": 0.3, "train_routing_heads_layer10/head0": 0.4}


def test_custom_scalar_charts_hold_at_most_five_heads():
    """A chart tells one run's lines apart by five marker shapes: twelve heads make three charts per layer. The
    val heads' charts are Margin charts of one series per head (drawn as they are), the training ones Multiline
    (smoothed)."""
    layout = custom_scalars_layout(["val_routing", "train_routing"], ["routed", "local", "routed"], n_head=12)
    titles = [f"layer {layer}, heads {heads}" for layer in (0, 2) for heads in ("0-4", "5-9", "10-11")]
    charts = layout["val_routing: global fraction per head"]
    assert list(charts) == titles
    for title, (kind, tags) in charts.items():
        layer, first, last = map(int, re.findall(r"\d+", title))
        assert kind == "Margin" and tags == [f"val_routing_heads_layer{layer}/head{h}" for h in range(first, last + 1)]
    charts = layout["train_routing: global fraction per head"]
    assert list(charts) == titles
    tags = [f"train_routing_heads_layer{layer}/head{h}" for layer in range(3) for h in range(12)]
    for title, (kind, [regex]) in charts.items():
        layer, first, last = map(int, re.findall(r"\d+", title))
        assert kind == "Multiline"
        # TensorBoard keeps the tags the regex matches at their start
        assert [t for t in tags if re.match(regex, t)] == [f"train_routing_heads_layer{layer}/head{h}"
                                                            for h in range(first, last + 1)]
    four = custom_scalars_layout(["train_routing"], ["routed"], n_head=4)
    assert four == {"train_routing: global fraction per head": {  # one chart; no evaluation charts before an eval
        "layer 0": ["Multiline", [r"train_routing_heads_layer0/head(0|1|2|3)$"]]}}


def test_the_evaluation_charts_draw_every_value_as_it_is_with_key_and_other_loss_side_by_side():
    """With a few evaluations a run, the smoothing of TensorBoard's other charts (0.6 by default) ends a line far
    from its last value; a Margin chart draws no smoothing. The layout reaches TensorBoard with one series per tag
    (each its own value, lower and upper), which torch's add_custom_scalars cannot write."""
    layout = custom_scalars_layout(["val_routing"], ["routed", "local", "routed"], n_head=2)
    assert list(layout) == [tensorboard_log.EVALUATION_CHARTS, "val_routing: global fraction per head"]
    evaluation = layout[tensorboard_log.EVALUATION_CHARTS]
    assert evaluation == {
        "val loss": ["Margin", ["val/loss"]],
        "val loss on key tokens and on the others": ["Margin", ["val/key_loss", "val/other_loss"]],
        "global fraction of the routed decisions": ["Margin", ["val_routing/global_frac"]],
        "global fraction per routed layer": ["Margin", ["val_routing_layers/global_frac_layer0",
                                                        "val_routing_layers/global_frac_layer2"]],
        "attention FLOPs vs dense, ideal and computed": ["Margin", ["val_routing/attention_flop_frac_ideal",
                                                                    "val_routing/attention_flop_frac_computed"]]}
    dense = custom_scalars_layout(["val_routing"], ["dense"] * 7, n_head=2)[tensorboard_log.EVALUATION_CHARTS]
    assert list(dense) == ["val loss", "val loss on key tokens and on the others",
                           "attention FLOPs vs dense, ideal and computed"]  # no routed layer: no global fraction
    seven = custom_scalars_layout(["val_routing"], ["routed"] * 7, n_head=2)[tensorboard_log.EVALUATION_CHARTS]
    assert seven["global fraction per routed layer, layers 5-6"][1] == [
        "val_routing_layers/global_frac_layer5", "val_routing_layers/global_frac_layer6"]

    summary = tensorboard_log.layout_summary(custom_scalars_layout(["val_routing", "train_routing"], ["routed"], 2))
    (value,) = summary.value
    assert value.tag == "custom_scalars__config__" and value.metadata.plugin_data.plugin_name == "custom_scalars"
    proto = layout_pb2.Layout.FromString(value.tensor.string_val[0])
    charts = {(category.title, chart.title): chart for category in proto.category for chart in category.chart}
    key_other = charts[tensorboard_log.EVALUATION_CHARTS, "val loss on key tokens and on the others"]
    assert [(s.value, s.lower, s.upper) for s in key_other.margin.series] == [
        ("val/key_loss",) * 3, ("val/other_loss",) * 3]
    assert list(charts["train_routing: global fraction per head", "layer 0"].multiline.tag) == [
        r"train_routing_heads_layer0/head(0|1)$"]


def test_heatmap_shows_each_routed_head_and_names_the_other_layers():
    frac = torch.tensor([[0.25, 0.04], [0.0, 0.0], [1.0, 1.0]])
    fig = heatmap_figure(frac, KINDS)
    ax = fig.axes[0]
    shown = ax.images[0].get_array()
    assert shown[0].tolist() == [0.25, pytest.approx(0.04)] and shown.mask[1:].all() and not shown.mask[0].any()
    assert sorted(t.get_text() for t in ax.texts) == ["25%", "4.0%", "dense: every token global", "local: window only"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["layer 0 R", "layer 1 L", "layer 2 D"]
    assert "routed: 14%" in ax.get_title()
    pixels = figure_to_array(fig)
    viridis = matplotlib.colormaps["viridis"]
    # colour on a square-root scale, sampled at a cell's corner (away from its label)
    assert pixel(pixels, ax, -0.35, -0.3) == pytest.approx(viridis(0.5)[:3], abs=0.02)
    assert pixel(pixels, ax, 0.65, -0.3) == pytest.approx(viridis(0.2)[:3], abs=0.02)
    assert pixel(pixels, ax, -0.35, 0.7) == pytest.approx((0.867, 0.867, 0.867), abs=0.02)  # grey row


def test_head_curves_give_each_head_of_a_routed_layer_its_own_colour():
    history = [[100, [[0.5, 0.4], [0.0, 0.0], [0.9, 0.1]]], [200, [[0.6, 0.2], [0.0, 0.0], [0.8, 0.0]]]]
    fig = head_curves_figure(history, ["routed", "local", "routed"])
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["layer 0", "layer 2"]  # routed layers only
    lines = axes[1].lines
    assert [list(line.get_xdata()) for line in lines] == [[100, 200]] * 2
    assert [list(line.get_ydata()) for line in lines] == [[0.9, 0.8], [0.1, 0.0]]
    assert lines[0].get_color() != lines[1].get_color()
    assert head_curves_figure(history, ["local", "local", "dense"]) is None
    assert head_curves_figure([], ["routed", "local", "routed"]) is None


def test_head_usage_sorts_every_routed_head():
    frac = torch.tensor([[0.1, 0.6], [0.0, 0.0], [1.0, 1.0], [0.3, 0.05]])
    ax = head_usage_figure(frac, ["routed", "local", "dense", "routed"]).axes[0]
    assert [bar.get_height() for bar in ax.patches] == pytest.approx([0.6, 0.3, 0.1, 0.05])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["L0H1", "L3H0", "L0H0", "L3H1"]
    assert head_usage_figure(frac, ["local", "local", "dense", "local"]) is None


def test_snippet_layout_wraps_and_shows_newlines():
    lines, owner = layout_tokens(["ab", "\n", "c\td", "xxxxx", "\x01"], columns=4)
    assert lines == ["ab\u21b5", "c   ", " dxx", "xxx\u00b7"]
    assert owner.tolist() == [[0, 0, 1, -1], [2, 2, 2, 2], [2, 2, 3, 3], [3, 3, 3, 4]]
    assert layout_tokens(["a\n"], columns=4)[0] == ["a\u21b5"]  # no empty row after a final newline


def test_snippet_shades_each_token_by_its_global_heads():
    pieces, counts = ["def", " f", "(x):", "\n", "  return"], [0, 8, 2, 4, 8]
    fig = snippet_figure(pieces, counts, max_count=8)
    ax = fig.axes[0]
    cmap = matplotlib.colormaps["RdYlBu_r"]
    colours = ax.images[0].get_array()
    owner = layout_tokens(pieces, 100)[1]
    for row, col in np.ndindex(owner.shape):
        want = (1.0, 1.0, 1.0, 1.0) if owner[row, col] < 0 else cmap(counts[owner[row, col]] / 8)
        assert tuple(colours[row, col]) == pytest.approx(want)
    assert [row_text(ax, 0), row_text(ax, 1)] == ["def f(x):\u21b5", "  return"]
    pixels = figure_to_array(fig)
    assert pixel(pixels, ax, 3.1, 0.1) == pytest.approx(cmap(1.0)[:3], abs=0.02)  # " f": all 8 heads global
    assert pixel(pixels, ax, 0.1, 0.1) == pytest.approx(cmap(0.0)[:3], abs=0.02)
    assert "(of 8; 55% overall)" in fig.texts[0].get_text()


def test_every_run_declares_the_same_hparams_and_metrics(tmp_path):
    """TensorBoard reads one experiment for a whole logdir: a local run's must not hide a routed run's metrics."""
    local = run_hparams(*tiny_train_configs(tmp_path, tmp_path, schedule="L", n_layer=4, seed=1, window=4),
                        "float32")
    routed = run_hparams(*tiny_train_configs(tmp_path, tmp_path, schedule="R", n_layer=2, routing="random",
                                             random_global_q=[0.1, 0.2], router_target_global=0.25), "bfloat16")
    assert local["layers"] == "LLLL" and routed["layers"] == "RR" and routed["dtype"] == "bfloat16"
    # typed by the declared field, not the value: one rate or a list of rates is text in every run
    assert local["random_global_q"] == "0.1" and routed["random_global_q"] == "[0.1, 0.2]"
    assert local["seed"] == 1.0 and local["compile"] is False and local["schedule"] == "L"
    experiment = hparams_experiment(local)
    assert experiment == hparams_experiment(routed)
    assert [m.name.tag for m in experiment.metric_infos][:5] == ["val/loss", "val/key_loss", "val/other_loss",
                                                                 "val_routing/global_frac",
                                                                 "val_routing/attention_flop_frac_ideal"]
    infos = {info.name: info for info in experiment.hparam_infos}
    assert infos.keys() == local.keys()
    assert sorted(name for name, info in infos.items() if info.differs) == sorted(HPARAMS_SHOWN)
    assert infos["random_global_q"].type == api_pb2.DATA_TYPE_STRING
    assert infos["window"].type == api_pb2.DATA_TYPE_FLOAT64 and infos["bias"].type == api_pb2.DATA_TYPE_BOOL


def test_hparams_summaries_hold_the_run_values():
    experiment, start, end = hparams_summaries({"layers": "LLLG", "window": 32.0, "compile": False})
    assert [s.value[0].tag for s in (experiment, start, end)] == [
        "_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"]
    values = HParamsPluginData.FromString(start.value[0].metadata.plugin_data.content).session_start_info.hparams
    assert (values["layers"].string_value, values["window"].number_value, values["compile"].bool_value) == \
        ("LLLG", 32.0, False)
    assert HParamsPluginData.FromString(end.value[0].metadata.plugin_data.content).session_end_info.status == \
        api_pb2.STATUS_SUCCESS


def test_router_p_histogram_keeps_every_bin_of_0_to_1():
    """Empty bins at both ends too: TensorBoard fits its axis to the buckets, which must span [0, 1]."""
    summary = router_p_histogram("router_p/layer1", np.array([0.5, 0.5, 0.51, 0.3]), threshold=0.4)
    value = summary.value[0]
    buckets = tensor_util.make_ndarray(value.tensor)
    assert buckets.shape == (50, 3) and buckets[0, 0] == 0.0 and buckets[-1, 1] == 1.0
    assert buckets[:-1, 1].tolist() == buckets[1:, 0].tolist()  # contiguous
    assert {i: c for i, c in enumerate(buckets[:, 2]) if c} == {15: 1, 25: 3}
    assert value.metadata.plugin_data.plugin_name == "histograms"
    assert value.metadata.display_name == "router_p/layer1 (global at p \u2265 0.4)"


def test_the_sample_shows_its_whitespace():
    assert visible("a b\tc\n\r\x00") == "a\u00b7b\u2192c\u21b5\n\\r\\x00"
    # a continuation of only spaces and newlines: a code block whose every line has something to show
    text = sample_text("def f(x):", " " * 4 + "\n\n", 3, 6)
    continuation = text.split("temperature 0)\n\n")[1].split("\n\n(whitespace")[0]
    assert continuation.split("\n") == ["    \u00b7\u00b7\u00b7\u00b7\u21b5", "    \u21b5", "    "]
    assert "the first 3 tokens of the first val window" in text and "    def\u00b7f(x):" in text


def test_percent_labels():
    assert [percent(f, digits=None) for f in (1.0, 0.372, 0.042, 0.0004, 0.0)] == ["100%", "37%", "4.2%", "0.0%", "0%"]
