# Local-only attention on the budget of configs/recall.py:
# python train.py configs/recall.py configs/recall_local.py
_base = "configs/recall.py"  # an overlay: python train.py configs/recall.py configs/recall_local.py
out_dir = "out/recall_local"
schedule = "L"
