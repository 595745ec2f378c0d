"""At four layers, from what budget does one global layer pay on key tokens? Learning curves of local, dense and
LLLG at 4 x 128 (the quick start's shape: 4 heads of 32) on stdlib bytes (T = 1024, w = 32), to 20.5M tokens a run, two seeds, on all tokens and on key tokens (targets a copy could predict only from beyond the
window, labelled beyond 32 for every row; docs/evaluation.md): train.py evaluates and runs the repeat probe every
250 steps (val_history, key_history and copy_history in each run's train_summary.json; the record's curves). The
budget where LLLG's key-token loss is below local's on both seeds is the one for the depth comparison (the live
grid's rows at four layers: other placements of the global layer, LGLG, one fixed global head, learned routing at
LLLG's cost), as stdlib_curves chose the 2-layer live grid's.

One cosine schedule per run (1e-3, 100 warm-up steps, down to 1e-4 at step 5000): a point at 8M tokens has a
higher learning rate than a run that stops there would.

    python data/python_stdlib/prepare.py
    python compare.py configs/grids/stdlib_depth_curves.py

Budget: 6 trainings of 5000 steps x 4 x 1024 tokens (20.5M tokens each). 4 x 128 rather than 4 x 256: at T = 1024
attention dominates a step, so a run of 4 x 128 costs about what the 2-layer live grid's 2 x 256 does (the shape
ladder measured 11.7K against 9.5K tokens/s for local and 6.2K against 6.0K for dense,
results/2026-12-02_stdlib_shape_ladder), where 4 x 256 would cost twice that; the depth comparison that follows
(some 24 trainings) fits this CPU at this shape.
"""
base = ["configs/quickstart.py"]
common = {"n_layer": 4, "n_embd": 128, "max_iters": 5000, "warmup_iters": 100, "eval_interval": 250,
          "eval_iters": 20, "log_interval": 50}
seeds = [1, 2]
runs = {  # LLLG and local first: the question is between them
    "LLLG": {"schedule": "LLLG"},
    "local": {"schedule": "L"},
    "dense": {"schedule": "G"},
}
comparisons = {
    "dense vs local": ("dense", "local"),
    "LLLG vs local": ("LLLG", "local"),
    "LLLG vs dense": ("LLLG", "dense"),
}
evaluate = {"eval_tokens": 65536, "key_window": 32}
