"""Which model shape learns soonest per token to use context beyond the window? Dense against local attention
at three shapes of the quick-start family on stdlib bytes (T = 1024, w = 32), one seed, 1500 steps (6.1M tokens),
judged on the loss on key tokens (targets a copy could predict only from beyond the window; docs/evaluation.md)
of dense minus local at the same seed: along training (train.py's evaluations every 125 steps, key_history in
each run's train_summary.json) and at the end (the grid's evaluation). The shape that pulls ahead soonest is the
one for the learning curves to 30M tokens (the key-token issue). A copy needs two attention layers, so 2 layers
is the smallest.

    python data/python_stdlib/prepare.py
    python compare.py configs/grids/stdlib_shape_ladder.py

Budget: 6 trainings of 1500 steps x 4 x 1024 tokens. The learning rate follows the quick start's schedule
(1e-3, 50 warm-up steps, cosine to 1e-4 at step 1500), so these are the curves of a 1500-step run, not the
first 1500 steps of a longer one.
"""
base = ["configs/quickstart.py"]
common = {"max_iters": 1500, "warmup_iters": 50, "eval_interval": 125, "eval_iters": 20, "log_interval": 50}
seeds = [1]
runs = {
    "l2_w256_G": {"schedule": "G", "n_layer": 2, "n_embd": 256},  # 4 heads of 64
    "l2_w256_L": {"schedule": "L", "n_layer": 2, "n_embd": 256},
    "l4_w128_G": {"schedule": "G"},                               # the quick-start shape: 4 heads of 32
    "l4_w128_L": {"schedule": "L"},
    "l6_w64_G": {"schedule": "G", "n_layer": 6, "n_embd": 64},    # the stdlib grids' shape: 4 heads of 16
    "l6_w64_L": {"schedule": "L", "n_layer": 6, "n_embd": 64},
}
comparisons = {
    "dense vs local, 2 x 256": ("l2_w256_G", "l2_w256_L"),
    "dense vs local, 4 x 128": ("l4_w128_G", "l4_w128_L"),
    "dense vs local, 6 x 64": ("l6_w64_G", "l6_w64_L"),
}
evaluate = {"eval_tokens": 65536, "thresholds": []}
