# Routing fine-tuned onto the dense model of configs/recall.py (results/2026-11-29_recall_lambda1_finetune).
# Every weight learns, the routers start at p = 0.5 (all global, as in L2A), and lambda is 100x the
# from-scratch recipe's, which is too weak to close the heads of a trained model:
# python train.py configs/recall.py && python train.py configs/recall.py configs/recall_finetune.py
_base = "configs/recall.py"  # an overlay: python train.py configs/recall.py configs/recall_finetune.py
out_dir = "out/recall_finetune"
init_from = "out/recall_dense/ckpt.pt"
schedule = "R"
router_init_bias = 0.0
router_lambda = 1.0
router_lambda_start = 0
router_lambda_ramp = 100
router_budget = 0.01
p_dense = 0.1
max_iters = 2000
learning_rate = 1e-3
min_lr = 1e-3
warmup_iters = 0
eval_interval = 250
