"""TensorBoard logging of a training run (rank 0 only): scalars, and at every evaluation where routing went.

Tags:
- scalars: whatever train.py logs (train/..., train_routing/...), val/loss, val/key_loss and val/other_loss
  (the loss on key tokens and on the others, nanoaha/key_tokens.py) and val_routing/... at each eval;
  per-head global fractions as {prefix}_heads_layer{l}/head{h} (one section per layer), and a Custom Scalars
  layout: the evaluation's scalars in Margin charts (drawn without smoothing; key and other loss side by side)
  and charts of each routed layer's heads (at most five a chart: one marker shape each);
- histograms router_p/layer{l}: the router probabilities of every (batch, head, position) decision of the first
  val batch, per layer with a learned router, in fixed bins over [0, 1], the threshold in the name shown (and
  as the scalar router_p/threshold);
- images val_routing/global_frac_heatmap (layer x head), val_routing/head_usage_sorted (every routed head, most
  global first) and val_routing/snippet (a fixed val snippet, each token shaded by how many routed heads went
  global);
- text val/sample: a greedy continuation of the snippet's first tokens, whitespace made visible;
- hparams (HParams tab): the run's config, in the run's own folder, with one experiment summary that every run
  writes alike (the same hparams and metrics, whatever the run's schedule), so whichever TensorBoard reads first
  describes them all.

The drawing functions take plain numbers and return matplotlib figures (no pyplot: no global state, no display).
"""
import math
import re
import time
from contextlib import nullcontext
from dataclasses import fields
from typing import get_type_hints

import matplotlib
import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo, SessionStartInfo
from tensorboard.plugins.histogram import metadata as histogram_metadata
from tensorboard.util import tensor_util

from data.tokens import codec
from nanoaha.formatting import percent
from nanoaha.routing_stats import global_heads_per_token, tensorboard_scalars

SNIPPET_TOKENS = 200      # tokens of the first val window shown with their routing
SAMPLE_PROMPT_TOKENS = 32  # the greedy sample continues this many of the snippet's first tokens ...
SAMPLE_NEW_TOKENS = 100    # ... by this many
SNIPPET_COLUMNS = 100      # characters per line of the snippet image
P_BIN_EDGES = np.linspace(0.0, 1.0, 51)  # fixed histogram bins over [0, 1], so steps and runs compare
KIND_LABEL = {"dense": "dense: every token global", "local": "local: window only"}
CHART_HEADS = 5  # heads per Custom Scalars chart: the marker shapes it tells one run's lines apart by
# The HParams tab's metric columns, the same for every run (a run without routers declares the routing ones too
# and shows an empty cell); TensorBoard shows the first five without a tick, so the computed FLOPs need one.
HPARAMS_METRICS = ("val/loss", "val/key_loss", "val/other_loss", "val_routing/global_frac",
                   "val_routing/attention_flop_frac_ideal", "val_routing/attention_flop_frac_computed")
# TensorBoard shows five hparams without a tick: those marked 'differs' first, by name. These five tell the runs
# of a comparison apart (layers: the layer letters, schedule repeated to n_layer); the rest are a tick away.
HPARAMS_SHOWN = ("layers", "router_lambda", "router_target_global", "seed", "window")


def group_head_tags(values):
    """routing_stats' per-head tags {prefix}_heads/layer{l}_head{h} as {prefix}_heads_layer{l}/head{h}, so each
    layer is one section of the Scalars tab (a 12 x 12 model gets 12 sections, not one of 144 cards)."""
    return {re.sub(r"_heads/layer(\d+)_head(\d+)$", r"_heads_layer\1/head\2", tag): v for tag, v in values.items()}


def head_groups(n_head, size=CHART_HEADS):
    """Heads 0 .. n_head-1 in consecutive groups of at most size."""
    return [range(first, min(first + size, n_head)) for first in range(0, n_head, size)]


EVALUATION_CHARTS = "evaluation: every eval's value as it is (these charts draw no smoothing)"


def evaluation_charts(kinds):
    """The Custom Scalars charts of the evaluation's scalars, as Margin charts (one series per tag): TensorBoard
    draws a Margin chart's values as they are, where its other charts smooth (0.6 by default), which with a few
    evaluations a run ends a line far from its last value. Key-token and other loss side by side per run."""
    routed = [layer for layer, kind in enumerate(kinds) if kind == "routed"]
    charts = {"val loss": ["Margin", ["val/loss"]],
              "val loss on key tokens and on the others": ["Margin", ["val/key_loss", "val/other_loss"]]}
    if routed:
        charts["global fraction of the routed decisions"] = ["Margin", ["val_routing/global_frac"]]
        groups = head_groups(len(routed))
        for group in groups:
            layers = [routed[i] for i in group]
            title = "global fraction per routed layer" + (f", layers {layers[0]}-{layers[-1]}" if len(groups) > 1
                                                          else "")
            charts[title] = ["Margin", [f"val_routing_layers/global_frac_layer{layer}" for layer in layers]]
    charts["attention FLOPs vs dense, ideal and computed"] = [
        "Margin", ["val_routing/attention_flop_frac_ideal", "val_routing/attention_flop_frac_computed"]]
    return charts


def custom_scalars_layout(prefixes, kinds, n_head):
    """Custom Scalars tab: with val_routing among the prefixes, the evaluation's charts first (evaluation_charts);
    then per prefix, charts of each routed layer's heads' global fractions, at most CHART_HEADS heads a chart:
    val_routing's Margin charts (drawn as they are), train_routing's Multiline ones (smoothed: one noisy batch a
    point). A chart colours its lines by run and tells one run's lines apart by their marker shape (its Matches
    list names each line with its shape), and it has five shapes: a sixth head would repeat the first one's."""
    groups = head_groups(n_head)
    layout = {EVALUATION_CHARTS: evaluation_charts(kinds)} if "val_routing" in prefixes else {}
    for prefix in prefixes:
        def chart(layer, heads):
            if prefix == "val_routing":
                return ["Margin", [f"{prefix}_heads_layer{layer}/head{h}" for h in heads]]
            return ["Multiline", [rf"{prefix}_heads_layer{layer}/head({'|'.join(map(str, heads))})$"]]
        layout[f"{prefix}: global fraction per head"] = {
            f"layer {layer}" + (f", heads {heads[0]}-{heads[-1]}" if len(groups) > 1 else ""): chart(layer, heads)
            for layer, kind in enumerate(kinds) if kind == "routed" for heads in groups}
    return layout


def layout_summary(layout):
    """The Custom Scalars layout {category: {title: [kind, tags]}} as the summary TensorBoard reads: a Multiline
    chart of tag regexes, or a Margin chart of one series per tag (each its own value, lower and upper: a line
    without a band). torch's add_custom_scalars writes one series a Margin chart."""
    def chart(title, kind, tags):
        if kind == "Margin":
            return layout_pb2.Chart(title=title, margin=layout_pb2.MarginChartContent(series=[
                layout_pb2.MarginChartContent.Series(value=tag, lower=tag, upper=tag) for tag in tags]))
        return layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=tags))
    proto = layout_pb2.Layout(category=[layout_pb2.Category(title=category, chart=[
        chart(title, kind, tags) for title, (kind, tags) in charts.items()]) for category, charts in layout.items()])
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="custom_scalars"))
    tensor = TensorProto(dtype="DT_STRING", string_val=[proto.SerializeToString()], tensor_shape=TensorShapeProto())
    return Summary(value=[Summary.Value(tag="custom_scalars__config__", tensor=tensor, metadata=metadata)])


def as_array(global_frac):
    return np.asarray(torch.as_tensor(global_frac, dtype=torch.float32).cpu(), dtype=float)


def heatmap_figure(global_frac, kinds):
    """Layer x head heatmap of global fractions (L, H), each routed cell annotated with its percentage; dense and
    local layers are grey rows that say what they are."""
    frac = as_array(global_frac)
    n_layer, n_head = frac.shape
    routed = np.array([kind == "routed" for kind in kinds])
    shown = np.ma.masked_array(frac, mask=~routed[:, None] | np.isnan(frac))
    fig = Figure(figsize=(2.4 + 0.6 * n_head, 1.1 + 0.45 * n_layer), dpi=100)
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    # square-root colour scale: most heads are rarely global, and 1% vs 10% should look different
    image = ax.imshow(shown, cmap=cmap, norm=PowerNorm(0.5, vmin=0.0, vmax=1.0), aspect="auto")
    for layer in range(n_layer):
        if not routed[layer]:
            ax.text((n_head - 1) / 2, layer, KIND_LABEL.get(kinds[layer], kinds[layer]), ha="center", va="center",
                    fontsize=10, color="#444444")
            continue
        for head in range(n_head):
            if not math.isnan(frac[layer, head]):
                ax.text(head, layer, percent(frac[layer, head], digits=None), ha="center", va="center", fontsize=9,
                        color="black" if frac[layer, head] > 0.4 else "white")
    ax.set_xticks(range(n_head), [f"h{h}" for h in range(n_head)], fontsize=9)
    ax.set_yticks(range(n_layer), [f"layer {i} {kind[0].upper()}" for i, kind in enumerate(kinds)], fontsize=9)
    ax.tick_params(length=0)
    mean = frac[routed].mean() if routed.any() else math.nan
    ax.set_title(f"global fraction per layer and head (routed: {percent(mean, digits=None)})" if routed.any()
                 else "global fraction per layer and head", fontsize=10)
    bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
    bar.set_ticks([0, 0.02, 0.1, 0.25, 0.5, 0.75, 1])  # about evenly spaced on the square-root scale
    bar.ax.tick_params(labelsize=8)
    bar.ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    fig.tight_layout()
    return fig


def head_curves_figure(head_history, kinds):
    """Each routed layer's heads along training, a colour per head (Custom Scalars colours lines by run only):
    head_history is [[step, (L, H) global fractions], ...]; None without routed layers or evaluations."""
    routed = [layer for layer, kind in enumerate(kinds) if kind == "routed"]
    if not routed or not head_history:
        return None
    steps = [step for step, _ in head_history]
    frac = np.array([fractions for _, fractions in head_history], dtype=float)  # (evals, L, H)
    columns = min(2, len(routed))  # near-square: TensorBoard shrinks every image to one card's width
    rows = math.ceil(len(routed) / columns)
    fig = Figure(figsize=(1.0 + 3.0 * columns, 0.6 + 2.3 * rows), dpi=100)
    axes = fig.subplots(rows, columns, squeeze=False).flatten()
    colours = matplotlib.colormaps["tab20" if frac.shape[2] > 10 else "tab10"]
    for ax, layer in zip(axes, routed):
        for head in range(frac.shape[2]):
            ax.plot(steps, frac[:, layer, head], lw=1.2, color=colours(head), marker="." if len(steps) < 30 else None,
                    label=f"h{head}")
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_ylim(0, 1)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(routed):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=7, ncol=2 if frac.shape[2] > 6 else 1, loc="best")
    fig.suptitle("global fraction per head along training (val, every evaluation)", fontsize=10)
    fig.tight_layout()
    return fig


def head_usage_figure(global_frac, kinds):
    """Every routed head's global fraction, most global first (the long tail); None without routed layers."""
    frac = as_array(global_frac)
    heads = [(frac[layer, head], f"L{layer}H{head}") for layer, kind in enumerate(kinds) if kind == "routed"
             for head in range(frac.shape[1])]
    if not heads:
        return None
    heads.sort(key=lambda item: -item[0])
    values = [v for v, _ in heads]
    fig = Figure(figsize=(min(12.0, max(5.0, 2.5 + 0.16 * len(heads))), 3.2), dpi=100)
    ax = fig.add_subplot()
    ax.bar(range(len(values)), values, width=0.85, color="#3b6fb6")
    mean = float(np.mean(values))
    ax.axhline(mean, color="#d62728", linestyle="--", linewidth=1, label=f"mean {percent(mean, digits=None)}")
    if len(heads) <= 48:
        ax.set_xticks(range(len(heads)), [name for _, name in heads], rotation=90, fontsize=7)
    else:
        ax.set_xlabel("routed heads, most global first", fontsize=9)
    ax.set_ylim(0, max(0.05, 1.1 * max(values)))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 5, 10]))  # whole percents: the axis is >= 5%
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_xlim(-0.6, len(values) - 0.4)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_ylabel("global fraction", fontsize=9)
    ax.set_title(f"per-head global fraction, sorted ({len(heads)} routed heads)", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def layout_tokens(pieces, columns):
    """The snippet as a character grid: (rows of text, token index per character cell, -1 where empty). A newline
    is drawn as a visible return sign and ends the row, a tab as four spaces, other control characters as a
    middle dot; rows wrap at `columns`."""
    rows, owners = [[]], [[]]
    for index, piece in enumerate(pieces):
        for char in piece.replace("\t", "    "):
            if len(rows[-1]) == columns:
                rows.append([]), owners.append([])
            rows[-1].append("\u21b5" if char == "\n" else char if char.isprintable() else "\u00b7")
            owners[-1].append(index)
            if char == "\n":
                rows.append([]), owners.append([])
    if not rows[-1] and len(rows) > 1:
        rows.pop(), owners.pop()
    width = max(len(row) for row in rows)
    grid = np.full((len(rows), max(width, 1)), -1)
    for r, row_owners in enumerate(owners):
        grid[r, :len(row_owners)] = row_owners
    return ["".join(row) for row in rows], grid


def mono_char_width(font_pt, dpi):
    """Width in inches of one DejaVu Sans Mono character as Agg draws it (advances are rounded to whole
    pixels), so a row of text lines up with a grid of cells."""
    fig = Figure(dpi=dpi)
    text = fig.text(0, 0, "M" * 100, fontsize=font_pt, family="DejaVu Sans Mono")
    return text.get_window_extent(FigureCanvasAgg(fig).get_renderer()).width / 100 / dpi


def snippet_figure(pieces, counts, max_count, columns=SNIPPET_COLUMNS):
    """The snippet as text, each token's background from blue (no routed head went global) to red (all
    max_count did); pieces are the decoded tokens, counts their number of global (layer, head) pairs."""
    lines, owner = layout_tokens(pieces, columns)
    n_rows, width = owner.shape
    font_pt, dpi = 10, 100
    cell_w, cell_h = mono_char_width(font_pt, dpi), 1.6 * font_pt / 72  # inches: one character
    margin, top, bottom = 0.25, 0.55, 0.85
    fig_w, fig_h = max(6.0, 2 * margin + cell_w * width), top + cell_h * n_rows + bottom
    fig = Figure(figsize=(fig_w, fig_h), dpi=dpi)
    ax = fig.add_axes((margin / fig_w, bottom / fig_h, cell_w * width / fig_w, cell_h * n_rows / fig_h))
    cmap = matplotlib.colormaps["RdYlBu_r"]
    level = np.asarray(counts, dtype=float)[owner.clip(min=0)] / max(max_count, 1)
    colours = cmap(level)
    colours[owner < 0] = (1.0, 1.0, 1.0, 1.0)
    ax.imshow(colours, aspect="auto", interpolation="nearest", extent=(0, width, n_rows, 0))
    dark = (0.299 * colours[..., 0] + 0.587 * colours[..., 1] + 0.114 * colours[..., 2]) < 0.5
    for r, line in enumerate(lines):  # one text per row and text colour: dark letters on light cells, white on dark
        for is_dark, colour in ((False, "black"), (True, "white")):
            shown = "".join(c if dark[r, i] == is_dark else " " for i, c in enumerate(line))
            if shown.strip():
                ax.text(0, r + 0.5, shown, ha="left", va="center_baseline", fontsize=font_pt,
                        family="DejaVu Sans Mono", color=colour)
    ax.hlines(range(1, n_rows), 0, width, color="white", linewidth=1.5)  # rows apart
    ax.set_xlim(0, width)
    ax.set_ylim(n_rows, 0)
    ax.axis("off")
    share = sum(counts) / (len(counts) * max_count) if len(counts) and max_count else 0.0
    title = (f"val snippet, {len(pieces)} tokens: background = routed heads that went global per token\n"
             f"(of {max_count}; {percent(share, digits=None)} overall)")
    fig.text(margin / fig_w, 1 - 0.08 / fig_h, title, fontsize=10, va="top", linespacing=1.3)
    bar_ax = fig.add_axes((margin / fig_w, 0.45 / fig_h, 3.0 / fig_w, 0.12 / fig_h))
    bar = fig.colorbar(matplotlib.cm.ScalarMappable(matplotlib.colors.Normalize(0, max_count), cmap), cax=bar_ax,
                       orientation="horizontal")
    bar.ax.tick_params(labelsize=8)
    bar.set_label("routed heads global (blue: all local, red: all global)", fontsize=8)
    return fig


def figure_to_array(fig):
    """(H, W, 3) uint8 pixels of a figure, rendered with Agg."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def token_pieces(ids, meta):
    """Each token as text, decoded the way sample.py does (synthetic task tokens are numbers: space them)."""
    _, decode = codec(meta["encoding"], meta.get("chars"))
    space = " " if meta["encoding"] == "synthetic" else ""
    return [decode([t]) + space for t in ids], decode


def router_p_histogram(tag, p, threshold):
    """A histogram summary of router probabilities p (numpy) in P_BIN_EDGES' bins, every bin kept: written as
    (left, right, count) buckets, which TensorBoard plots as they are, so its axis is [0, 1] at every step and in
    every run (from a classic histogram it drops the empty bins at both ends and fits the axis to the data). A
    histogram can draw no line: the threshold is in the name TensorBoard shows above it."""
    counts, _ = np.histogram(p, bins=P_BIN_EDGES)
    buckets = np.stack([P_BIN_EDGES[:-1], P_BIN_EDGES[1:], counts], axis=1)
    meta = histogram_metadata.create_summary_metadata(
        display_name=f"{tag} (global at p \u2265 {threshold:g})",
        description=f"router probability of every (batch, head, position) decision of the first val batch; a "
                    f"decision goes global at p \u2265 {threshold:g}")
    return Summary(value=[Summary.Value(tag=tag, metadata=meta, tensor=tensor_util.make_tensor_proto(buckets))])


WHITESPACE_SIGNS = {" ": "\u00b7", "\t": "\u2192", "\n": "\u21b5\n"}  # middle dot, right arrow, return sign
WHITESPACE_LEGEND = "\u00b7 space, \u2192 tab, \u21b5 newline"


def visible(text):
    """text with its whitespace shown as signs (WHITESPACE_SIGNS, each newline kept after its sign) and other
    control characters escaped (\\r, \\x0c): a sample of only spaces or newlines is then not an empty box."""
    return "".join(WHITESPACE_SIGNS.get(c) or (c if c.isprintable() else repr(c)[1:-1]) for c in text)


def code_block(text):
    """Markdown code block (indented, so any text renders verbatim in the Text tab)."""
    return "\n".join("    " + line for line in text.split("\n"))


def sample_text(prompt, continuation, n_prompt, n_new):
    """The Text tab's val/sample: the prompt and its greedy continuation, whitespace made visible."""
    return (f"**prompt**: the first {n_prompt} tokens of the first val window (the same at every evaluation)\n\n"
            f"{code_block(visible(prompt))}\n\n**greedy continuation** ({n_new} tokens, temperature 0)\n\n"
            f"{code_block(visible(continuation))}\n\n(whitespace shown as {WHITESPACE_LEGEND})")


def hparam_value(declared, value):
    """A config value as HParams holds it, by the field's declared type (not the value's, so that every run gives
    a field the same type): bool, a number as float, str; anything else (None, a list, a union) as its text."""
    if declared is bool:
        return bool(value)
    if declared in (int, float):
        return float(value)
    return value if declared is str else str(value)


def run_hparams(tcfg, mcfg, dtype):
    """Every field of the run's TrainConfig and GPTConfig, plus layers (the layer letters) and dtype, the
    precision the run trained in (what 'auto' picked)."""
    values = {}
    for config in (tcfg, mcfg):
        declared = get_type_hints(type(config))
        values.update({f.name: hparam_value(declared[f.name], getattr(config, f.name)) for f in fields(config)})
    return {**values, "layers": mcfg.layer_letters, "dtype": dtype}


HPARAM_TYPE = {bool: api_pb2.DATA_TYPE_BOOL, float: api_pb2.DATA_TYPE_FLOAT64, str: api_pb2.DATA_TYPE_STRING}


def hparams_experiment(values):
    """The experiment summary: names and types of the hparams, and HPARAMS_METRICS. It depends only on the
    names and the types of values (run_hparams: the config classes), not on the values, so every run writes the
    same one; TensorBoard reads one experiment for a whole logdir (the first it finds)."""
    infos = []
    for name, value in values.items():
        info = api_pb2.HParamInfo(name=name, type=HPARAM_TYPE[type(value)], differs=name in HPARAMS_SHOWN)
        if isinstance(value, bool):
            info.domain_discrete.extend([False, True])  # a filter with both ticked
        infos.append(info)
    metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in HPARAMS_METRICS]
    return api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics)


def hparams_summary(tag, **plugin_data):
    """A summary of the HParams plugin (tag: one of its metadata tags) holding one HParamsPluginData field."""
    content = HParamsPluginData(**plugin_data)
    return Summary(value=[Summary.Value(tag=tag, metadata=hparams_metadata.create_summary_metadata(content))])


def hparams_summaries(values):
    """The experiment, this run's hparam values (session start) and its end, as the HParams plugin reads them."""
    start = SessionStartInfo()
    for name, value in values.items():
        setattr(start.hparams[name], {bool: "bool_value", float: "number_value", str: "string_value"}[type(value)],
                value)
    end = SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    return [hparams_summary(hparams_metadata.EXPERIMENT_TAG, experiment=hparams_experiment(values)),
            hparams_summary(hparams_metadata.SESSION_START_INFO_TAG, session_start_info=start),
            hparams_summary(hparams_metadata.SESSION_END_INFO_TAG, session_end_info=end)]


class Logger:
    """Writes the run's TensorBoard events to log_dir; does nothing unless enabled (rank 0, tensorboard=True)."""

    def __init__(self, log_dir, enabled):
        self.writer, self.prefixes = None, []
        if enabled:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(log_dir)

    def scalars(self, step, values):
        if self.writer:
            for name, value in values.items():
                self.writer.add_scalar(name, value, step)

    def routing(self, step, prefix, stats, kinds):
        """routing_stats' scalars, per-head ones grouped by layer; returns them (as routing_stats names them)."""
        if not self.writer:
            return {}
        if prefix not in self.prefixes:  # the layout lists every prefix seen; the newest layout is the one shown
            self.prefixes.append(prefix)
            self.writer.file_writer.add_summary(layout_summary(
                custom_scalars_layout(self.prefixes, kinds, stats["global_frac"].shape[1])))
        values = tensorboard_scalars(prefix, stats, kinds)
        self.scalars(step, group_head_tags(values))
        return values

    def image(self, tag, fig, step):
        if fig is not None:
            self.writer.add_image(tag, figure_to_array(fig), step, dataformats="HWC")

    def evaluation(self, step, losses, stats, model, x, meta, autocast=nullcontext(), head_history=None):
        """Everything logged at an evaluation: val/loss, val/key_loss and val/other_loss (losses: evaluate_losses'
        dict; a loss without targets, nan, is left out) and val_routing scalars, the heatmap and long-tail images,
        router-p histograms, the snippet and a greedy sample. x: (B, T) val tokens, the same at every eval (its
        first row is the snippet); model: the bare model (not DDP/compiled); head_history: every evaluation's
        per-head global fractions so far (train.py's, kept across resumes), drawn a colour per head. Runs on a
        forked, fixed RNG so random routing neither changes training nor varies between evals."""
        if not self.writer:
            return
        kinds = model.config.kinds
        val_loss = losses["val_loss"]
        split = {f"val/{key}": losses[key] for key in ("key_loss", "other_loss")
                 if math.isfinite(losses.get(key, math.nan))}
        self.scalars(step, {"val/loss": val_loss, **split})
        self.routing(step, "val_routing", stats, kinds)
        n_global = sum(kind == "routed" for kind in kinds) * model.config.n_head
        if n_global:
            self.image("val_routing/global_frac_heatmap", heatmap_figure(stats["global_frac"], kinds), step)
            self.image("val_routing/head_usage_sorted", head_usage_figure(stats["global_frac"], kinds), step)
            self.image("val_routing/head_curves", head_curves_figure(head_history, kinds), step)
        was_training = model.training
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
            torch.manual_seed(0)
            with autocast:
                out = model(x)
            prompt = x[:1, :min(SAMPLE_PROMPT_TOKENS, x.shape[1])]
            sample = model.generate(prompt, SAMPLE_NEW_TOKENS, temperature=0.0)[0, prompt.shape[1]:]
        model.train(was_training)
        threshold = model.config.router_threshold
        for layer, p in enumerate(out.probs):
            if p is not None:
                self.writer.file_writer.add_summary(router_p_histogram(
                    f"router_p/layer{layer}", p.float().flatten().cpu().numpy(), threshold), step)
        if any(p is not None for p in out.probs):  # beside the histograms in Time Series, whose cards show only tags
            self.scalars(step, {"router_p/threshold": threshold})
        snippet = x[0, :SNIPPET_TOKENS].tolist()
        pieces, decode = token_pieces(snippet, meta)
        if n_global:
            counts = global_heads_per_token(out)[0, :len(snippet)].tolist()
            self.image("val_routing/snippet", snippet_figure(pieces, counts, n_global), step)
        self.writer.add_text("val/sample", sample_text(decode(prompt[0].tolist()), decode(sample.tolist()),
                                                       prompt.shape[1], len(sample)), step)

    def hparams(self, values):
        """The run's hparams (run_hparams) in the HParams tab, written into this run's own event file (add_hparams
        would make a second run folder), so each run is listed once; its metrics are the latest values of
        HPARAMS_METRICS' scalars."""
        if self.writer:
            for summary in hparams_summaries(values):
                self.writer.file_writer.add_summary(summary)

    def close(self):
        if self.writer:
            self.writer.close()
