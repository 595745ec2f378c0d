# Associative recall (data/synthetic) at T = 512, w = 32, 16 pairs: the routed (AHA) model with the anti-collapse recipe of results/recall.md.
# python data/synthetic/prepare.py --task=recall --block_size=512 --window=32 --n_pairs=16 --out_dir=data/recall
# python train.py configs/recall_routed.py && python eval_routing.py --out_dir=out/recall_routed --data_dir=data/recall
# configs/recall_dense.py and configs/recall_local.py differ from this file only in the routing keys at the end.
out_dir = "out/recall_routed"
dataset = "recall"
n_layer = 4
n_head = 4
n_embd = 128
block_size = 512
window = 32
vocab_size = 144
batch_size = 8
max_iters = 1000
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 50
eval_interval = 200
eval_iters = 8
routed_mode = "exact"
# routing keys
schedule = "R"
router_init_bias = 2.0      # p = 0.88: every head starts clearly global, not on the 0.5 threshold
router_lambda = 0.01
router_lambda_start = 300   # no penalty while the model learns recall with full attention ...
router_lambda_ramp = 300    # ... then a slow ramp
router_budget = 0.03        # no push below a mean router probability of 3% (answer tokens: 16 / 512 = 3.1%)
p_dense = 0.1               # 10% of steps all-global: the full-attention path keeps learning
