"""What a wider window buys instead of global attention: local attention at windows 8 to 128 against dense and LG
on the live comparison's shape and budget (grid stdlib_live: 2 x 256, stdlib bytes, 20.5M tokens a run). Key
tokens are labelled beyond a window of 32 for every row (evaluate's key_window), so the rows' key-token losses
are on one set of targets: a wider window reaches some of them, and the key-token loss shows how many.

    python data/python_stdlib/prepare.py
    python compare.py configs/grids/stdlib_window_ladder.py [--from_record=results/<date>_stdlib_window_ladder]

Budget: about 35 minutes a local run, 40 for LG, 55 for dense (two runs side by side on a 2-core CPU): about 8
process-hours. The ladder rows of stdlib_live's records (to 2026-12-05) were labelled beyond their own windows.
"""
base = ["configs/quickstart.py"]
common = {"n_layer": 2, "n_embd": 256, "max_iters": 5000, "warmup_iters": 100, "eval_interval": 250,
          "eval_iters": 20, "log_interval": 50, "router_lambda_ramp": 500}
seeds = [1, 2]
runs = {
    "dense": {"schedule": "G"},
    "local": {"schedule": "L"},
    "LG": {"schedule": "LG"},
    "local_w8": {"schedule": "L", "window": 8},
    "local_w16": {"schedule": "L", "window": 16},
    "local_w64": {"schedule": "L", "window": 64},
    "local_w128": {"schedule": "L", "window": 128},
}
comparisons = {
    "dense vs local at w = 128": ("dense", "local_w128"),
    "LG vs local at w = 128": ("LG", "local_w128"),
    "local at w = 64 vs w = 32": ("local_w64", "local"),
}
evaluate = {"eval_tokens": 65536, "key_window": 32}
