# A small routed (All-or-Here) model on the embedded Python-stdlib corpus; 5 minutes on a 2-core CPU with bf16
# (results/2026-12-02_cpu_bf16_speed), 6.4 in fp32.
# python data/python_stdlib/prepare.py && python train.py configs/quickstart.py
out_dir = "out/quickstart"
dataset = "python_stdlib"
schedule = "R"          # routed everywhere; try "L" (local only) or "G" (dense) for the baselines
n_layer = 4
n_head = 4
n_embd = 128
block_size = 1024
window = 32
batch_size = 4
max_iters = 750
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 50
router_lambda = 0.01
router_lambda_ramp = 200
routed_mode = "exact"
eval_interval = 250
eval_iters = 20
