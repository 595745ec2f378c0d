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


# dense bf16 / fp16 tensor-core peaks per GPU (vendor datasheets, without sparsity), for MFU
PEAK_FLOPS_16BIT = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12,
                    "RTX 4090": 165e12, "RTX 3090": 71e12}


def peak_flops(device, dtype):
    """The device's 16-bit peak FLOP/s if it is a GPU named above and dtype is 16-bit, else None (no MFU)."""
    if not device.startswith("cuda") or dtype not in (torch.bfloat16, torch.float16):
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS_16BIT.items() if key in name), None)


def autocast_context(device, dtype):
    """Mixed precision for 16-bit dtypes; nothing for fp32."""
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    return nullcontext() if dtype == torch.float32 else torch.autocast(device_type, dtype=dtype)
