"""Attention for nanoAHA. The entry point is kernels.attention.attention; the tiers behind it:
reference.py (explicit masks), torch_attention.py (efficient PyTorch, any device), triton_attention.py (Triton
kernels: triton_local.py, triton_global.py, triton_common.py). gates.py holds what all of them do with the gate."""
