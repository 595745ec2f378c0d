"""Where does long context start to pay on stdlib bytes (T = 1024, w = 32)? Learning curves of local, dense,
LLLG and routed attention to 30M tokens a run, two seeds, on all tokens and on key tokens (targets a copy could
predict only from beyond the window; docs/evaluation.md): train.py evaluates every 250 steps (val_history and
key_history in each run's train_summary.json; the record's val_curves.png and key_curves.png), the grid's
evaluation scores the end. Questions: at what budget does dense's key-token loss pull clearly ahead of local's
(same seed), and where does its all-token loss cross? Does learned routing follow dense there, and at what
global fraction?

The learning rate follows one cosine schedule per run (1e-3, 100 warm-up steps, down to 1e-4 at step 7325):
each curve is one 30M-token run, not a family of runs trained to each budget, so a point at 8M tokens has a
higher learning rate than a run that stops there would.

    python data/python_stdlib/prepare.py
    python compare.py configs/grids/stdlib_curves.py

Budget: 8 trainings (seed 1 of every row first, then seed 2 added here) of 7325 steps x 4 x 1024 tokens (30.0M tokens each); one thread per run in bf16 on the
2-core CPU (results/2026-12-02_cpu_bf16_speed): about 1.0 h (dense), 1.2 h (routed), 0.6 h (LLLG) and 0.5 h
(local) per seed, 6.6 process-hours, 3.3 h of wall time with two jobs. Resumable: the runner continues each run
from its last checkpoint (every evaluation).
"""
base = ["configs/quickstart.py"]
common = {"max_iters": 7325, "warmup_iters": 100, "eval_interval": 250, "eval_iters": 20, "log_interval": 50,
          "router_lambda_ramp": 500}
seeds = [1]  # seed 2 next: the runner trains run by run, so one seed of every row comes first
runs = {
    "local": {"schedule": "L"},
    "dense": {"schedule": "G"},
    "LLLG": {"schedule": "LLLG"},
    "routed": {"schedule": "R", "router_lambda": 0.01},
}
comparisons = {
    "dense vs local": ("dense", "local"),
    "LLLG vs local": ("LLLG", "local"),
    "routed vs local": ("routed", "local"),
    "routed vs dense": ("routed", "dense"),
}
evaluate = {"eval_tokens": 65536}
