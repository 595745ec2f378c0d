# The routed (AHA) model with the anti-collapse recipe (results/2026-11-29_recall_recipe_search), on the budget of
# configs/recall.py:
# python train.py configs/recall.py configs/recall_routed.py
_base = "configs/recall.py"  # an overlay: python train.py configs/recall.py configs/recall_routed.py
out_dir = "out/recall_routed"
schedule = "R"
router_init_bias = 2.0      # p = 0.88: every head starts clearly global, not on the 0.5 threshold
router_lambda = 0.01
router_lambda_start = 300   # no penalty while the model learns recall with full attention ...
router_lambda_ramp = 300    # ... then a slow ramp
router_budget = 0.01        # no push on a layer whose mean router probability is below 1% (answers: 4 / 512 = 0.8%)
p_dense = 0.1               # 10% of steps all-global: the full-attention path keeps learning
