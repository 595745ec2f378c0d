"""Where does long context start to pay on stdlib bytes (T = 1024, w = 32)? Learning curves of local and dense
attention to 30M tokens a run, two seeds, on all tokens and on key tokens (targets a copy could
predict only from beyond the window; docs/evaluation.md): train.py evaluates every 250 steps (val_history and
key_history in each run's train_summary.json; the record's val_curves.png and key_curves.png), the grid's
evaluation scores the end. Questions: at what budget does dense's key-token loss pull clearly ahead of local's
(same seed), and where does its all-token loss cross? (Whether learned routing follows dense there: grid
stdlib_live.)

The shape, 2 layers x 256 wide (4 heads of 64), is the one of the shape ladder (grid stdlib_shape_ladder,
record results/2026-12-02_stdlib_shape_ladder) that closed dense's key-token gap to local soonest (one seed):
at 6.1M tokens dense minus local on key tokens was +0.022 at 2 x 256, +0.031 at 4 x 128 and +0.074 at 6 x 64
(the grid's evaluation), and along training it shrank fastest at 2 x 256 (+0.15 at step 250, +0.01 at 1500
in train.py's evaluations); 2 x 256 also had the lowest loss. Two
layers are the fewest a copy needs (a local layer to read the previous token, a global one to find the match),
so the fixed schedule with one global layer is LG.

The learning rate follows one cosine schedule per run (1e-3, 100 warm-up steps, down to 1e-4 at step 7325):
each curve is one 30M-token run, not a family of runs trained to each budget, so a point at 8M tokens has a
higher learning rate than a run that stops there would.

    python data/python_stdlib/prepare.py
    python compare.py configs/grids/stdlib_curves.py

Budget: 4 trainings of 7325 steps x 4 x 1024 tokens (30.0M tokens each); one thread per run in bf16 on the
2-core CPU, two at a time: 30 (local) and 43 (dense) minutes a run (record results/2026-12-03_stdlib_curves).
LG's and routed's curves, planned here at first, come from the grid stdlib_live (to 20M tokens, where its
comparison is run), whose runs evaluate at the same steps. Resumable within a session: the runner continues
each run from its last checkpoint (every evaluation).
"""
base = ["configs/quickstart.py"]
common = {"n_layer": 2, "n_embd": 256, "max_iters": 7325, "warmup_iters": 100, "eval_interval": 250, "eval_iters": 20, "log_interval": 50,
          "router_lambda_ramp": 500}
seeds = [1, 2]
runs = {
    "local": {"schedule": "L"},
    "dense": {"schedule": "G"},
    # LG's and routed's curves (to 20M tokens) are in grid stdlib_live, whose runs evaluate at the same steps
}
comparisons = {
    "dense vs local": ("dense", "local"),
}
evaluate = {"eval_tokens": 65536}
