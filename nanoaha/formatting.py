"""How every table, record and report prints a fraction as a percent and a byte count (one place, so that
the same number reads the same in evaluate.py's table, a grid record and a TensorBoard label)."""
import math


def percent(fraction, digits=1, missing="-"):
    """0.1234 -> '12.3%' with `digits` after the point; None or nan -> missing. digits=None: a short label,
    whole percents from 10% (and 0%), one digit below ('37%', '4.2%')."""
    if fraction is None or math.isnan(fraction):
        return missing
    if digits is None:
        digits = 0 if fraction >= 0.1 or fraction == 0 else 1
    return f"{100 * fraction:.{digits}f}%"


def fixed(value, digits=4, missing="-"):
    """A loss as a table or a log line prints it: 1.23456 -> '1.2346'; None or nan (no targets) -> missing."""
    return missing if value is None or math.isnan(value) else f"{value:.{digits}f}"


def signed(value, digits=3, missing="-"):
    """A loss difference with its sign: 0.0123 -> '+0.012'; None or nan -> missing."""
    return missing if value is None or math.isnan(value) else f"{value:+.{digits}f}"


def human_bytes(n):
    """1536 -> '1.5 KiB': whole bytes below 1 KiB, else KiB, MiB or GiB with one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
