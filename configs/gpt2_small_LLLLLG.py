# GPT-2 small with the fixed schedule LLLLLG (every sixth layer dense, the rest a 256-token window + 4 sinks).
#   torchrun --standalone --nproc_per_node=8 train.py configs/gpt2_small.py configs/gpt2_small_LLLLLG.py
_base = "configs/gpt2_small.py"
out_dir = "out/gpt2_small_LLLLLG"
schedule = "LLLLLG"
