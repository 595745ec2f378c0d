"""What the tests share: command lines from settings, subprocesses that cannot hang the suite, and the small
corpora, configs and grids that both the unit and the end-to-end tests build."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from data.tokens import Encoder, read_meta, write_meta
from model import GPTConfig
from nanoaha.configurator import parse_args
from nanoaha.train_config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: where the scripts run
# Tests train on the CPU in fp32 on every machine: dtype="auto" picks bf16 on CPUs with native bf16
# (nanoaha/device.py), and their numbers (exact resumes, DDP against one process, compiled against eager) would
# then depend on the machine. tests/unit/test_device.py tests auto itself.
CPU_FP32 = {"device": "cpu", "dtype": "float32"}


def flags(values):
    """{key: value} -> ["--key=value", ...] as a user types them (strings quoted, so '1' stays a string)."""
    return [f"--{k}={v!r}" if isinstance(v, str) else f"--{k}={v}" for k, v in values.items()]


def train_configs(values, *files):
    """(TrainConfig, GPTConfig) as train.py parses config files and then these settings."""
    return parse_args([*files, *flags(values)], TrainConfig, GPTConfig)


def run_in_own_session(cmd, timeout, **popen):
    """subprocess.run(cmd, **popen) with a timeout that kills cmd's whole process group and fails the test,
    showing the end of what it wrote (when piped). cmd runs in a session of its own, so the timeout kills every
    process it started (killing only the parent left its children holding the pipes, and the test waited)."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        tail = "\n".join((s if isinstance(s, str) else s.decode(errors="replace"))[-3000:]
                         for s in (stdout, stderr) if s)
        pytest.fail(f"{' '.join(map(str, cmd))[:200]} ran past {timeout} s (killed with its children)\n{tail}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run_script(*args, timeout=300, **popen):
    """`python ARGS...` in the repository, output captured as text, under run_in_own_session's timeout."""
    popen = {"cwd": ROOT, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen}
    return run_in_own_session([sys.executable, *map(str, args)], timeout, **popen)


class Script:
    """`python ARGS...` running in the background in a session of its own. `wait_for(text)` reads its stdout line
    by line until one holds text, with a deadline that fails the test; `finish()` waits for the exit. Used as a
    context manager, it kills the process group on the way out, so a failing test leaves no process behind."""

    def __init__(self, *args, **popen):
        self.proc = subprocess.Popen([sys.executable, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True, **popen)
        self.lines, self.stdout, self.stderr = queue.Queue(), [], []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self.stderr_reader = threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True)
        self.stderr_reader.start()

    def _read_stdout(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text, timeout=120):
        """The first stdout line that holds text."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                pytest.fail(f"the process ended before printing {text!r}:\n{self.output()}")
            self.stdout.append(line)
            if text in line:
                return line
        pytest.fail(f"no line with {text!r} within {timeout} s:\n{self.output()}")

    def output(self):
        return "".join(self.stdout)[-2000:] + "".join(self.stderr)[-2000:]

    def finish(self, timeout=120):
        """Wait for the exit; returns (exit status, stdout, stderr)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running after {timeout} s:\n{self.output()}")
        while (line := self.lines.get(timeout=10)) is not None:
            self.stdout.append(line)
        self.stderr_reader.join(10)
        return self.proc.returncode, "".join(self.stdout), "".join(self.stderr)

    def send_signal(self, signum):
        self.proc.send_signal(signum)

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


# ------------------------------------------------------------------------------------- corpora and test inputs

def write_corpus(path, docs, eot=0):
    """A byte-level corpus with documents docs (lists of token ids), all in both splits."""
    path.mkdir(exist_ok=True)
    tokens = np.concatenate([np.append(np.asarray(d, np.uint16), eot) for d in docs]).astype(np.uint16)
    for split in ("train", "val"):
        tokens.tofile(path / f"{split}.bin")
    meta = {"encoding": "bytes", "vocab_size": 256, "dtype": "uint16", "eot_token": eot,
            "train_tokens": len(tokens), "val_tokens": len(tokens)}
    write_meta(str(path), meta)
    return meta


def documents_of(out_dir, split):
    """The documents of a split, decoded (the end-of-text tokens split them)."""
    meta = read_meta(out_dir)
    tokens = np.fromfile(os.path.join(out_dir, f"{split}.bin"), dtype=meta["dtype"])
    assert tokens[-1] == meta["eot_token"]
    encoder = Encoder(meta["encoding"], meta.get("chars"))
    ends = np.flatnonzero(tokens == meta["eot_token"])
    return [encoder.decode(tokens[start:end]) for start, end in zip(np.concatenate([[0], ends[:-1] + 1]), ends)]


def write_jsonl(path, texts, field="text"):
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


def small_config(**overrides):
    """A model small enough for unit tests, on the torch attention backend."""
    return GPTConfig(**{"vocab_size": 64, "block_size": 48, "n_layer": 2, "n_head": 2, "n_embd": 32,
                        "window": 8, "attention_backend": "torch", **overrides})


def write_grid(path, runs, common=None, seeds=(1,), extra=""):
    """A grid file on configs/quickstart.py."""
    path.write_text(f'"""A test grid: does the runner work?"""\nbase = ["configs/quickstart.py"]\n'
                    f"common = {common or {}!r}\nseeds = {list(seeds)!r}\nruns = {runs!r}\n{extra}")
    return str(path)


def table_cells(table):
    """A Markdown table -> {first cell: the row's cells}."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ")]
    return {row[0]: row for row in rows}


def tiny_recall(out_dir, **overrides):
    """A small recall task (data/synthetic): 4 key-value pairs, 4 queries, windows of 4 tokens."""
    from data.synthetic.prepare import SyntheticConfig, generate
    from data.synthetic.tasks import Recall
    cfg = SyntheticConfig(**{"task": "recall", "out_dir": str(out_dir), "block_size": 32, "window": 4,
                             "n_train": 400, "n_val": 40, **overrides})
    return generate(cfg, Recall(n_pairs=4, n_queries=4, n_keys=8, n_values=8, n_filler=4))


def byte_corpus(path):
    """A byte-level corpus of repetitive Python-like lines, prepared as data/prepare.py does."""
    from data.prepare import prepare
    rng = np.random.default_rng(0)
    lines = [f"def f{i}(x):\n    return x + {i}\n" for i in range(40)]
    docs = ["".join(rng.choice(lines, 30)) for _ in range(12)]
    prepare(lambda: iter(docs), str(path), encoding="bytes", val_fraction=0.2, progress=False)
    return path


def tiny_train_configs(tmp_path, corpus, **overrides):
    """(TrainConfig, GPTConfig) of a 2-layer model that trains 40 steps on corpus in a second or two."""
    values = {"data_dir": str(corpus), "out_dir": str(tmp_path / "out"), "block_size": 32, "n_layer": 2,
              "n_head": 2, "n_embd": 32, "window": 8, "batch_size": 4, "max_iters": 40, "eval_interval": 20,
              "eval_iters": 2, "log_interval": 10, "warmup_iters": 5, "learning_rate": 3e-3, "router_lambda": 0.01,
              "router_lambda_ramp": 10, "tensorboard": False, **CPU_FP32, **overrides}
    return train_configs(values)


GPT2_KEYS = {"bias": True, "position_embedding": "learned", "gelu_approximate": "tanh"}  # GPT-2's architecture
