# GPT-2 small (124M: 12 layers, 12 heads, 768 wide), dense, from scratch on FineWeb-Edu (GPT-2 BPE) at T = 4096:
# the baseline the routed and fixed-schedule runs below compare against. For GPUs; not run by this project yet.
#   python data/fineweb_edu/prepare.py --max_tokens=10_000_000_000 --num_proc=16
#   torchrun --standalone --nproc_per_node=8 train.py configs/gpt2_small.py
#   python train.py configs/gpt2_small.py --grad_accum=8       # one GPU, the same global batch
# 8 x 16 x 4096 = 524,288 tokens per step; 19,073 steps = 10B tokens.
out_dir = "out/gpt2_small"
dataset = "fineweb_edu"
vocab_size = 50304      # GPT-2's 50,257 padded to a multiple of 64
schedule = "G"
n_layer = 12
n_head = 12
n_embd = 768
block_size = 4096
window = 256            # used by the L and R layers of the overlays
n_sink = 4
batch_size = 16         # per GPU
grad_accum = 1
max_iters = 19073
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 700
weight_decay = 0.1
grad_clip = 1.0
dtype = "bfloat16"
compile = True
attention_backend = "auto"   # Triton kernels on CUDA
eval_interval = 1000
eval_iters = 50
log_interval = 10
