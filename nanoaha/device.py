"""Which device and dtype a run uses, from the config's 'auto' or an explicit name."""
import platform
import sys
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


# x86 CPU flags of native bf16 arithmetic (AVX-512 BF16, AMX): with them bf16 matmuls run 2.3-2.5x faster than
# fp32 (results/2026-12-02_cpu_bf16_step_profile); without them bf16 is not computed natively: no gain expected
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpuinfo_field(cpuinfo, key):
    """The value of the first 'key : value' line of /proc/cpuinfo's text ('flags', 'model name'), or None."""
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            return value.strip()
    return None


def cpu_bf16_flag(cpuinfo):
    """The first of CPU_BF16_FLAGS on the 'flags' line of /proc/cpuinfo's text, or None."""
    flags = set((cpuinfo_field(cpuinfo, "flags") or "").split())
    return next((flag for flag in CPU_BF16_FLAGS if flag in flags), None)


def read_cpuinfo():
    """/proc/cpuinfo's text on Linux x86; '' elsewhere or when it cannot be read (then no bf16 is detected)."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "i386", "i686"):
        return ""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def auto_dtype(device):
    """(dtype, why) for dtype='auto': bf16 on CUDA GPUs that have it and on CPUs with native bf16 arithmetic,
    else fp32."""
    if device.startswith("cuda"):
        return (torch.bfloat16, "CUDA GPU with bf16") if torch.cuda.is_bf16_supported() else \
            (torch.float32, "no bf16 on this GPU")
    if device.split(":")[0] == "cpu":
        flag = cpu_bf16_flag(read_cpuinfo())
        return (torch.bfloat16, f"CPU has {flag}") if flag else (torch.float32, "no native bf16 on this CPU")
    return torch.float32, f"{device} runs fp32"


def pick_dtype(name, device):
    """The torch dtype of a config's dtype name on device ('auto': auto_dtype's pick)."""
    if name == "auto":
        return auto_dtype(device)[0]
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}: use 'auto' or one of {', '.join(DTYPES)}")
    return DTYPES[name]


def dtype_label(name, device, dtype=None):
    """The dtype as a run's first line names it: 'bfloat16 (auto: CPU has avx512_bf16)', or 'float32' when named.
    dtype: what the run uses, when that is not auto's pick (a resumed run keeps its checkpoint's)."""
    if name != "auto":
        return name
    picked, why = auto_dtype(device)
    if dtype is not None and dtype != picked:
        return f"{dtype_name(dtype)} (auto: the checkpoint's; this machine would pick {dtype_name(picked)})"
    return f"{dtype_name(picked)} (auto: {why})"


def dtype_name(dtype):
    """torch.bfloat16 -> 'bfloat16', the name a config gives it."""
    return str(dtype).removeprefix("torch.")


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
