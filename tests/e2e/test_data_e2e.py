import os
import signal
import sys

import numpy as np
import pytest

import data.prepare
import train
from data.prepare import prepare_files
from data.tokens import Encoder, read_meta
from helpers import CPU_FP32, ROOT, documents_of, flags, run_in_own_session, run_script, write_corpus, write_jsonl
from model import GPT, GPTConfig
from nanoaha.configurator import parse_args


def test_encoding_workers_leave_signals_to_the_preparer_whatever_handler_it_installed(tmp_path):
    # a signal to the process group is the preparer's to handle (it kills its workers): a worker that died of it
    # lost its chunk and the pool waited for ever; one that kept a parent's flag-only handler (train.py's,
    # compare.py's) survived the pool's own SIGTERM, and the pool waited for it for ever (CI hung here once)
    handlers = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        data.prepare._ignore_group_signals()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    source = write_jsonl(tmp_path / "docs.jsonl", [f"text {i} " * 20 for i in range(200)])
    script = ("import signal, sys; signal.signal(signal.SIGTERM, lambda *_: None); import data.prepare as p; "
              "p.CHUNK_CHARS = 500; p.prepare_files([sys.argv[1]], sys.argv[2], encoding='bytes', num_proc=2, "
              "progress=False)")
    for attempt in range(3):  # the hang needed a worker waiting on the queue's lock when the pool ended: 1 in ~6
        done = run_in_own_session([sys.executable, "-c", script, str(source), str(tmp_path / f"out{attempt}")],
                                  timeout=60, cwd=ROOT)
        assert done.returncode == 0


@pytest.mark.parametrize("encoding", ["bytes", "gpt2"])
def test_parallel_encoding_writes_the_same_files(tmp_path, monkeypatch, encoding, request):
    if encoding == "gpt2":
        request.getfixturevalue("gpt2")
    monkeypatch.setattr(data.prepare, "CHUNK_CHARS", 500)  # many chunks from a small input
    source = write_jsonl(tmp_path / "docs.jsonl", [f"text {i} " * 20 for i in range(200)])
    for name, num_proc in (("serial", 1), ("parallel", 2)):
        prepare_files([source], str(tmp_path / name), encoding=encoding, num_proc=num_proc, progress=False)
    for file in ("train.bin", "val.bin", "meta.json"):
        assert (tmp_path / "serial" / file).read_bytes() == (tmp_path / "parallel" / file).read_bytes()


def test_an_encoding_error_in_a_worker_ends_the_preparation_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(data.prepare, "CHUNK_CHARS", 500)
    source = write_jsonl(tmp_path / "docs.jsonl", [f"text {i} " * 20 for i in range(200)])
    encode = Encoder.encode
    monkeypatch.setattr(Encoder, "encode", lambda self, text: encode(self, text) if "text 150 " not in text else
                        (_ for _ in ()).throw(ValueError("cannot encode document 150")))  # in the forked workers
    with pytest.raises(ValueError, match="cannot encode document 150; no corpus was written"):
        prepare_files([source], str(tmp_path / "out"), encoding="bytes", num_proc=2, progress=False)
    assert os.listdir(tmp_path / "out") == []  # no staging folder left


def test_python_stdlib_command_line(tmp_path):
    out = tmp_path / "stdlib"
    done = run_script("data/python_stdlib/prepare.py", f"--out_dir={out}", "--max_tokens=200000", "--num_proc=1")
    assert done.returncode == 0, done.stderr
    meta = read_meta(out)
    assert (meta["encoding"], meta["vocab_size"], meta["eot_token"]) == ("bytes", 256, 0)
    assert meta["source"].startswith("Python ") and "standard library" in meta["source"]
    assert "import" in "".join(documents_of(out, "train"))


def test_training_with_document_aligned_windows(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    write_corpus(tmp_path / "c", [rng.integers(1, 256, size=rng.integers(5, 80)) for _ in range(60)])
    args = [f"--data_dir='{tmp_path / 'c'}'", f"--out_dir='{tmp_path / 'out'}'", "--doc_aligned_windows", "--max_iters=2",
            "--block_size=16", "--window=4", "--n_layer=1", "--n_head=2", "--n_embd=16", "--eval_iters=1",
            "--tensorboard=False", "--save_checkpoint=False", "--probe_spans=0", *flags(CPU_FP32)]
    inputs = []  # (the repeat probe reads spans of its own, each twice: off here)
    forward = GPT.forward

    def recording_forward(self, idx, targets=None, *args, **kwargs):
        inputs.append((self.training, idx.clone()))
        return forward(self, idx, targets, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", recording_forward)
    result = train.train(*parse_args(args, train.TrainConfig, GPTConfig))
    assert len(result["losses"]) == 2 and np.isfinite(result["val_loss"])
    # every window the model saw, in training and in evaluation, opens a document
    tokens = np.fromfile(tmp_path / "c" / "train.bin", dtype=np.uint16)
    doc_starts = {0} | {i + 1 for i in np.flatnonzero(tokens == 0)}
    openings = {tuple(tokens[i:i + 16]) for i in doc_starts if i + 16 <= len(tokens)}
    assert {training for training, _ in inputs} == {True, False}
    for _, idx in inputs:
        assert all(tuple(row) in openings for row in idx.tolist())
