# Routing fine-tuned onto the dense GPT-2 small run (configs/gpt2_small.py): routers added to every layer,
# everything trains for 2,000 more steps (1B tokens) at a lower learning rate.
#   torchrun --standalone --nproc_per_node=8 train.py configs/gpt2_small.py configs/gpt2_small_routed_finetune.py
_base = "configs/gpt2_small.py"
out_dir = "out/gpt2_small_routed_finetune"
init_from = "out/gpt2_small/ckpt.pt"
schedule = "R"
routed_mode = "exact"
max_iters = 2000
learning_rate = 1e-4
min_lr = 1e-5
warmup_iters = 100
router_lambda = 3e-4
router_lambda_ramp = 500
