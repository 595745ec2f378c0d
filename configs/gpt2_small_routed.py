# GPT-2 small with every layer routed (All-or-Here), from scratch: the recipe this project recommends, exact
# mode (full and window attention for every token while training) with the L1 penalty at AHA's lambda 3e-4,
# ramped in after warmup.
#   torchrun --standalone --nproc_per_node=8 train.py configs/gpt2_small.py configs/gpt2_small_routed.py
_base = "configs/gpt2_small.py"
out_dir = "out/gpt2_small_routed"
schedule = "R"
routed_mode = "exact"
router_lambda = 3e-4
router_lambda_start = 700
router_lambda_ramp = 2000
