"""The comparison where long context pays: at the budget where the learning curves (grid stdlib_curves, record
results/2026-12-03_stdlib_curves) have dense ahead of local on key tokens and on all tokens at both seeds, does
learned routing follow dense, and does it beat the fixed schedules, random routing and fine-tuning at equal
attention cost? Where it does not, what does it miss (GL and LR: is LG's lead its local first layer; router
changes at LG's cost; a per-head router), and what does a wider window buy instead (local at w = 8 to 128)?

Shape and data of the curves grid: stdlib bytes, 2 layers x 256 (4 heads of 64), T = 1024, w = 32, bf16 on the
CPU; 5000 steps of 4 x 1024 tokens (20.5M tokens a run), cosine from 1e-3 to 1e-4 over the run; fine-tuning is
2500 dense steps, then 2500 routed steps on a new schedule. Every run evaluates every 250 steps (runs trained
since results/2026-12-04_stdlib_live_5 also run the repeat probe there), so the record also has every row's
learning curve. At two layers the fixed schedules with one global layer are LG and GL (LLLG and LLLLLG repeat
to LL, local); routing at LG's attention cost aims at half of the routed decisions global.

    python data/python_stdlib/prepare.py
    python compare.py configs/grids/stdlib_live.py [--from_record=results/<date>_stdlib_live]

Budget (measured, two runs side by side on the 2-core CPU, one thread each): about 35 minutes a run for local,
40 for LG, 45 for LR, 52-55 for dense and the routed rows, 17-25 for each half of a fine-tuning row; the whole
plan is about 25 process-hours, so it grows by session: each session's record keeps its finished runs
(docs/grids.md, "A grid over several sessions") and the next continues from it with --from_record. Seed lists
below say what has run; seeds still to run are in "next:" comments. Seed 1 of the first five rows ran before
records kept run files: later records carry its numbers from rows.json, and random_matched, whose rates come
from routed's evaluation file, runs at seeds 2 and 3.
"""
base = ["configs/quickstart.py"]
_MAX_ITERS = 5000
common = {"n_layer": 2, "n_embd": 256, "max_iters": _MAX_ITERS, "warmup_iters": 100, "eval_interval": 250,
          "eval_iters": 20, "log_interval": 50, "router_lambda_ramp": 500}
seeds = [1]
_core = [1, 2, 3]
_half = _MAX_ITERS // 2
runs = {
    "dense": {"schedule": "G", "seeds": [1, 2, 3, 4, 5]},
    "local": {"schedule": "L", "seeds": [1, 2, 3]},
    "LG": {"schedule": "LG", "seeds": [1, 2, 3, 4, 5]},
    "routed": {"schedule": "R", "router_lambda": 0.01, "seeds": [1, 2, 3]},
    # fine-tuning at equal total tokens: half the steps dense, then half routed (all weights, or the routers only)
    "dense_half": {"schedule": "G", "max_iters": _half, "seeds": _core},
    "finetuned": {"schedule": "R", "init_from": "run:dense_half", "max_iters": _half, "seeds": _core},
    "finetuned_routers": {"schedule": "R", "init_from": "run:dense_half", "max_iters": _half,
                          "trainable": "router", "seeds": _core},
    "routed_at_LG": {"schedule": "R", "router_target_global": 0.5, "seeds": _core},
    "GL": {"schedule": "GL", "seeds": [2]},  # next: [1, 2, 3]
    "LR": {"schedule": "LR", "router_lambda": 0.01, "seeds": [1, 2, 3]},
    # the fixed counterpart of LR's routers: one head of layer 1 always global, the rest local
    "LR_one_global_head": {"schedule": "LR", "routing": "random", "random_global_q": [0.0, [1.0, 0.0, 0.0, 0.0]],
                           "seeds": [1, 2]},
    "routed_at_LG_init_local": {"schedule": "R", "router_target_global": 0.5, "router_init_bias": -3.0,
                                "seeds": [2]},
    "routed_at_LG_held_local": {"schedule": "R", "router_target_global": 0.5, "router_local_iters": 1000,
                                "seeds": [2]},
    # a learned per-head schedule: one decision per head for every token (router_per_token=False), the
    # improvement LR_one_global_head points to (a fixed global head beat LR's token routing on both seeds)
    "routed_per_head_at_LG": {"schedule": "R", "router_per_token": False, "router_target_global": 0.5,
                              "seeds": _core},
    "LR_per_head": {"schedule": "LR", "router_per_token": False, "router_lambda": 0.01, "seeds": [1, 2]},
    # a learned per-head schedule at the cost of one global head (1 of the 8 head decisions), against
    # LR_one_global_head: does per-head routing find that layout (a local first layer, one copy head) by itself?
    "routed_per_head_one_head": {"schedule": "R", "router_per_token": False, "router_target_global": 0.125,
                                 "seeds": [1, 2]},  # next: seed 3
    # random routing at routed's per-layer rates; seeds 2 and 3 only: the rates come from routed's evaluation file,
    # which seed 1 no longer has
    "random_matched": {"schedule": "R", "routing": "random", "random_global_q": "matched:routed", "seeds": [2, 3]},
    # the window ladder; next: seeds [1, 2, 3] for all four
    "local_w8": {"schedule": "L", "window": 8},
    "local_w16": {"schedule": "L", "window": 16},
    "local_w64": {"schedule": "L", "window": 64, "seeds": [1, 2]},
    "local_w128": {"schedule": "L", "window": 128, "seeds": [1, 2]},
}
comparisons = {
    "dense vs local": ("dense", "local"),
    "LG vs local": ("LG", "local"),
    "learned routing vs local": ("routed", "local"),
    "learned routing vs dense": ("routed", "dense"),
    "at LG's attention cost: learned vs LG": ("routed_at_LG", "LG"),
    "learned vs random routing, same per-layer rates": ("routed", "random_matched"),
    "fine-tuned vs from scratch, equal tokens": ("finetuned", "routed"),
    "only the routers trained vs their dense start": ("finetuned_routers", "dense_half"),
    "dense vs local at w = 128": ("dense", "local_w128"),
    "LG vs local at w = 128": ("LG", "local_w128"),
    "local first layer: LG vs GL": ("LG", "GL"),
    "routing the second layer only vs LG": ("LR", "LG"),
    "LR vs one fixed global head in its routed layer": ("LR", "LR_one_global_head"),
    "at LG's cost, routers start all-local vs all-global": ("routed_at_LG_init_local", "routed_at_LG"),
    "at LG's cost, routers start all-local vs LG": ("routed_at_LG_init_local", "LG"),
    "at LG's cost, routers held local for 1000 steps vs not": ("routed_at_LG_held_local", "routed_at_LG"),
    "at LG's cost, routers held local for 1000 steps vs LG": ("routed_at_LG_held_local", "LG"),
    "at LG's cost, per-head vs per-token routers": ("routed_per_head_at_LG", "routed_at_LG"),
    "at LG's cost, per-head routers vs LG": ("routed_per_head_at_LG", "LG"),
    "LR: per-head vs per-token routers": ("LR_per_head", "LR"),
    "LR with per-head routers vs one fixed global head": ("LR_per_head", "LR_one_global_head"),
    "at one head's cost, learned per-head routing vs one fixed global head":
        ("routed_per_head_one_head", "LR_one_global_head"),
}
evaluate = {"eval_tokens": 65536}
