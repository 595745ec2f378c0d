"""The comparison where long context pays: at the budget where the learning curves (grid stdlib_curves) have
dense ahead of local on key tokens, does learned routing grow what pays there (a copy head above local
previous-token heads), and does it beat the fixed schedules, random routing and fine-tuning at equal attention
cost? Where it does not, what does it miss: the order of the layers (GL, LR), router changes at LG's cost, one
decision per head instead of per token, and one fixed always-global head, the layout per-head routers find.

2 layers x 256 (4 heads of 64) on the stdlib as bytes, T = 1024, w = 32, bf16 on the CPU; 5000 steps of 4 x 1024
tokens (20.5M tokens a run), cosine from 1e-3 to 1e-4 over the run; every run evaluates, and runs the repeat
probe, every 250 steps, so the record has every row's learning and copy curves. Fine-tuning rows train 2500
dense steps, then 2500 steps on a new schedule on the batches that follow (train.py continues the data stream).
Key tokens are labelled beyond a window of 32 for every row (evaluate's key_window). At two layers the fixed
schedules with one global layer are LG and GL; routing at LG's attention cost aims at half of the routed
decisions global, at one head's cost at 1 of the 8 head decisions.

    python data/python_stdlib/prepare.py
    python compare.py configs/grids/stdlib_live.py [--from_record=results/<date>_stdlib_live]

Budget (two runs side by side on a 2-core CPU, one thread each): 35-55 minutes a run (local fastest, dense and
the learned rows slowest), 17-25 for each half of a fine-tuning row; a grid of many process-hours, grown by
seeds and rows with --from_record (docs/grids.md, "A grid over several sessions"). Rows whose outcome is yes or
no (a copy head grew or not) run five seeds.
"""
base = ["configs/quickstart.py"]
_MAX_ITERS = 5000
common = {"n_layer": 2, "n_embd": 256, "max_iters": _MAX_ITERS, "warmup_iters": 100, "eval_interval": 250,
          "eval_iters": 20, "log_interval": 50, "router_lambda_ramp": 500}
seeds = [1, 2, 3]
_five = [1, 2, 3, 4, 5]
_half = _MAX_ITERS // 2
runs = {
    "dense": {"schedule": "G", "seeds": _five},
    "local": {"schedule": "L"},
    "LG": {"schedule": "LG", "seeds": _five},
    # LG again at each seed's init on another data order: how far two equally good rows land at one seed
    "LG_other_data": {"schedule": "LG", "data_order": 1, "seeds": _five},
    "GL": {"schedule": "GL", "seeds": [2]},
    # one head of the second layer always global over a local first layer: the layout per-head routers find
    "LR_one_global_head": {"schedule": "LR", "routing": "random", "random_global_q": [0.0, [1.0, 0.0, 0.0, 0.0]],
                           "seeds": _five},
    "routed": {"schedule": "R", "router_lambda": 0.01},
    "routed_at_LG": {"schedule": "R", "router_target_global": 0.5, "seeds": _five},
    "routed_per_head_at_LG": {"schedule": "R", "router_per_token": False, "router_target_global": 0.5,
                              "seeds": _five},
    "routed_per_head_one_head": {"schedule": "R", "router_per_token": False, "router_target_global": 0.125,
                                 "seeds": _five},
    # routing mechanisms, screened on two seeds at LG's cost: per-head decisions first, per-token from step 2500
    # (after the copy head forms in the per-head runs, about step 1500-2200)
    "routed_heads_then_tokens_at_LG": {"schedule": "R", "router_target_global": 0.5,
                                       "router_token_from_iter": 2500, "seeds": [1, 2]},
    # ... per-token routing inside a budget of 4 heads (LG's cost; five seeds, the per-token mechanism of the
    # screen whose seeds 1-2 both grew a copy head): until step 2000 each router decides per head
    # (token weights held at zero; biases from 1, so the budget's heads are global from the first step and a copy
    # head can grow in one of them), then the budget's heads route their tokens under a target of a quarter of the
    # routed decisions (half of the budget's tokens); the heads outside it, local on every step, commit local
    "routed_head_budget_tokens_at_LG": {"schedule": "R", "router_global_heads": 4, "router_init_bias": 1.0,
                                        "router_token_from_iter": 2000, "router_lambda_start": 2000,
                                        "router_target_global": 0.25, "router_commit_after": 250, "seeds": _five},
    # ... and its per-head phase committed, by a deadline at step 1000, before the budget's global heads are
    # released to route their tokens at step 2000 (without it the budget's places swap until step 2000, and the
    # run was 0.03-0.06 behind the budget of whole heads with commits there on seeds 1-2)
    "routed_head_budget_tokens_at_LG_deadline": {"schedule": "R", "router_global_heads": 4, "router_init_bias": 1.0,
                                                 "router_token_from_iter": 2000, "router_lambda_start": 2000,
                                                 "router_target_global": 0.25, "router_commit_after": 250,
                                                 "router_commit_by_iter": 1000, "router_release_global": True,
                                                 "seeds": [1, 2]},
    # ... and trained in 'sampled' mode (1 of each batch's 4 sequences computes both paths): its budget's heads route
    # per token to the end, which exact mode pays for with both paths on every step
    "routed_head_budget_tokens_at_LG_sampled": {"schedule": "R", "router_global_heads": 4, "router_init_bias": 1.0,
                                                "router_token_from_iter": 2000, "router_lambda_start": 2000,
                                                "router_target_global": 0.25, "router_commit_after": 250,
                                                "routed_mode": "sampled", "routed_exact_frac": 0.25, "seeds": [1, 2]},
    # ... heads commit to their path once their decisions held 250 steps in a row (router_commit_after), at one
    # head's cost (per-head routers) and at LG's (per-token routers)
    "routed_per_head_one_head_commit": {"schedule": "R", "router_per_token": False, "router_target_global": 0.125,
                                        "router_commit_after": 250, "seeds": [1, 2]},
    "routed_at_LG_commit": {"schedule": "R", "router_target_global": 0.5, "router_commit_after": 250,
                            "seeds": [1, 2]},
    # ... a budget of heads instead of a penalty: the k per-head routers of highest bias are global (no lambda;
    # the LM loss alone ranks the heads)
    "routed_head_budget_one_head": {"schedule": "R", "router_per_token": False, "router_global_heads": 1,
                                    "router_lambda": 0.0, "seeds": [1, 2]},
    # ... and with commits, so that a run whose heads committed trains at its layout's cost: at LG's cost (the
    # budget alone, beside per-token routing inside it), and at one head's (five seeds: the best one-head
    # mechanism of the two-seed screen, against LR_one_global_head)
    "routed_head_budget_at_LG_commit": {"schedule": "R", "router_per_token": False, "router_global_heads": 4,
                                        "router_lambda": 0.0, "router_commit_after": 250, "seeds": [1, 2]},
    # ... and a deadline: the heads still undecided at step 1000 (the budget's last places swap among heads the
    # loss pulls alike, results/2026-12-06_router_pull) commit to the path they took most of late, so the run
    # trains at its layout's cost from step 1000 on (five seeds: the LG-cost mechanism of the two-seed screen
    # whose training cost comes nearest its layout's)
    "routed_head_budget_at_LG_deadline": {"schedule": "R", "router_per_token": False, "router_global_heads": 4,
                                          "router_lambda": 0.0, "router_commit_after": 250,
                                          "router_commit_by_iter": 1000, "seeds": _five},
    "routed_head_budget_one_head_commit": {"schedule": "R", "router_per_token": False, "router_global_heads": 1,
                                           "router_lambda": 0.0, "router_commit_after": 250, "seeds": _five},
    # ... and an early deadline: that row's budget had its head in the second layer at step 250, the head it ended
    # with, on the 4 of its 5 seeds whose step-250 decisions are recorded, so every head commits by step 200 (streaks of 100 steps, counted from step 0: no penalty
    # to ramp), and the run computes both paths for 200 of its 5000 steps: its training cost near its layout's
    # (five seeds: on the screen's two it grew the copy head and computed 1.11-1.13x its ideal)
    "routed_head_budget_one_head_early_deadline": {"schedule": "R", "router_per_token": False,
                                                   "router_global_heads": 1, "router_lambda": 0.0,
                                                   "router_lambda_ramp": 0, "router_commit_after": 100,
                                                   "router_commit_by_iter": 200, "seeds": _five},
    # ... and trained in 'sampled' mode: 1 of each batch's 4 sequences computes both paths (the routers' gradient),
    # the others only what their heads decided, so the steps before the heads commit cost less
    "routed_head_budget_one_head_commit_sampled": {"schedule": "R", "router_per_token": False,
                                                   "router_global_heads": 1, "router_lambda": 0.0,
                                                   "router_commit_after": 250, "routed_mode": "sampled",
                                                   "routed_exact_frac": 0.25, "seeds": [1, 2]},
    # diagnosis: per-head routing at one head's cost settles on the fixed row's layout near step 800 yet grows no
    # copy head. Its first 800 steps again (the same schedule and batches), then that layout fixed for the other
    # 4200 steps (random routing at the per-head fractions of its step-800 evaluation, 0 or 1; the learning rate
    # restarts a cosine from its step-800 value): does the fixed layout started late grow one (then flicker lost
    # it), or not (then 800 steps of mixed routing did)?
    "per_head_one_head_first_800": {"schedule": "R", "router_per_token": False, "router_target_global": 0.125,
                                    "max_iters": 800, "lr_decay_iters": _MAX_ITERS, "seeds": [1, 2]},
    "fixed_layout_from_800": {"schedule": "R", "routing": "random",
                              "random_global_q": "matched_heads:per_head_one_head_first_800",
                              "init_from": "run:per_head_one_head_first_800", "max_iters": _MAX_ITERS - 800,
                              "warmup_iters": 0, "learning_rate": 9.55e-4, "seeds": [1, 2]},
    # ... and the control of that control: the fixed row itself stopped at step 800 and restarted the same way
    # (a fresh optimizer from its checkpoint, the learning rate's cosine from its step-800 value): does the restart
    # alone keep a copy head from growing?
    "LR_one_global_head_first_800": {"schedule": "LR", "routing": "random",
                                     "random_global_q": [0.0, [1.0, 0.0, 0.0, 0.0]], "max_iters": 800,
                                     "lr_decay_iters": _MAX_ITERS, "seeds": [1]},
    "LR_one_global_head_from_800": {"schedule": "LR", "routing": "random",
                                    "random_global_q": [0.0, [1.0, 0.0, 0.0, 0.0]],
                                    "init_from": "run:LR_one_global_head_first_800", "max_iters": _MAX_ITERS - 800,
                                    "warmup_iters": 0, "learning_rate": 9.55e-4, "seeds": [1]},
    "LR": {"schedule": "LR", "router_lambda": 0.01},
    "LR_per_head": {"schedule": "LR", "router_per_token": False, "router_lambda": 0.01, "seeds": [1, 2]},
    "routed_at_LG_init_local": {"schedule": "R", "router_target_global": 0.5, "router_init_bias": -3.0,
                                "seeds": [2]},
    "routed_at_LG_held_local": {"schedule": "R", "router_target_global": 0.5, "router_local_iters": 1000,
                                "seeds": [2]},
    # random routing at routed's per-layer rates (from routed's evaluation at the same seed)
    "random_matched": {"schedule": "R", "routing": "random", "random_global_q": "matched:routed", "seeds": [2, 3]},
    # ... and at each head's rate: does learned routing pay by which heads, or by which tokens, go global?
    "random_matched_heads": {"schedule": "R", "routing": "random", "random_global_q": "matched_heads:routed",
                             "seeds": [2, 3]},
    "random_matched_heads_at_LG": {"schedule": "R", "routing": "random",
                                   "random_global_q": "matched_heads:routed_at_LG", "seeds": [2, 3]},
    # fine-tuning at equal total tokens: half the steps dense, then half routed (all weights, or the routers only)
    "dense_first_half": {"schedule": "G", "max_iters": _half},
    "dense_then_routed": {"schedule": "R", "init_from": "run:dense_first_half", "max_iters": _half},
    "dense_then_routers": {"schedule": "R", "init_from": "run:dense_first_half", "max_iters": _half,
                           "trainable": "router"},
}
comparisons = {
    "dense vs local": ("dense", "local"),
    "LG vs local": ("LG", "local"),
    "the noise floor: LG on another data order vs LG, same init": ("LG_other_data", "LG"),
    "learned routing vs local": ("routed", "local"),
    "learned routing vs dense": ("routed", "dense"),
    "at LG's attention cost: learned vs LG": ("routed_at_LG", "LG"),
    "learned vs random routing, same per-layer rates": ("routed", "random_matched"),
    "learned vs random routing, same per-head rates": ("routed", "random_matched_heads"),
    "at LG's cost, learned vs random routing, same per-head rates": ("routed_at_LG", "random_matched_heads_at_LG"),
    "fine-tuned vs from scratch, equal tokens": ("dense_then_routed", "routed"),
    "only the routers trained vs their dense start": ("dense_then_routers", "dense_first_half"),
    "local first layer: LG vs GL": ("LG", "GL"),
    "routing the second layer only vs LG": ("LR", "LG"),
    "LR vs one fixed global head in its routed layer": ("LR", "LR_one_global_head"),
    "at LG's cost, routers start all-local vs all-global": ("routed_at_LG_init_local", "routed_at_LG"),
    "at LG's cost, routers start all-local vs LG": ("routed_at_LG_init_local", "LG"),
    "at LG's cost, routers held local for 1000 steps vs not": ("routed_at_LG_held_local", "routed_at_LG"),
    "at LG's cost, routers held local for 1000 steps vs LG": ("routed_at_LG_held_local", "LG"),
    "at LG's cost, per-head vs per-token routers": ("routed_per_head_at_LG", "routed_at_LG"),
    "at LG's cost, per-head routers vs LG": ("routed_per_head_at_LG", "LG"),
    "at LG's cost, per-head then per-token routers vs LG": ("routed_heads_then_tokens_at_LG", "LG"),
    "at LG's cost, per-head then per-token vs per-token routers": ("routed_heads_then_tokens_at_LG", "routed_at_LG"),
    "at LG's cost, per-token routers whose heads commit vs LG": ("routed_at_LG_commit", "LG"),
    "at LG's cost, a budget of 4 heads whose heads commit vs LG": ("routed_head_budget_at_LG_commit", "LG"),
    "at LG's cost, a budget of 4 heads committed by step 1000 vs LG": ("routed_head_budget_at_LG_deadline", "LG"),
    "a budget of 4 heads: commits by a deadline vs when they held": ("routed_head_budget_at_LG_deadline",
                                                                    "routed_head_budget_at_LG_commit"),
    "per-token routing inside a budget of 4 heads vs LG": ("routed_head_budget_tokens_at_LG", "LG"),
    "per-token routing inside a budget of 4 heads committed first vs LG": ("routed_head_budget_tokens_at_LG_deadline",
                                                                           "LG"),
    "per-token routing inside a budget of 4 heads: its heads committed first or not": (
        "routed_head_budget_tokens_at_LG_deadline", "routed_head_budget_tokens_at_LG"),
    "per-token routing inside a budget of 4 heads: sampled vs exact mode": ("routed_head_budget_tokens_at_LG_sampled",
                                                                           "routed_head_budget_tokens_at_LG"),
    "per-token routing inside a budget of 4 heads vs the budget alone": ("routed_head_budget_tokens_at_LG",
                                                                        "routed_head_budget_at_LG_commit"),
    "at one head's cost, per-head routers whose heads commit vs one fixed global head":
        ("routed_per_head_one_head_commit", "LR_one_global_head"),
    "at one head's cost, a budget of one head vs one fixed global head":
        ("routed_head_budget_one_head", "LR_one_global_head"),
    "at one head's cost, a budget of one head whose heads commit vs one fixed global head":
        ("routed_head_budget_one_head_commit", "LR_one_global_head"),
    "at one head's cost, a budget of one head committed by step 200 vs one fixed global head":
        ("routed_head_budget_one_head_early_deadline", "LR_one_global_head"),
    "a budget of one head: committed by step 200 vs when its heads held 250 steps":
        ("routed_head_budget_one_head_early_deadline", "routed_head_budget_one_head_commit"),
    "a budget of one head: heads that commit vs not": ("routed_head_budget_one_head_commit",
                                                       "routed_head_budget_one_head"),
    "a budget of one head whose heads commit: sampled vs exact mode": ("routed_head_budget_one_head_commit_sampled",
                                                                     "routed_head_budget_one_head_commit"),
    "a budget of one head whose heads commit, sampled mode, vs one fixed global head":
        ("routed_head_budget_one_head_commit_sampled", "LR_one_global_head"),
    "LR: per-head vs per-token routers": ("LR_per_head", "LR"),
    "LR with per-head routers vs one fixed global head": ("LR_per_head", "LR_one_global_head"),
    "at one head's cost, learned per-head routing vs one fixed global head":
        ("routed_per_head_one_head", "LR_one_global_head"),
    "the layout per-head routing found, fixed from step 800, vs fixed from the start":
        ("fixed_layout_from_800", "LR_one_global_head"),
    "the layout per-head routing found, fixed from step 800, vs learned throughout":
        ("fixed_layout_from_800", "routed_per_head_one_head"),
    "one fixed global head, restarted at step 800 as the diagnosis is, vs not restarted":
        ("LR_one_global_head_from_800", "LR_one_global_head"),
}
headline = {"reference": "LG", "runs": {
    "dense": "dense attention in both layers",
    "local": "window 32 in both layers",
    "LG": "local first layer, dense second",
    "LG_other_data": "LG again on another data order, same init (the noise floor)",
    "LR_one_global_head": "local first layer; one always-global head in the second",
    "routed_at_LG": "learned per-token routing, every layer, at LG's cost (half the decisions global)",
    "routed_per_head_at_LG": "learned per-head routing (one decision per head), at LG's cost",
    "routed_per_head_one_head": "learned per-head routing at one head's cost (1 of 8 decisions global)",
    "routed_head_budget_one_head": "learned per-head routing, a budget of one head: the head of highest router "
                                   "bias is global (no penalty)",
    "routed_head_budget_one_head_commit": "the same, and heads whose decisions held 250 steps commit to their path",
    "routed_head_budget_one_head_early_deadline": "the same, heads committing after 100 held steps, every head by "
                                                  "step 200",
    "routed_head_budget_at_LG_deadline": "learned per-head routing, a budget of 4 heads (LG's cost); heads commit "
                                         "when held 250 steps, or by step 1000",
    "routed_head_budget_tokens_at_LG": "learned per-token routing inside a budget of 4 heads (per-head decisions "
                                       "until step 2000), a quarter of the decisions global; heads commit",
    "dense_then_routed": "2500 dense steps, then 2500 routed (lambda 0.01) on the next batches",
}, "noise_floor": "LG_other_data"}
evaluate = {"eval_tokens": 65536, "key_window": 32}
