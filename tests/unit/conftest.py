"""Unit tests stay fast: one that starts a process or takes an optimizer step (trains) fails here and belongs in
tests/e2e, where every test is marked slow."""
import multiprocessing
import subprocess

import pytest
import torch


def _refuse(what):
    def refuse(*args, **kwargs):
        pytest.fail(f"a unit test {what}: move it to tests/e2e (end-to-end tests, marked slow)", pytrace=False)
    return refuse


@pytest.fixture(autouse=True)
def no_processes_or_training(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("starts a process"))
    monkeypatch.setattr(multiprocessing.Process, "start", _refuse("starts a process"))
    monkeypatch.setattr(torch.optim.AdamW, "step", _refuse("trains (an optimizer step)"))
