"""The rows of the stdlib comparison grids (stdlib_bytes.py, stdlib_bpe.py), written once; a module, not a grid
(the leading _): each grid file calls comparison_runs with its number of steps and takes COMPARISONS, the pairs
of rows the grid's questions are answered by (val loss of the first minus the other's at the same seed).

At 6 layers LLLG repeats to LLLGLL: one global layer like LLLLLG (layer 3 against layer 5), so both cost 1/6 of
the global attention, and the budget-targeted routed runs aim at 1/2 (LG) and 1/6 (LLLG, LLLLLG).
"""


def comparison_runs(steps, core_seeds):
    """name -> overrides. steps: a run from scratch; fine-tuned runs train steps // 2 dense, then steps // 2
    routed. core_seeds: the seeds of the rows the conclusions rest on (the others take the grid's seeds)."""
    half = steps // 2
    return {
        "dense": {"schedule": "G", "seeds": core_seeds},
        "local": {"schedule": "L", "seeds": core_seeds},
        "LG": {"schedule": "LG"},
        "LLLG": {"schedule": "LLLG", "seeds": core_seeds},
        "LLLLLG": {"schedule": "LLLLLG"},
        "routed": {"schedule": "R", "router_lambda": 0.01, "seeds": core_seeds},
        "routed_l003": {"schedule": "R", "router_lambda": 0.003},
        "routed_l03": {"schedule": "R", "router_lambda": 0.03},
        "random_matched": {"schedule": "R", "routing": "random", "random_global_q": "matched:routed",
                           "seeds": core_seeds},
        "routed_at_LG": {"schedule": "R", "router_target_global": 0.5},
        "routed_at_LLLG": {"schedule": "R", "router_target_global": 1 / 6, "seeds": core_seeds},
        # the shared target lets the last layers close (stdlib_bytes: 0% from layer 3 on); does holding every
        # layer at 1/6 do better at the same cost?
        "routed_at_LLLG_per_layer": {"schedule": "R", "router_target_global": 1 / 6, "router_target_per_layer": True},
        "routed_sparse": {"schedule": "R", "routed_mode": "sparse", "sparse_from_iter": half, "p_dense": 0.1},
        "routed_sparse_target": {"schedule": "R", "routed_mode": "sparse", "sparse_from_iter": half,
                                 "p_dense": 0.1, "router_target_global": 1 / 6, "router_target_per_layer": True},
        "dense_half": {"schedule": "G", "max_iters": half},
        "finetuned": {"schedule": "R", "init_from": "run:dense_half", "max_iters": half},
        "finetuned_routers": {"schedule": "R", "init_from": "run:dense_half", "max_iters": half,
                              "trainable": "router"},
        "routed_w16": {"schedule": "R", "window": 16},
        "local_w16": {"schedule": "L", "window": 16},  # is routed_w16's gain the window's or the routing's?
        "routed_w64": {"schedule": "R", "window": 64},
        "routed_w128": {"schedule": "R", "window": 128},
    }


COMPARISONS = {
    "learned routing vs local": ("routed", "local"),
    "learned routing vs dense": ("routed", "dense"),
    "learned vs random routing, same per-layer rates": ("routed", "random_matched"),
    "at LG's attention cost: learned vs LG": ("routed_at_LG", "LG"),
    "at LLLG's attention cost: learned vs LLLG": ("routed_at_LLLG", "LLLG"),
    "at LLLG's attention cost: learned vs LLLLLG": ("routed_at_LLLG", "LLLLLG"),
    "... with a per-layer target, vs LLLG": ("routed_at_LLLG_per_layer", "LLLG"),
    "at w = 16: learned routing vs local": ("routed_w16", "local_w16"),
    "fine-tuned vs from scratch, equal tokens": ("finetuned", "routed"),
    "only the routers trained vs their dense start": ("finetuned_routers", "dense_half"),
    "sparse-mode vs exact-mode training": ("routed_sparse", "routed"),
    "... with a per-layer target": ("routed_sparse_target", "routed"),
}
