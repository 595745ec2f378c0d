"""Fast tests of the grid subpackage split: the one percent and byte formatter, constants in table notes,
pruning's level, the record plots' content, compare.py's argument errors."""
import math
import os

import pytest

from nanoaha.formatting import human_bytes, percent


def test_percent_prints_a_fraction_with_the_digits_asked_and_missing_values_as_told():
    assert percent(0.1234) == "12.3%" and percent(0.1234, 0) == "12%" and percent(0.0005, 2) == "0.05%"
    assert percent(1.06, 0) == "106%" and percent(-0.5, 0) == "-50%"
    assert percent(None) == "-" and percent(math.nan) == "-" and percent(None, 0, missing="missing") == "missing"
    # digits=None: the short label (whole percents from 10%, one digit below)
    assert [percent(f, digits=None) for f in (0.372, 0.042, 0.0)] == ["37%", "4.2%", "0%"]


def test_human_bytes_counts_in_powers_of_1024():
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 98304, 3 * 2**20, 5 * 2**30, 2**42)] == \
        ["0 B", "1023 B", "1.0 KiB", "1.5 KiB", "96.0 KiB", "3.0 MiB", "5.0 GiB", "4096.0 GiB"]


def result(seed, loss, **values):
    """One seed's numbers as tables.collect gives them."""
    return {"seed": seed, "complete": loss is not None, "status": "ok", "val_loss": loss, "global_frac": None,
            "flops_ideal": 0.5, "flops_computed": 0.5, "kv_bytes": 1024, "kv_bytes_dense": 2048,
            "tokens_per_s": 1000.0, "wall_s": 60.0, "sweep": [], "per_head": None, "per_layer": None,
            "val_history": [], **values}


def two_rows():
    from nanoaha.grid.tables import Row
    return [Row("local", "fixed", "L", [1, 2], [result(1, 2.000), result(2, 2.000)]),
            Row("routed", "routed", "R", [1, 2], [result(1, 1.999, global_frac=0.1), result(2, 1.998)])]


def test_the_table_notes_state_the_smallest_difference_the_verdicts_use(monkeypatch):
    from nanoaha.grid import tables
    references = {"local": "local"}
    assert "by 0.0005 or more (prints as 0.001 or more)" in tables.results_table(two_rows(), references)
    monkeypatch.setattr(tables, "SMALLEST_DIFFERENCE", 0.0015)  # routed's -0.001 and -0.002 now include a tie
    table = tables.results_table(two_rows(), references)
    assert "by 0.0015 or more (prints as 0.002 or more)" in table and "] tie |" in table
    summary = tables.summary_table([("g", two_rows(), references)])
    assert "by 0.0015 or more, else a tie" in summary


def test_a_negative_pruning_level_names_the_default_level():
    from nanoaha import pruning
    with pytest.raises(ValueError, match=r"min_global_frac=-0.1: give a global fraction >= 0 \(0.05: below 5%\)"):
        pruning.prune("no/such/ckpt", "out", min_global_frac=-0.1)


RECORDS = ["results/2026-12-02_stdlib_bytes", "results/2026-12-02_stdlib_bpe"]  # the README's summary reads these


@pytest.mark.parametrize("record", RECORDS)
def test_a_committed_records_table_regenerates_from_its_rows_json_byte_for_byte(record):
    """A record's table.md is drawn from its rows.json alone. When a change to the tables is meant, this says
    which committed records' tables it changes (records are written once: they keep the old table)."""
    from nanoaha.grid.tables import load_rows, record_table
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _, references, rows, comparisons = load_rows(os.path.join(root, record))
    with open(os.path.join(root, record, "table.md")) as f:
        assert record_table(rows, references, comparisons) == f.read()


def test_the_readmes_summary_of_the_committed_records_regenerates_byte_for_byte():
    """2026-12-02_stdlib_bpe was written before grids had comparisons: the summary still reads it."""
    from nanoaha.grid.tables import load_rows, summary_record_table
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    grids = [load_rows(os.path.join(root, record)) for record in RECORDS]
    assert [len(comparisons) > 0 for *_, comparisons in grids] == [True, False]
    with open(os.path.join(root, "results", "2026-12-02_stdlib_grids", "table.md")) as f:
        assert summary_record_table([(name, rows, refs, comps) for name, refs, rows, comps in grids]) == f.read()


def test_pruning_keeps_a_layer_exactly_at_the_level_and_prunes_one_just_below():
    """'below min_global_frac' is strict: a layer global exactly as often as the level asks for stays routed."""
    from nanoaha.pruning import layers_to_prune
    level = 0.05
    fracs = [level, math.nextafter(level, 0.0), level * 2, 0.0]
    assert layers_to_prune(fracs, ["routed", "routed", "routed", "local"], level) == [1]
    assert layers_to_prune([0.0, 0.0], ["routed", "routed"], 0.0) == []  # level 0 prunes nothing


@pytest.mark.parametrize("argv, message", [
    (["configs/grids/tiny.py", "--jobs=two"], "config error: config key 'jobs' expects int, got the string 'two'"),
    (["configs/grids/tiny.py", "--jobs=0"], "--jobs=0: run at least one training at a time"),
    (["configs/grids/tiny.py", "configs/grids/stdlib_bpe.py"], "name one grid file: python compare.py"),
    (["--summary=s"], "--summary=NAME: name the record folders to put side by side"),
    (["configs/grids/tiny.py", "--dry_run", "--jobs"], "config error: override '--jobs' must look like --jobs=VALUE"),
])
def test_compare_refuses_a_bad_command_line_with_one_line(argv, message):
    import compare
    with pytest.raises(SystemExit) as e:
        compare.main(argv)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
