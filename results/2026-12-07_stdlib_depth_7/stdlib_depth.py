"""The live comparison at four layers: does what pays at two layers (a copy head above local previous-token heads;
one global layer over local ones and one fixed global head ahead of dense) hold at depth, where does the one
global layer pay most, and where do learned routers put their global heads (the record's heatmaps per layer and
head, and its head-score plots: is the copy head still directly above local previous-token heads)?

4 x 128 (the quick start's shape: 4 heads of 32) on the stdlib as bytes, T = 1024, w = 32, bf16 on the CPU; 5000
steps of 4 x 1024 tokens (20.5M tokens a run), cosine from 1e-3 to 1e-4: the 2-layer live grid's budget; every
run evaluates and probes every 250 steps, so LLLG's, local's and dense's first two seeds (run first) are the
learning curves that say whether one global layer pays on key tokens within this budget at four layers (the
issue asks for a budget where LLLG is below local on key tokens on two seeds; the 2-layer grid's was chosen so by
grid stdlib_curves). Key tokens are labelled beyond a window of 32 for every row. At four layers one global layer (LLLG, LGLL) costs a quarter of dense attention, so
routing at LLLG's cost aims at a quarter of the routed decisions global (4 of the 16 head decisions per token), at
one head's cost at 1 of 16; LGLG costs half.

    python data/python_stdlib/prepare.py
    python compare.py configs/grids/stdlib_depth.py [--from_record=results/<date>_stdlib_depth]

Budget: 11 rows x 3 seeds, 25-45 minutes a run two at a time on the 2-core CPU (about 10 hours, over sessions:
docs/grids.md, "A grid over several sessions"). 4 x 128 rather than 4 x 256: at T = 1024 attention dominates a
step, so a run of 4 x 128 costs about what the 2-layer grid's 2 x 256 does (the shape ladder measured 11.7K
against 9.5K tokens/s for local, 6.2K against 6.0K for dense: results/2026-12-02_stdlib_shape_ladder), where
4 x 256 would cost twice that.
"""
base = ["configs/quickstart.py"]
common = {"n_layer": 4, "n_embd": 128, "max_iters": 5000, "warmup_iters": 100, "eval_interval": 250,
          "eval_iters": 20, "log_interval": 50, "router_lambda_ramp": 500}
seeds = [1, 2, 3]
runs = {
    "LLLG": {"schedule": "LLLG"},
    # the noise floor at depth: LLLG from the same init on another data order
    "LLLG_other_data": {"schedule": "LLLG", "data_order": 1},
    "local": {"schedule": "L"},
    "dense": {"schedule": "G"},
    "LGLL": {"schedule": "LGLL"},
    "LGLG": {"schedule": "LGLG"},
    # one head of the last layer always global over local layers: the 2-layer grid's LR_one_global_head at depth
    "LLLR_one_global_head": {"schedule": "LLLR", "routing": "random",
                             "random_global_q": [0.0, 0.0, 0.0, [1.0, 0.0, 0.0, 0.0]]},
    "routed_at_LLLG": {"schedule": "R", "router_target_global": 0.25},
    "routed_per_head_at_LLLG": {"schedule": "R", "router_per_token": False, "router_target_global": 0.25},
    # the routing issue's mechanisms (docs/training.md, "Which routing mechanism to use"): a budget of 4 heads
    # (LLLG's cost) committed by step 1000, and of one head committed by step 200 (the recommended one)
    "routed_head_budget_at_LLLG_deadline": {"schedule": "R", "router_per_token": False, "router_global_heads": 4,
                                            "router_lambda": 0.0, "router_commit_after": 250,
                                            "router_commit_by_iter": 1000},
    "routed_head_budget_one_head_early_deadline": {"schedule": "R", "router_per_token": False,
                                                   "router_global_heads": 1, "router_lambda": 0.0,
                                                   "router_lambda_ramp": 0, "router_commit_after": 100,
                                                   "router_commit_by_iter": 200},
}
comparisons = {
    "dense vs local": ("dense", "local"),
    "LLLG vs local": ("LLLG", "local"),
    "LLLG vs dense": ("LLLG", "dense"),
    "the noise floor: LLLG on another data order vs LLLG, same init": ("LLLG_other_data", "LLLG"),
    "where the global layer goes: LGLL vs LLLG": ("LGLL", "LLLG"),
    "two global layers interleaved vs one last: LGLG vs LLLG": ("LGLG", "LLLG"),
    "one fixed global head vs LLLG": ("LLLR_one_global_head", "LLLG"),
    "at LLLG's cost, learned per-token routing vs LLLG": ("routed_at_LLLG", "LLLG"),
    "at LLLG's cost, per-head vs per-token routers": ("routed_per_head_at_LLLG", "routed_at_LLLG"),
    "at LLLG's cost, a budget of 4 heads committed by step 1000 vs LLLG": ("routed_head_budget_at_LLLG_deadline",
                                                                         "LLLG"),
    "a budget of one head committed by step 200 vs the fixed global head": (
        "routed_head_budget_one_head_early_deadline", "LLLR_one_global_head"),
}
headline = {"reference": "LLLG", "noise_floor": "LLLG_other_data", "runs": {
    "dense": "dense attention in all 4 layers",
    "local": "window 32 in all 4 layers",
    "LLLG": "three local layers, dense last",
    "LLLG_other_data": "LLLG again on another data order, same init (the noise floor)",
    "LGLL": "the dense layer second",
    "LGLG": "local and dense interleaved (half of dense's cost)",
    "LLLR_one_global_head": "three local layers; one always-global head in the last",
    "routed_at_LLLG": "learned per-token routing, every layer, at LLLG's cost (a quarter of the decisions global)",
    "routed_per_head_at_LLLG": "learned per-head routing at LLLG's cost",
    "routed_head_budget_at_LLLG_deadline": "learned per-head routing, a budget of 4 heads, committed by step 1000",
    "routed_head_budget_one_head_early_deadline": "learned per-head routing, a budget of one head, every head "
                                                  "committed by step 200",
}}
evaluate = {"eval_tokens": 65536, "key_window": 32}
