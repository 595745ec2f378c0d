"""bench/train_speed.py's CPU mode at a tiny size: every variant in fp32 and bf16, timed over rounds, in one table
of finite positive numbers."""
import math
import re

from helpers import run_script, table_cells

VARIANTS = ["G (dense)", "L (local)", "LLLG", "R exact", "R sparse"]
HEADER = ["variant", "fp32 tok/s", "bf16 tok/s", "bf16 / fp32 [min, max]", "fp32 vs dense", "bf16 vs dense"]


def test_train_speed_on_the_cpu_times_every_variant_in_fp32_and_bf16():
    done = run_script("bench/train_speed.py", "--device", "cpu", "--block_size", "128", "--steps", "1", "--warmup",
                      "1", "--rounds", "2", "--threads", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert out.startswith("command: python bench/train_speed.py --device cpu") and "CPU: " in out
    assert "native bf16: " in out and " threads" in out and "2 rounds of 1 timed steps" in out
    rows = table_cells(out)
    assert rows["variant"] == HEADER and set(rows) == {"variant", *VARIANTS}  # no compiled rows without --compile
    for variant in VARIANTS:
        numbers = [float(n.replace(",", "")) for cell in rows[variant][1:] for n in re.findall(r"[\d,.]+\d", cell)]
        assert len(numbers) == 2 + 3 + 2, rows[variant]  # tok/s twice, the ratio and its range, vs dense twice
        assert all(math.isfinite(n) and n > 0 for n in numbers), rows[variant]
    assert rows["G (dense)"][4:] == ["1.00x", "1.00x"]  # dense against itself
