"""The record's plots (matplotlib, Agg, small PNGs): loss against attention FLOPs (the Pareto picture), global
fraction against window, per-run layer x head heatmaps of global fractions, val loss curves, each head's probe
scores along training. compare.py draws
them from tables.Row lists. Figures are made without pyplot (no global state, no display); each function
returns the Figure it saved."""
import math

import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, PercentFormatter

from nanoaha.formatting import percent
from nanoaha.grid.tables import paired_by_seed, spread

FIGSIZE, WIDE, DPI = (6.4, 4.2), (8.4, 4.6), 100  # WIDE: room for a legend of up to 20 runs beside the plot
MARKERS = {"fixed": "s", "random": "^", "routed": "o"}


# tab20's ten hues first (tab10: the first ten runs differ in hue), then their light shades, then tab20b: the
# live grid has more than 20 rows
_TAB20 = matplotlib.colormaps["tab20"].colors
_PALETTE = _TAB20[0::2] + _TAB20[1::2] + matplotlib.colormaps["tab20b"].colors


def _color(i):
    """Up to 40 distinct colours, one per run."""
    return _PALETTE[i % len(_PALETTE)]


def _legend_beside(ax):
    if ax.has_data():
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _axes(figsize=FIGSIZE):
    fig = Figure(figsize=figsize)
    return fig, fig.subplots()


def _save(fig, path):
    """Lay out and write the figure, grown to hold what lies outside the axes (a legend beside them); returns it
    (tests read what was drawn from it)."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return fig


def _error(stat):
    """Matplotlib's [[below], [above]] error bar from a (mean, min, max) spread."""
    return [[stat[0] - stat[1]], [stat[2] - stat[0]]]


PARETO_TITLE = "squares fixed, triangles random, circles routed; lines: threshold sweeps"


def pareto(path, rows, references=None, metric="val_loss"):
    """Val loss against ideal attention FLOPs: every fixed schedule and random run a point with its seed range
    as error bars, every routed run its threshold-sweep curves (one thin line per seed) and its trained point.
    With a local reference, val loss is measured from local's at the same seed (_losses).
    The loss axis ends as far above the worse reference as the best run is below it: a run above that is named
    in the legend with its loss, off the plot, so that it does not squash the runs that compete.
    metric='key_loss': the loss on key tokens instead (the sweep's rows have it too)."""
    fig, ax = _axes(WIDE)
    _pareto_points(ax, rows, {row.run: _color(i) for i, row in enumerate(rows)}, references, metric=metric)
    what = "key-token loss" if metric == "key_loss" else "loss"
    ax.set_title(f"{what} against attention cost ({PARETO_TITLE})", fontsize=9)
    _legend_beside(ax)
    return _save(fig, path)


def pareto_panels(path, panels):
    """pareto() for several grids side by side, one panel each (title, rows, references); a run has one colour
    in all."""
    names = list(dict.fromkeys(row.run for _, rows, _ in panels for row in rows))
    colors = {name: _color(i) for i, name in enumerate(names)}
    fig = Figure(figsize=(4.2 * len(panels) + 2.6, 4.6))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, rows, references) in zip(axes, panels):
        _pareto_points(ax, rows, colors, references, loss_in_legend=False)  # one legend: no per-panel values
        ax.set_title(title, fontsize=9)
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.suptitle(f"val loss against attention cost ({PARETO_TITLE})", fontsize=9)
    fig.legend(list(handles.values()), list(handles), fontsize=7, loc="center right")
    fig.tight_layout(rect=(0, 0, 1 - 2.5 / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=DPI)
    return fig


def _losses(rows, references, metric="val_loss"):
    """Each row's val loss (or metric) spread (mean, min, max) and {seed: loss} on the plot's scale, and the axis
    label: minus the local reference's loss at the same seed where it has results (a seed moves every row's
    loss alike, by more than the rows differ; rows with a third seed would otherwise sit higher or lower for
    it), else the raw loss."""
    name = "key-token loss" if metric == "key_loss" else "val loss"
    anchor = {row.run: row for row in rows}.get((references or {}).get("local"))
    if anchor is None or not anchor.losses(metric):
        return {row.run: (row.stat(metric), row.losses(metric)) for row in rows}, name
    scaled = {}
    for row in rows:
        by_seed = paired_by_seed(row, anchor, metric)
        scaled[row.run] = (spread(list(by_seed.values())), by_seed)
    return scaled, f"{name} minus {anchor.run}'s, same seed"


def _loss_ceiling(losses, references):
    """Top of the loss axis: the worse reference plus the span down to the best run (room for the runs that
    compete; one that did not learn, like a half-trained run, is named in the legend instead); None (let
    matplotlib choose) without references. losses: {run: (spread, by seed)} from _losses."""
    refs = [losses[name][0][0] for name in (references or {}).values() if name in losses and losses[name][0]]
    means = [s[0] for s, _ in losses.values() if s]
    if not refs:
        return None
    return 2 * max(refs) - min(means)


def _pareto_points(ax, rows, colors, references=None, loss_in_legend=True, metric="val_loss"):
    losses, label = _losses(rows, references, metric)
    ceiling = _loss_ceiling(losses, references)
    offset = "minus" in label
    for row in rows:
        (loss, by_seed), flops = losses[row.run], row.stat("flops_ideal")
        if loss is None or flops is None:
            continue
        color = colors[row.run]
        if ceiling is not None and loss[0] > ceiling:
            value = (f"{loss[0]:+.3f}, " if offset else f"{loss[0]:.3f}, ") if loss_in_legend else ""
            ax.plot([], [], MARKERS[row.kind], color=color, ms=5, label=f"{row.run} ({value}off the plot)")
            continue
        if row.kind == "routed":
            for result in row.results:
                if result["seed"] not in by_seed:
                    continue
                shift = by_seed[result["seed"]] - result[metric]  # the same offset as the trained point
                sweep = sorted((p["attention_flop_frac_ideal"], p[metric] + shift) for p in result["sweep"]
                               if p.get(metric) is not None)
                if sweep:
                    ax.plot(*zip(*sweep), color=color, lw=0.7, alpha=0.6)
        ax.errorbar([flops[0]], [loss[0]], yerr=_error(loss), xerr=_error(flops), fmt=MARKERS[row.kind],
                    color=color, ms=5, capsize=2, label=row.run)
    if ceiling is not None:
        ax.set_ylim(top=ceiling)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_xlabel("attention FLOPs vs dense (ideal)")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)


def window(path, groups):
    """Global fraction against window for runs that differ only in window. groups: [[(window, row), ...]].
    Draws nothing and returns None where no group has a routed row (a ladder of local runs has no global
    fraction)."""
    labels = [" / ".join(row.run for _, row in group) for group in groups]
    points_by_group = [[(w, row.stat("global_frac")) for w, row in group if row.stat("global_frac")]
                       for group in groups]
    if not any(points_by_group):
        return None
    fig, ax = _axes()
    windows = set()
    for points, label in zip(points_by_group, labels):
        windows |= {w for w, _ in points}
        if points:
            ax.errorbar([w for w, _ in points], [s[0] for _, s in points], fmt="o-", capsize=2,
                        yerr=[[s[0] - s[1] for _, s in points], [s[2] - s[0] for _, s in points]],
                        label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(windows), [str(w) for w in sorted(windows)])
    ax.minorticks_off()
    ax.set_xlabel("window (tokens)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=1))
    ax.set_ylabel("global fraction (routed layers)")
    ax.set_title("how much global attention the routers ask for, by window", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def heatmap(path, run, per_head, layers):
    """Layer x head global fractions of one run (a layer that is not routed is blank and named by its kind)."""
    n_layer = len(per_head)
    n_head = max((len(h) for h in per_head if h), default=1)
    grid = [[math.nan] * n_head if h is None else list(h) for h in per_head]
    fig, ax = _axes((min(1.6 + 0.55 * n_head, 9), min(1.2 + 0.45 * n_layer, 8)))
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="magma", aspect="auto")
    if n_layer * n_head <= 144:
        for i, heads in enumerate(grid):
            for h, value in enumerate(heads):
                if not math.isnan(value):
                    ax.text(h, i, percent(value, 0), ha="center", va="center", fontsize=7,
                            color="white" if value < 0.6 else "black")
    ax.set_xticks(range(n_head))
    ax.set_yticks(range(n_layer), [f"{i} {layers[i]}" for i in range(n_layer)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{run}: global fraction", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.05, format=PercentFormatter(1.0, decimals=0))
    return _save(fig, path)


HEAD_SCORE_LABELS = {"previous": "previous-token score", "induction": "induction score",
                     "global": "global share"}
_LAYER_MAPS = ("Blues", "Oranges", "Greens", "Purples", "Reds", "Greys")


def head_scores(path, run, by_seed, layers):
    """Each head's function along training, from the repeat probe train.py runs at every evaluation: per seed (a
    column), each head's previous-token score (top: a local previous-token head), each non-local layer's heads'
    induction score (middle: a copy head) and, where a layer is routed, its heads' global share on the probe's
    tokens (bottom: which heads the routers send global while the scores above change). by_seed: {seed:
    copy_history}, whose entries' fourth field is {score: [[per head] per layer]}. A colour family per layer, a
    shade per head."""
    seeds = sorted(by_seed)
    scores = [score for score in HEAD_SCORE_LABELS if score != "global" or "R" in layers and any(
        "global" in entry[3] for history in by_seed.values() for entry in history if len(entry) > 3 and entry[3])]
    fig = Figure(figsize=(3.0 * len(seeds) + 1.8, 2.8 * len(scores)))
    axes = fig.subplots(len(scores), len(seeds), squeeze=False, sharex=True, sharey="row")
    handles = {}
    for col, seed in enumerate(seeds):
        points = [entry for entry in by_seed[seed] if len(entry) > 3 and entry[3] and entry[0] > 0]
        for row, score in enumerate(scores):
            ax = axes[row][col]
            for layer, letter in enumerate(layers):
                if score == "induction" and letter == "L":  # a window holds no earlier copy to attend to
                    continue
                if score == "global" and letter != "R":  # a fixed layer's share is its kind
                    continue
                n_head = len(points[0][3][score][layer]) if points else 0
                cmap = matplotlib.colormaps[_LAYER_MAPS[layer % len(_LAYER_MAPS)]]
                for head in range(n_head):
                    color = cmap(0.45 + 0.5 * head / max(1, n_head - 1))
                    ax.plot([e[0] for e in points], [e[3][score][layer][head] for e in points], lw=1, color=color)
                    handles.setdefault((layer, head), Line2D([], [], color=color, lw=1.5,
                                                             label=f"layer {layer} ({letter}) head {head}"))
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(f"seed {seed}", fontsize=10)
            if row == len(scores) - 1:
                ax.set_xlabel("step")
            if col == 0:
                ax.set_ylabel(HEAD_SCORE_LABELS[score])
    fig.suptitle(f"{run}: each head's function along training (repeat probe)", fontsize=10)
    axes[0][-1].legend(handles=[handles[k] for k in sorted(handles)], fontsize=7, loc="upper left",
                       bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path)


def _log_steps(ax, steps):
    """A log step axis where the evaluations span more than a decade (learning curves: early steps matter)."""
    if steps and min(steps) > 0 and max(steps) / min(steps) > 10:
        ax.set_xscale("log")
        # plain step numbers at 1-2-5 steps: matplotlib's default labels minor ticks as 3x10^2 ..., which collide
        low, high = min(steps), max(steps)
        ticks = [m * 10 ** e for e in range(int(math.log10(low)), int(math.log10(high)) + 1) for m in (1, 2, 5)
                 if low <= m * 10 ** e <= high]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(lambda x, _: f"{x:,.0f}")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())


def comparison_curves(path, panels):
    """Same-seed loss differences along training, one panel per loss (all tokens, key tokens): panels is
    [(title, [(label, {seed: [[step, difference], ...]}), ...]), ...]; a colour per comparison, a line style per
    seed (one legend for each), and the zero line (below it the first run of the pair is better)."""
    fig = Figure(figsize=(4.6 * len(panels) + 2.4, 4.2))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    styles = ["-", "--", ":", "-.", (0, (5, 1, 1, 1))]
    seed_styles = {}
    labels = list(dict.fromkeys(label for _, curves in panels for label, _ in curves))  # one colour per comparison
    for ax, (title, curves) in zip(axes, panels):
        for label, by_seed in curves:
            i = labels.index(label)
            for seed, points in sorted(by_seed.items()):
                style = styles[seed_styles.setdefault(seed, len(seed_styles)) % len(styles)]
                steps, diffs = zip(*points)
                ax.plot(steps, diffs, lw=1, color=_color(i), ls=style)
        ax.axhline(0.0, color="black", lw=0.8)
        _log_steps(ax, [step for _, by_seed in curves for points in by_seed.values() for step, _ in points])
        ax.set_xlabel("step")
        ax.set_ylabel("loss difference, same seed")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    comparisons = [Line2D([], [], color=_color(i), lw=1.5, label=label) for i, label in enumerate(labels)]
    seeds = [Line2D([], [], color="black", lw=1, ls=styles[k % len(styles)], label=f"seed {seed}")
             for seed, k in sorted(seed_styles.items())]
    axes[-1].legend(handles=comparisons + seeds, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                    borderaxespad=0)
    return _save(fig, path)


def val_curves(path, curves, ylabel="val loss (train.py's eval)", seeds="first seed"):
    """A loss against step (val loss; ylabel names another). curves: [(label, [[step, loss], ...]), ...];
    seeds: which seed of each run the curves are, for the title."""
    fig, ax = _axes(WIDE)
    for i, (label, history) in enumerate(curves):
        # step 0 (the untrained model) dwarfs the rest; a loss of null (nan in training) is no point
        history = [point for point in history if point[0] > 0 and point[1] is not None]
        if history:
            steps, losses = zip(*sorted(history))
            ax.plot(steps, losses, lw=1, color=_color(i), label=label)
    _log_steps(ax, [point[0] for _, history in curves for point in history if point[0] > 0])
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{ylabel.split(' (')[0]} during training ({seeds})", fontsize=10)
    ax.grid(alpha=0.3)
    _legend_beside(ax)
    return _save(fig, path)
