"""Is LG's lead in the stdlib_live grid (results/2026-12-04_stdlib_live: LG 0.23 ahead of local and dense at
20.5M tokens, its key-token loss falling sharply at about 8M) its local first layer? LG against GL, the same
layers in the other order, at the shape of stdlib_live (stdlib bytes, 2 x 256, T = 1024, w = 32, bf16) on a
shorter schedule: 2500 steps of 4 x 1024 tokens (10.2M tokens, cosine to 1e-4 over them), past the point where
LG's copy mechanism formed. A quick lead for the stdlib_live rows GL and LR, not a replacement for them.

    python data/python_stdlib/prepare.py
    python compare.py configs/grids/stdlib_first_layer.py

Budget: 2 runs of about 18 minutes, side by side on the 2-core CPU.
"""
base = ["configs/quickstart.py"]
common = {"n_layer": 2, "n_embd": 256, "max_iters": 2500, "warmup_iters": 100, "eval_interval": 250,
          "eval_iters": 20, "log_interval": 50}
seeds = [1]
runs = {
    "LG": {"schedule": "LG"},
    "GL": {"schedule": "GL"},
}
comparisons = {
    "local first layer: LG vs GL": ("LG", "GL"),
}
evaluate = {"eval_tokens": 65536}
