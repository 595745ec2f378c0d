"""Nothing a preparer writes destroys what another wrote: a failed or interrupted re-preparation leaves the
previous corpus whole, a corpus of another source is replaced only with --overwrite, the missing-data hints name
commands that exist, and init_from='gpt2' checks the model's sizes and the network before any long wait."""
import importlib.util
import os
import signal
import time
import urllib.error
import urllib.request

import pytest

import data.synthetic.prepare as synthetic
import nanoaha.gpt2_weights as gpt2_weights
from data.loader import TokenData
from data.prepare import main as prepare_main
from data.prepare import prepare
from data.tokens import STAGING, Interrupted, prepare_hint, read_meta
from helpers import GPT2_KEYS, ROOT, tiny_recall, write_jsonl
from model import GPTConfig


def snapshot(folder):
    """{file name: bytes} of every file in folder, hidden ones (a staging folder) included."""
    return {name: (folder / name).read_bytes() if (folder / name).is_file() else "a folder"
            for name in sorted(os.listdir(folder))}


def texts(n, tag="doc"):
    return [f"{tag} {i}: " + "some text " * (i % 5 + 1) for i in range(n)]


# ------------------------------------------------------------------- a failed re-preparation changes nothing

def test_a_bad_json_line_in_a_reprepare_leaves_the_previous_corpus_whole(tmp_path):
    source, out = tmp_path / "docs.jsonl", tmp_path / "out"
    write_jsonl(source, texts(600))
    prepare_main([str(source), f"--out_dir={out}", "--encoding=bytes", "--num_proc=1"])
    before = snapshot(out)
    lines = source.read_text().splitlines(keepends=True)
    lines[500] = '{"text": "a broken line\n'  # line 501: the first 500 documents are encoded by then
    source.write_text("".join(lines))
    with pytest.raises(ValueError) as error:
        prepare_main([str(source), f"--out_dir={out}", "--encoding=bytes", "--num_proc=1"])
    message = str(error.value)
    assert "docs.jsonl:501 is not valid JSON" in message and f"the corpus in {out} is unchanged" in message
    assert "\n" not in message
    assert snapshot(out) == before  # meta.json, train.bin, val.bin byte for byte, and no staging folder left
    data = TokenData(str(out), 16, 256)
    assert data.meta["train_documents"] + data.meta["val_documents"] == 600


def test_an_interrupt_during_a_reprepare_leaves_the_previous_corpus_whole(tmp_path):
    out = tmp_path / "out"
    prepare(lambda: iter(texts(50)), str(out), encoding="bytes", val_fraction=0.2, source="s", progress=False)
    before = snapshot(out)

    def interrupted_source():  # Ctrl-C while the 300th document is read: the token files are half written
        for i, text in enumerate(texts(1000)):
            if i == 300:
                assert any(name.startswith(STAGING) for name in os.listdir(out))
                raise KeyboardInterrupt
            yield text
    with pytest.raises(KeyboardInterrupt, match=f"interrupted; the corpus in {out} is unchanged"):
        prepare(interrupted_source, str(out), encoding="bytes", val_fraction=0.2, source="s", num_proc=1,
                progress=False)
    assert snapshot(out) == before
    TokenData(str(out), 16, 256)


def test_a_signal_during_the_swap_is_handled_after_it(tmp_path, monkeypatch):
    out = tmp_path / "out"
    prepare(lambda: iter(texts(50, "old")), str(out), encoding="bytes", val_fraction=0.2, progress=False)
    replace, swapped = os.replace, []

    def replace_and_signal(src, dst):  # SIGTERM arrives as the first file is swapped in
        if os.path.dirname(dst) == str(out):
            if not swapped:
                os.kill(os.getpid(), signal.SIGTERM)
            swapped.append(os.path.basename(dst))
        replace(src, dst)

    def terminate(signum, frame):
        raise Interrupted("SIGTERM")
    monkeypatch.setattr(os, "replace", replace_and_signal)
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with pytest.raises(Interrupted):
            prepare(lambda: iter(texts(50, "new")), str(out), encoding="bytes", val_fraction=0.2, progress=False)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert swapped == ["train.bin", "val.bin", "meta.json"]  # the whole new corpus, then the signal
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]
    assert (out / "train.bin").read_bytes().startswith("new".encode("utf-16-le"))
    TokenData(str(out), 16, 256)


def test_a_failed_task_reprepare_keeps_every_array(tmp_path, monkeypatch):
    out = tmp_path / "recall"
    tiny_recall(out)
    before = snapshot(out)
    assert len(before) == 9  # meta.json, and per split the tokens, answer, needs_global and loss_mask arrays
    calls = []
    labels = synthetic.needs_global

    def failing_labels(*args):
        calls.append(1)
        if len(calls) == 420:  # in the val split: the train split's files are complete by then
            raise ValueError("disk full")
        return labels(*args)
    monkeypatch.setattr(synthetic, "needs_global", failing_labels)
    with pytest.raises(ValueError, match=f"disk full; the corpus in {out} is unchanged"):
        tiny_recall(out, window=8)
    assert snapshot(out) == before
    TokenData(str(out), 32, 256)


def test_a_complete_reprepare_replaces_every_file_and_drops_arrays_it_no_longer_has(tmp_path):
    out = tmp_path / "recall"
    tiny_recall(out)
    meta = tiny_recall(out, loss_on="all", n_train=200)  # no loss_mask arrays now
    assert sorted(os.listdir(out)) == ["meta.json", "train.answer.bin", "train.bin", "train.needs_global.bin",
                                       "val.answer.bin", "val.bin", "val.needs_global.bin"]
    assert read_meta(out) == meta and TokenData(str(out), 32, 256).meta["train_examples"] == 200


def test_a_staging_folder_of_a_killed_preparer_is_removed(tmp_path):
    out = tmp_path / "out"
    prepare(lambda: iter(texts(50)), str(out), encoding="bytes", val_fraction=0.2, progress=False)
    (out / f"{STAGING}999999999").mkdir()  # no such process
    (out / f"{STAGING}999999999" / "train.bin.tmp").write_bytes(b"\0" * 100)
    (out / f"{STAGING}{os.getpid()}x").mkdir()  # not a staging folder's name: kept
    prepare(lambda: iter(texts(50)), str(out), encoding="bytes", val_fraction=0.2, progress=False)
    assert sorted(os.listdir(out)) == [f"{STAGING}{os.getpid()}x", "meta.json", "train.bin", "val.bin"]


# ------------------------------------------------------------- a corpus of another source is kept unless told

def test_a_corpus_of_another_source_or_encoding_is_replaced_only_with_overwrite(tmp_path):
    first, second, out = tmp_path / "first.jsonl", tmp_path / "second.jsonl", tmp_path / "out"
    write_jsonl(first, texts(100, "first"))
    write_jsonl(second, texts(100, "second"))
    prepare_main([str(first), f"--out_dir={out}", "--encoding=bytes", "--num_proc=1"])
    before = snapshot(out)
    for argv in ([str(second), "--encoding=bytes"], [str(first), "--encoding=char"]):
        with pytest.raises(FileExistsError) as error:
            prepare_main([*argv, f"--out_dir={out}", "--num_proc=1"])
        assert str(error.value).startswith(f"{out} holds a corpus of '{first}', encoding bytes")
        assert "pass --overwrite" in str(error.value) and "\n" not in str(error.value)
        assert snapshot(out) == before
    # the same source and encoding with other options is how a corpus is re-prepared
    meta = prepare_main([str(first), f"--out_dir={out}", "--encoding=bytes", "--num_proc=1", "--seed=3",
                         "--val_fraction=0.3", "--max_tokens=1000"])
    assert meta["seed"] == 3 and read_meta(out) == meta
    meta = prepare_main([str(second), f"--out_dir={out}", "--encoding=bytes", "--num_proc=1", "--overwrite"])
    assert read_meta(out) == meta and meta["source"] == str(second)


def test_a_task_folder_is_replaced_by_another_task_or_a_text_corpus_only_with_overwrite(tmp_path):
    out = tmp_path / "recall"
    tiny_recall(out)
    before = snapshot(out)
    copy = synthetic.SyntheticConfig(task="copy", out_dir=str(out), block_size=32, n_train=20, n_val=4)
    with pytest.raises(FileExistsError, match=f"{out} holds a corpus of task 'recall', encoding synthetic, not of "
                                              f"task 'copy'.*--overwrite"):
        synthetic.generate(copy, synthetic.TASKS["copy"](span_len=4, min_distance=8))
    source = write_jsonl(tmp_path / "docs.jsonl", texts(50))
    with pytest.raises(FileExistsError, match="holds a corpus of task 'recall'.*--overwrite"):
        prepare_main([str(source), f"--out_dir={out}", "--encoding=bytes"])
    assert snapshot(out) == before
    tiny_recall(out, window=8, n_train=100)  # the same task with other options
    config, task = synthetic.parse(["--task=copy", "--block_size=32", "--n_train=20", "--n_val=4", "--span_len=4",
                                    "--min_distance=8", f"--out_dir={out}", "--overwrite"])
    assert synthetic.generate(config, task)["task"] == "copy" and read_meta(out)["task"] == "copy"
    assert "train.loss_mask.bin" in os.listdir(out)


# ------------------------------------------------------------------------- hints name commands that exist

def named_scripts(message):
    return [word for word in message.split() if word.endswith("prepare.py")]


def test_missing_data_hints_name_preparers_that_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the hints name the preparers as a user types them in the repository
    assert prepare_hint("data/recall") == \
        "python data/synthetic/prepare.py --task=recall --out_dir=data/recall (and the task's options)"
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "prepare.py").write_text("# a corpus with a preparer of its own")
    for folder, expected in ((tmp_path / "recall", f"data/synthetic/prepare.py --task=recall --out_dir={tmp_path}"),
                             (tmp_path / "copy", f"data/synthetic/prepare.py --task=copy --out_dir={tmp_path}"),
                             (tmp_path / "own", f"python {tmp_path / 'own' / 'prepare.py'}"),
                             (tmp_path / "mine", f"data/prepare.py FILES --out_dir={tmp_path / 'mine'} for text, or "
                                                 f"python data/synthetic/prepare.py --task=TASK")):
        with pytest.raises(FileNotFoundError, match="meta.json not found") as error:
            read_meta(str(folder))
        assert expected in str(error.value)
        scripts = named_scripts(str(error.value))
        assert scripts and all(os.path.isfile(script) for script in scripts), str(error.value)
    # a task folder whose meta.json is there but whose arrays are not: the task's own command, with its sizes
    tiny_recall(tmp_path / "recall")
    (tmp_path / "recall" / "val.needs_global.bin").unlink()
    with pytest.raises(ValueError, match="val.needs_global.bin should hold") as error:
        TokenData(str(tmp_path / "recall"), 32, 256)
    assert f"data/synthetic/prepare.py --task=recall --block_size=32 --window=4 --n_sink=0 " \
           f"--out_dir={tmp_path / 'recall'}" in str(error.value)
    assert all(os.path.isfile(script) for script in named_scripts(str(error.value)))
    assert prepare_hint("data/mine", {"source": "books/", "encoding": "gpt2"}).endswith("(it was prepared from books/)")


# --------------------------------------------------------------------------- init_from='gpt2', offline first

@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """No network and an empty Hugging Face cache; loading weights fails the test."""
    if importlib.util.find_spec("transformers") is None:  # importorskip would import it outside its scope
        pytest.skip("transformers is not installed")
    from nanoaha.gpt2_weights import import_transformers
    transformers = import_transformers()
    import huggingface_hub.constants

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network in this test")

    def no_loading(*args, **kwargs):
        pytest.fail("weights were loaded", pytrace=False)
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setattr(transformers.GPT2LMHeadModel, "from_pretrained", no_loading)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def gpt2_config(**overrides):
    return GPTConfig(**{"vocab_size": 50257, "block_size": 64, "n_layer": 12, "n_head": 12, "n_embd": 768,
                        "window": 16, **GPT2_KEYS, **overrides})


def test_gpt2_sizes_are_checked_before_any_download(no_hub):
    with pytest.raises(ValueError, match=r"init_from='gpt2' needs --n_layer=12 --n_head=12 --n_embd=768 "
                                         r"--vocab_size=50257 \(this config has n_layer=2"):
        gpt2_weights.gpt2_state_dict("gpt2", GPTConfig(n_layer=2, n_head=2, n_embd=32, bias=True,
                                                       position_embedding="learned", gelu_approximate="tanh"))
    with pytest.raises(ValueError, match="init_from='gpt2-medium' needs --n_layer=24 --n_head=16 --n_embd=1024"):
        gpt2_weights.gpt2_state_dict("gpt2-medium", gpt2_config())
    with pytest.raises(ValueError, match="block_size=2048 is longer than GPT-2's 1024"):
        gpt2_weights.gpt2_state_dict("gpt2-xl", gpt2_config(n_layer=48, n_head=25, n_embd=1600, block_size=2048))


def test_a_saved_gpt2s_sizes_are_checked_before_its_weights_load(no_hub, tiny_gpt2):
    _, init_from = tiny_gpt2
    with pytest.raises(ValueError, match="needs --n_layer=2 --n_head=2 --n_embd=32 --vocab_size=256"):
        gpt2_weights.gpt2_state_dict(init_from, gpt2_config())


@pytest.mark.parametrize("offline_flag", [False, True])
def test_gpt2_offline_and_not_cached_is_one_line_at_once(no_hub, monkeypatch, offline_flag):
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline_flag)
    start = time.monotonic()
    with pytest.raises(ValueError) as error:
        gpt2_weights.gpt2_state_dict("gpt2", gpt2_config())
    assert time.monotonic() - start < 2
    message = str(error.value)
    assert message.startswith("cannot load GPT-2 weights 'gpt2': not in the Hugging Face cache, and ")
    assert ("HF_HUB_OFFLINE is set" if offline_flag else "is unreachable: no network in this test") in message
    assert "connect to the internet once" in message and "--init_from=hf:PATH" in message and "\n" not in message
    with pytest.raises(ValueError, match=r"'nowhere/gpt2': no folder nowhere/gpt2 here, not in the Hugging Face cache"):
        gpt2_weights.gpt2_state_dict("hf:nowhere/gpt2", gpt2_config())
