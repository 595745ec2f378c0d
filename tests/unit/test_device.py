"""dtype='auto': bf16 on CPUs whose /proc/cpuinfo flags say they compute in bf16 natively, fp32 on the others;
an explicit dtype wins; the run's first line says what auto picked and why (the run is set up, not trained)."""
import pytest
import torch

import train
from helpers import tiny_train_configs
from nanoaha import device

# /proc/cpuinfo as Linux writes it on x86 (shortened): a block per core, the flags on one line; newer kernels
# add a 'vmx flags' line, which is not the CPU's flags
AMD_BF16 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu vme de pse avx2 avx512f avx512bw avx512_bf16 avx512_vnni
bugs\t\t: sysret_ss_attrs
"""
INTEL_AMX = "model name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n"
NO_BF16 = """model name\t: Intel(R) Xeon(R) CPU E5-2686 v4 @ 2.30GHz
flags\t\t: fpu vme avx avx2 avx512f avx512bw
vmx flags\t: vnmi avx512_bf16
"""
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize("cpuinfo, flag", [(AMD_BF16, "avx512_bf16"), (INTEL_AMX, "amx_bf16"), (NO_BF16, None),
                                           (ARM, None), ("", None)])
def test_native_bf16_is_read_from_the_flags_line(cpuinfo, flag):
    assert device.cpu_bf16_flag(cpuinfo) == flag


def test_a_cpuinfo_field_is_the_first_line_with_that_key():
    assert device.cpuinfo_field(AMD_BF16, "model name") == "AMD EPYC 9R14 96-Core Processor"
    assert device.cpuinfo_field(NO_BF16, "flags") == "fpu vme avx avx2 avx512f avx512bw"  # not 'vmx flags'
    assert device.cpuinfo_field(ARM, "model name") is None


def test_cpuinfo_is_read_only_on_linux_x86_and_a_failed_read_is_no_bf16(monkeypatch):
    monkeypatch.setattr(device.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(device.sys, "platform", "darwin")
    assert device.read_cpuinfo() == ""
    monkeypatch.setattr(device.sys, "platform", "linux")
    monkeypatch.setattr(device.platform, "machine", lambda: "aarch64")
    assert device.read_cpuinfo() == ""
    monkeypatch.setattr(device.platform, "machine", lambda: "x86_64")

    def unreadable(*args, **kwargs):
        raise PermissionError("/proc/cpuinfo")

    monkeypatch.setattr(device, "open", unreadable, raising=False)
    assert device.read_cpuinfo() == ""


@pytest.mark.parametrize("cpuinfo, dtype, label", [
    (AMD_BF16, torch.bfloat16, "bfloat16 (auto: CPU has avx512_bf16)"),
    (INTEL_AMX, torch.bfloat16, "bfloat16 (auto: CPU has amx_bf16)"),
    (NO_BF16, torch.float32, "float32 (auto: no native bf16 on this CPU)"),
])
def test_auto_on_the_cpu_follows_the_detection_and_a_named_dtype_overrides_it(monkeypatch, cpuinfo, dtype, label):
    monkeypatch.setattr(device, "read_cpuinfo", lambda: cpuinfo)
    assert device.pick_dtype("auto", "cpu") == dtype and device.dtype_label("auto", "cpu") == label
    for name, named in device.DTYPES.items():
        assert device.pick_dtype(name, "cpu") == named and device.dtype_label(name, "cpu") == name
    assert device.pick_dtype("auto", "mps") == torch.float32


@pytest.mark.parametrize("cpuinfo, dtype, shown", [(AMD_BF16, "auto", "bfloat16 (auto: CPU has avx512_bf16),"),
                                                   (NO_BF16, "auto", "float32 (auto: no native bf16 on this CPU),"),
                                                   (AMD_BF16, "float32", "device cpu, float32,")])
def test_the_runs_first_line_names_the_dtype_and_why_auto_picked_it(tmp_path, tiny_corpus, capsys, monkeypatch,
                                                                     cpuinfo, dtype, shown):
    monkeypatch.setattr(device, "read_cpuinfo", lambda: cpuinfo)
    run = train.setup(*tiny_train_configs(tmp_path, tiny_corpus, dtype=dtype), ddp=False, rank=0, world=1,
                      device="cpu")
    run.logger.close()
    assert shown in capsys.readouterr().out
    assert run.dtype == (torch.bfloat16 if shown.startswith("bfloat16") else torch.float32)
