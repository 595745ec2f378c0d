"""Which device and dtype a run uses, from the config's 'auto' or an explicit name."""
from contextlib import nullcontext

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name):
    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def pick_dtype(name, device):
    """'auto': bf16 on CUDA GPUs that have it, else fp32."""
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}: use 'auto' or one of {', '.join(DTYPES)}")
    return DTYPES[name]


def autocast_context(device, dtype):
    """Mixed precision for 16-bit dtypes; nothing for fp32."""
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    return nullcontext() if dtype == torch.float32 else torch.autocast(device_type, dtype=dtype)
