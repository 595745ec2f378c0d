"""The live comparison on English prose: does what pays on the stdlib (a copy head above local previous-token
heads; LG and one fixed global head ahead of dense) hold on running English text, and does learned routing find
it there? The 2-layer live grid's core rows (grid stdlib_live) and its two committed budgets of heads on the
English manuals corpus (data/english_docs: Debian's HTML manuals as bytes; 9.1% of its val bytes are key tokens
at window 32, against 18.7% on the stdlib: record results/2026-12-06_english_docs_corpus), at the stdlib's
budget.

2 layers x 256 (4 heads of 64), T = 1024, w = 32, bf16 on the CPU; 5000 steps of 4 x 1024 tokens (20.5M tokens a
run, about 1.6 epochs of the corpus' 13.2M train tokens), cosine from 1e-3 to 1e-4; every run evaluates and
probes every 250 steps, so each run's key-token curve is the learning curve that says whether dense pulls
ahead of local on key tokens within this budget (on the stdlib it did from about 8M tokens: record
results/2026-12-03_stdlib_curves). Key tokens are labelled beyond a window of 32 for every row.

    sudo apt-get install debian-handbook debian-reference-en python3.11-doc postgresql-doc-15
    python data/english_docs/prepare.py
    python compare.py configs/grids/english_live.py [--from_record=results/<date>_english_live]

Budget: 12 rows x 2 seeds and seeds 3-5 of four rows (36 trainings), 30-55 minutes a run two at a time on the
2-core CPU (20-25 for the budget committed by step 200; about 16 hours of training processes).
"""
base = ["configs/quickstart.py"]
common = {"data_dir": "data/english_docs", "n_layer": 2, "n_embd": 256, "max_iters": 5000, "warmup_iters": 100,
          "eval_interval": 250, "eval_iters": 20, "log_interval": 50, "router_lambda_ramp": 500}
seeds = [1, 2]
runs = {
    "dense": {"schedule": "G"},
    "local": {"schedule": "L"},
    # five seeds for the rows that judge the 4-head budget, whose copy-head outcome split on seeds 1-2
    "LG": {"schedule": "LG", "seeds": [1, 2, 3, 4, 5]},
    # the noise floor on this corpus: LG from the same init on another data order
    "LG_other_data": {"schedule": "LG", "data_order": 1, "seeds": [1, 2, 3, 4, 5]},
    "GL": {"schedule": "GL"},
    "LR_one_global_head": {"schedule": "LR", "routing": "random", "random_global_q": [0.0, [1.0, 0.0, 0.0, 0.0]]},
    "routed_at_LG": {"schedule": "R", "router_target_global": 0.5},
    "routed_per_head_at_LG": {"schedule": "R", "router_per_token": False, "router_target_global": 0.5},
    # the routing issue's mechanisms (docs/training.md, "Which routing mechanism to use"): a budget of one head with
    # commits, the same committed by step 200 (the recommended one on the stdlib), and of 4 heads (LG's cost)
    # committed by a deadline
    "routed_head_budget_one_head_commit": {"schedule": "R", "router_per_token": False, "router_global_heads": 1,
                                           "router_lambda": 0.0, "router_commit_after": 250},
    "routed_head_budget_one_head_early_deadline": {"schedule": "R", "router_per_token": False,
                                                   "router_global_heads": 1, "router_lambda": 0.0,
                                                   "router_lambda_ramp": 0, "router_commit_after": 100,
                                                   "router_commit_by_iter": 200},
    "routed_head_budget_at_LG_deadline": {"schedule": "R", "router_per_token": False, "router_global_heads": 4,
                                          "router_lambda": 0.0, "router_commit_after": 250,
                                          "router_commit_by_iter": 1000, "seeds": [1, 2, 3, 4, 5]},
    # the 4-head budget beat LG on seeds 1-2 with two global heads in each layer: is it the layout or learning it?
    # That seed's final layout fixed from step 0 (random routing at its per-head fractions, each 0 or 1); seeds 3-5
    # too, where its layouts were 1+3, 3+1 and 2+2 global heads
    "fixed_budget_layout": {"schedule": "R", "routing": "random",
                            "random_global_q": "matched_heads:routed_head_budget_at_LG_deadline",
                            "seeds": [1, 2, 3, 4, 5]},
}
comparisons = {
    "dense vs local": ("dense", "local"),
    "LG vs local": ("LG", "local"),
    "LG vs dense": ("LG", "dense"),
    "the noise floor: LG on another data order vs LG, same init": ("LG_other_data", "LG"),
    "local first layer: LG vs GL": ("LG", "GL"),
    "one fixed global head vs LG": ("LR_one_global_head", "LG"),
    "at LG's cost, learned per-token routing vs LG": ("routed_at_LG", "LG"),
    "at LG's cost, per-head vs per-token routers": ("routed_per_head_at_LG", "routed_at_LG"),
    "a budget of one head with commits vs the fixed global head": ("routed_head_budget_one_head_commit",
                                                                   "LR_one_global_head"),
    "a budget of one head committed by step 200 vs the fixed global head": (
        "routed_head_budget_one_head_early_deadline", "LR_one_global_head"),
    "at LG's cost, a budget of 4 heads committed by step 1000 vs LG": ("routed_head_budget_at_LG_deadline", "LG"),
    "the budget's final layout fixed from step 0 vs LG": ("fixed_budget_layout", "LG"),
    "the 4-head budget vs its own final layout fixed from step 0": ("routed_head_budget_at_LG_deadline",
                                                                    "fixed_budget_layout"),
}
headline = {"reference": "LG", "noise_floor": "LG_other_data", "runs": {
    "dense": "dense attention in both layers",
    "local": "window 32 in both layers",
    "LG": "local first layer, dense second",
    "LG_other_data": "LG again on another data order, same init (the noise floor)",
    "GL": "dense first layer, local second",
    "LR_one_global_head": "local first layer; one always-global head in the second",
    "routed_at_LG": "learned per-token routing, every layer, at LG's cost",
    "routed_per_head_at_LG": "learned per-head routing at LG's cost",
    "routed_head_budget_one_head_commit": "learned per-head routing, a budget of one head, heads commit",
    "routed_head_budget_one_head_early_deadline": "the same, every head committed by step 200",
    "routed_head_budget_at_LG_deadline": "learned per-head routing, a budget of 4 heads, committed by step 1000",
    "fixed_budget_layout": "the 4-head budget's final heads (same seed) fixed from step 0",
}}
evaluate = {"eval_tokens": 65536, "key_window": 32}
