"""sample.py --show_routing: the colour scale and its legend."""
import re

import sample

ANSI = re.compile(r"\x1b\[48;5;(\d+)m\x1b\[\d+m(.*?)\x1b\[0m", re.S)


def cells(text):
    """[(background colour, text)] of each coloured run of an ANSI string."""
    return [(int(colour), shown) for colour, shown in ANSI.findall(text)]


def test_a_text_of_few_global_heads_gets_a_colour_per_count_and_a_legend_naming_them():
    """Tokens with 0-3 of 16 heads global (a quick-start model's level): four distinct colours, from the
    palette's blue end to its red end, and a legend that names each count in its colour (a fixed 0-16 scale
    gave them all the same blue)."""
    text, legend = sample.colour_by_routing(list("abcdab"), [0, 1, 2, 3, 0, 1], 16)
    shown = cells(text)
    assert [piece for _, piece in shown] == list("abcdab")
    colours = [colour for colour, _ in shown]
    assert len(set(colours[:4])) == 4 and colours[4:] == colours[:2]
    assert colours[0] == sample.PALETTE[0] and colours[3] == sample.PALETTE[-1]
    assert cells(legend) == [(colours[0], " 0 "), (colours[1], " 1 "), (colours[2], " 2 "), (colours[3], " 3 ")]


def test_a_text_spanning_more_counts_than_colours_gets_ranges_that_cover_them():
    counts = list(range(3, 24))  # 21 counts, 9 colours
    steps, ranges, colours = sample.routing_steps(counts, 32)
    assert len(ranges) == len(colours) == len(set(colours)) == len(sample.PALETTE)
    assert ranges[0][0] == 3 and ranges[-1][1] == 23
    assert all(b + 1 == c for (_, b), (c, _) in zip(ranges, ranges[1:]))  # no gap, no overlap
    assert all(ranges[step][0] <= count <= ranges[step][1] for count, step in zip(counts, steps))
    _, legend = sample.colour_by_routing(["x"] * len(counts), counts, 32)
    labels = [label.strip() for _, label in cells(legend)]
    assert labels[0] == "3-4" and labels[-1] == f"{ranges[-1][0]}-23"


def test_a_text_of_one_count_is_coloured_by_its_share_of_the_heads_and_newlines_show():
    for count, colour in ((0, sample.PALETTE[0]), (16, sample.PALETTE[-1]), (8, sample.PALETTE[4])):
        text, legend = sample.colour_by_routing(["a", "\n", "b"], [count] * 3, 16)
        assert cells(legend) == [(colour, f" {count} ")]
        assert cells(text) == [(colour, "a"), (colour, "\u21b5"), (colour, "b")] and "\u21b5\x1b[0m\n" in text
