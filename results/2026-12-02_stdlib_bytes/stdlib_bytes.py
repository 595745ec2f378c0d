"""Python stdlib, bytes, T = 1024, w = 32: routed attention against fixed schedules, random routing and
fine-tuning, at equal training budget (the quick-start setting at 6 layers and, to fit the budget, 64 wide).

Questions: does learned routing recover most of the local-to-dense gap (or beat both) while replacing most
global attention? At equal attention cost, does it beat the fixed schedules LG, LLLG, LLLLLG and random
routing matched to it layer by layer? Does the need for global attention fall as the window grows (16, 32,
64, 128)? How do routing from scratch and routing fine-tuned onto a dense model compare at equal total tokens
(everything trains / only the routers train)? What does sparse-mode training (exact first, then sparse; alone and
with a per-layer budget) cost in loss and save in compute? The rows are in _stdlib_rows.py.

Budget: 21 runs, 48 trainings of 250 steps x 4 x 1024 tokens (1.0M tokens each; fine-tuning 125 dense + 125
routed steps), 6 layers x 4 heads x 64 wide. Training speed of one run, one thread, measured on the 2-core CPU
as CPU seconds per step over steps 3-12 of short runs: dense 1.37 s, routed (exact) 1.63 s, local 0.58 s per
step of 4096 tokens (2,990, 2,510 and 7,060 tokens/s; 128 wide: 2.81, 3.19 and 1.42 s). That is the speed of a
run with a core to itself: two 128-wide dense runs side by side, sharing the CPU with two other jobs, trained at
717 tokens/s each, half of the 1,460 the measurement gives. Measured on the whole grid (record
2026-12-01_stdlib_bytes): 5.8 process-hours of training and 0.5 of evaluation (64 windows, the threshold sweep
for learned routers), 3.2 h of wall time with --jobs=2 on an otherwise idle machine. The steps are _N below:
change it to trade time for tokens.

    python data/python_stdlib/prepare.py
    python compare.py configs/grids/stdlib_bytes.py --jobs=2
"""
from configs.grids._stdlib_rows import COMPARISONS as comparisons, comparison_runs

_N = 250           # steps of a run from scratch; fine-tuned: _N // 2 dense steps, then _N // 2 routed
_CORE = [1, 2, 3]  # the rows the conclusions rest on get a third seed

base = ["configs/quickstart.py"]
common = {"n_layer": 6, "n_embd": 64, "max_iters": _N, "warmup_iters": 25, "router_lambda_ramp": 75,
          "eval_interval": 50, "eval_iters": 10, "log_interval": 25}
seeds = [1, 2]
runs = comparison_runs(_N, _CORE)
evaluate = {"eval_tokens": 65536}
