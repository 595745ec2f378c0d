"""Every command a user runs starts: --help prints its usage and exits 0, an unknown option is one line on stderr
and a non-zero exit. Each runs in its own process, so a broken import in any script or module shows here."""
import os

import pytest

from helpers import run_script

# as a user runs them: without the Triton interpreter that tests/conftest.py switches on for the kernel tests
USER_ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}

SCRIPTS = ["train.py", "sample.py", "evaluate.py", "prune.py", "probe.py", "compare.py"]
PREPARERS = ["data/prepare.py", "data/python_stdlib/prepare.py", "data/shakespeare/prepare.py",
             "data/shakespeare_char/prepare.py", "data/fineweb_edu/prepare.py", "data/synthetic/prepare.py",
             "data/english_docs/prepare.py"]
BENCHMARKS = ["bench/train_speed.py", "bench/generate.py", "bench/attention.py", "bench/cpu_attention.py",
              "bench/compile_kernels.py", "bench/ddp_exit.py", "bench/step_profile.py", "bench/grid_cores.py",
              "bench/committed_heads.py", "bench/layout_speed.py"]


@pytest.mark.parametrize("script", SCRIPTS + PREPARERS + BENCHMARKS)
def test_help_prints_the_usage(script):
    done = run_script(script, "--help", timeout=120, env=USER_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower() or f"python {script}" in done.stdout, done.stdout[:500]
    if script in SCRIPTS:  # the nanoAHA scripts list their settings with their defaults
        assert "settings (--key=value):" in done.stdout and "  --" in done.stdout


@pytest.mark.parametrize("script", SCRIPTS + ["data/synthetic/prepare.py"])
def test_an_unknown_setting_is_one_line_naming_it(script):
    done = run_script(script, "--no_such_setting=1", timeout=120, env=USER_ENV)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "no_such_setting" in lines[0], done.stderr[-2000:]


def test_a_layout_that_does_not_fit_the_shape_is_an_error_naming_it():
    done = run_script("bench/layout_speed.py", "--layout=011", timeout=120, env=USER_ENV)
    assert done.returncode != 0 and "--layout=011: give 2 layers of 4 digits" in done.stderr.strip().splitlines()[-1]
