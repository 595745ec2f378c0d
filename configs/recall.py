# Associative recall (data/synthetic) at T = 512, w = 32, 4 key-value pairs and 4 queries per example: the
# budget shared by the recall records in results/, and on its own the dense baseline. The local and routed runs
# add one small config file:
# python data/synthetic/prepare.py --task=recall --block_size=512 --window=32 --n_pairs=4 --n_queries=4 --out_dir=data/recall
# python train.py configs/recall.py && python evaluate.py out/recall_dense --data_dir=data/recall
# python train.py configs/recall.py configs/recall_local.py     (then python evaluate.py out/recall_local)
# python train.py configs/recall.py configs/recall_routed.py    (then python evaluate.py out/recall_routed)
out_dir = "out/recall_dense"
dataset = "recall"
n_layer = 4
n_head = 4
n_embd = 128
block_size = 512
window = 32
vocab_size = 144
batch_size = 8
max_iters = 4000
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 50
eval_interval = 500
eval_iters = 8
routed_mode = "exact"
schedule = "G"
