"""Python stdlib, GPT-2 BPE (tiktoken), T = 512, w = 32: the rows of stdlib_bytes.py on a BPE-tokenized
corpus (6 layers x 4 heads x 64 wide; a window of 32 BPE tokens is about 110 bytes of source).

Questions: does learned routing recover most of the local-to-dense gap (or beat both) while replacing most
global attention? At equal attention cost, does it beat the fixed schedules LG, LLLG, LLLLLG and random
routing matched to it layer by layer? Does the need for global attention fall as the window grows (16, 32,
64, 128)? How do routing from scratch and routing fine-tuned onto a dense model compare at equal total tokens
(everything trains / only the routers train)? What does sparse-mode training (exact first, then sparse; alone and
with a per-layer budget) cost in loss and save in compute? The rows are in _stdlib_rows.py.

Budget: 21 runs, 48 trainings of 100 steps x 4 x 512 tokens (0.2M tokens each; fine-tuning 50 dense + 50 routed
steps), 6 layers x 4 heads x 64 wide: early training only. The 50,304-way output layer and its softmax cost most
of every step, so all rows train at nearly one speed and halving the width saves only a third. Training speed of
one run, one thread, measured on the 2-core CPU as CPU seconds per step over steps 3-12 of short runs (the speed
of a run with a core to itself, see stdlib_bytes.py): routed (exact) 3.38 s per step of 2048 tokens (610
tokens/s; 128 wide: dense 5.45 s, routed 5.29 s). From that, 2.1 h of training with --jobs=2; stdlib_bytes.py
took 1.45x its estimate made the same way (two runs share the machine's memory bandwidth), so expect about 3.5 h
of wall time, more than one working session: the runner resumes where it was stopped. The steps are _N below:
change it to trade time for tokens.

    python data/python_stdlib/prepare.py --encoding=gpt2 --out_dir=data/python_stdlib_gpt2
    python compare.py configs/grids/stdlib_bpe.py --jobs=2
"""
from configs.grids._stdlib_rows import COMPARISONS as comparisons, comparison_runs

_N = 100           # steps of a run from scratch; fine-tuned: _N // 2 dense steps, then _N // 2 routed
_CORE = [1, 2, 3]  # the rows the conclusions rest on get a third seed

base = ["configs/quickstart.py"]
common = {"dataset": "python_stdlib_gpt2", "vocab_size": 50304, "block_size": 512, "window": 32, "n_layer": 6,
          "n_embd": 64, "max_iters": _N, "warmup_iters": 10, "router_lambda_ramp": 30, "eval_interval": 25,
          "eval_iters": 10, "log_interval": 25}
seeds = [1, 2]
runs = comparison_runs(_N, _CORE)
evaluate = {"eval_tokens": 16384}
