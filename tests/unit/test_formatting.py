"""nanoaha/formatting.py: the one formatter for percents and the one for bytes."""
import math

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

