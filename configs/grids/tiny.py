"""A smoke test of the grid runner, about a minute on a CPU: local, dense and routed attention on a tiny model,
two seeds. Does the runner train, evaluate and tabulate? (The numbers mean nothing at this size.)

    python data/python_stdlib/prepare.py && python compare.py configs/grids/tiny.py --jobs=2
"""
base = ["configs/quickstart.py"]
common = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64, "window": 8, "batch_size": 4,
          "max_iters": 60, "learning_rate": 3e-3, "warmup_iters": 10, "eval_interval": 20, "eval_iters": 4,
          "log_interval": 10, "router_lambda_ramp": 20, "device": "cpu"}
seeds = [1, 2]
runs = {
    "local": {"schedule": "L"},
    "dense": {"schedule": "G"},
    "routed": {"schedule": "R"},
}
evaluate = {"eval_tokens": 4096, "thresholds": [0.3, 0.5, 0.7], "device": "cpu"}
