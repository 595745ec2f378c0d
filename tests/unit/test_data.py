import os
import sys
from collections import Counter

import numpy as np
import pytest
import tiktoken
import tiktoken.load  # the module the test patches: imported here, so the test passes run alone too
import torch

import data.prepare
from data.fineweb_edu.prepare import main as fineweb_main
from data.loader import TokenData
from data.prepare import fetch, prepare, prepare_files
from data.prepare import main as prepare_main
from data.shakespeare.prepare import main as shakespeare_main
from data.tokens import Encoder, read_meta, token_dtype, write_meta
from helpers import documents_of, write_corpus, write_jsonl

SPEECHES = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 20


def all_documents(out_dir):
    return Counter(documents_of(out_dir, "train") + documents_of(out_dir, "val"))


def test_every_input_format_becomes_documents(tmp_path):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet
    (tmp_path / "folder" / "sub").mkdir(parents=True)
    (tmp_path / "a.txt").write_text("plain text file\n")
    (tmp_path / "folder" / "b.md").write_text("# markdown in a folder")
    (tmp_path / "folder" / "sub" / "c.txt").write_text("nested, with ünïcode and a NUL\0 byte")
    (tmp_path / "folder" / ".hidden.txt").write_text("hidden files are skipped")
    write_jsonl(tmp_path / "d.jsonl", ["json line one", "json line two"])
    with open(tmp_path / "d.jsonl", "a") as f:
        f.write("\n")  # a blank line is no document
    pyarrow.parquet.write_table(pyarrow.table({"text": ["parquet row one", "parquet row two"], "n": [1, 2]}),
                                tmp_path / "e.parquet")
    inputs = [tmp_path / "a.txt", tmp_path / "folder", tmp_path / "d.jsonl", tmp_path / "e.parquet"]
    meta = prepare_files(inputs, str(tmp_path / "out"), encoding="bytes", val_fraction=0.3, progress=False)
    assert all_documents(tmp_path / "out") == Counter([
        "plain text file\n", "# markdown in a folder", "nested, with ünïcode and a NUL byte",
        "json line one", "json line two", "parquet row one", "parquet row two"])
    assert meta["train_documents"] + meta["val_documents"] == 7 and min(meta["train_documents"], meta["val_documents"]) > 0
    assert meta["encoding"] == "bytes" and meta["vocab_size"] == 256 and meta["eot_token"] == 0
    assert meta["dtype"] == "uint16" and str(tmp_path / "d.jsonl") in meta["source"]
    for split in ("train", "val"):
        assert os.path.getsize(tmp_path / "out" / f"{split}.bin") == 2 * meta[f"{split}_tokens"]
    assert read_meta(tmp_path / "out") == meta


def test_split_is_by_document_and_the_same_for_a_seed(tmp_path):
    texts = [f"document number {i} " * (i % 7 + 1) for i in range(300)]
    source = write_jsonl(tmp_path / "docs.jsonl", texts)
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        prepare_files([source], str(tmp_path / name), encoding="bytes", val_fraction=0.2, seed=seed, progress=False)
        runs[name] = [(tmp_path / name / f"{split}.bin").read_bytes() for split in ("train", "val")]
    assert runs["a"] == runs["b"] and runs["a"] != runs["c"]
    assert all_documents(tmp_path / "a") == Counter(texts)  # every document whole, in exactly one split
    assert 30 < len(documents_of(tmp_path / "a", "val")) < 90


def test_char_encoding_and_document_separator_from_the_command_line(tmp_path):
    (tmp_path / "play.txt").write_text(SPEECHES)
    meta = prepare_main([str(tmp_path / "play.txt"), f"--out_dir={tmp_path / 'out'}", "--encoding=char",
                         "--doc_separator=\\n\\n", "--val_fraction=0.2"])
    assert meta["chars"] == "".join(sorted(set(SPEECHES)))
    assert meta["vocab_size"] == len(meta["chars"]) + 1 and meta["eot_token"] == len(meta["chars"])
    assert all_documents(tmp_path / "out") == Counter({"First Citizen:\nBefore we proceed any further, hear me speak.": 20,
                                                       "All:\nSpeak, speak.": 20})


@pytest.mark.parametrize("chunk_chars", [1 << 20, 7])  # one read per file; many reads, separators across reads
def test_doc_separator_keeps_every_document_including_the_last(tmp_path, monkeypatch, chunk_chars):
    monkeypatch.setattr(data.prepare, "CHUNK_CHARS", chunk_chars)
    first = [f"document {i} of the first file, ünïcode {'x' * i}" for i in range(30)]
    second = ["the second file's only separator ends its first document", "its last document"]
    (tmp_path / "a.txt").write_text("\n\n".join(first))  # no separator after the last document
    (tmp_path / "b.txt").write_text("\n\n".join(second) + "\n\n")  # a separator at the end: no empty document
    meta = prepare_files([tmp_path / "a.txt", tmp_path / "b.txt"], str(tmp_path / "out"), doc_separator="\n\n",
                         encoding="bytes", val_fraction=0.3, num_proc=1, progress=False)  # no process: a unit test
    documents = first + second
    assert all_documents(tmp_path / "out") == Counter(documents)
    assert meta["train_documents"] + meta["val_documents"] == len(documents)
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(d.encode()) + 1 for d in documents)
    for split in ("train", "val"):
        assert os.path.getsize(tmp_path / "out" / f"{split}.bin") == 2 * meta[f"{split}_tokens"]


def test_dtype_is_uint16_when_the_vocab_fits_else_uint32(tmp_path):
    assert token_dtype(2 ** 16) == np.uint16 and token_dtype(2 ** 16 + 1) == np.uint32
    # 70,000 distinct characters: a char vocabulary too large for uint16
    alphabet = [chr(0x20000 + i) for i in range(70_000)]
    texts = ["".join(alphabet[i::10]) for i in range(10)]
    meta = prepare(lambda: iter(texts), str(tmp_path), encoding="char", val_fraction=0.3, progress=False)
    assert meta["vocab_size"] == 70_001 and meta["dtype"] == "uint32"
    assert os.path.getsize(tmp_path / "train.bin") == 4 * meta["train_tokens"]
    assert all_documents(tmp_path) == Counter(texts)
    data = TokenData(str(tmp_path), 64, 70_001)
    assert data.train_batch(2, torch.Generator().manual_seed(0))[0].max() < 70_001


def test_gpt2_bpe_ends_documents_with_the_end_of_text_token(tmp_path, gpt2):
    texts = ["Hello world, a first document.", "A second one <|endoftext|> with the special text inside."]
    meta = prepare(lambda: iter(texts * 10), str(tmp_path), val_fraction=0.3, progress=False)
    assert meta["encoding"] == "gpt2" and meta["vocab_size"] == 50257 and meta["eot_token"] == 50256
    assert meta["dtype"] == "uint16"
    tokens = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    assert (tokens == 50256).sum() == meta["train_documents"]  # special-token text inside a document stays text
    assert all_documents(tmp_path) == Counter(texts * 10)


def test_rerun_replaces_the_output_and_max_tokens_stops_early(tmp_path):
    big = write_jsonl(tmp_path / "big.jsonl", [f"a longer document {i} " * 50 for i in range(100)])
    small = write_jsonl(tmp_path / "small.jsonl", [f"short {i}" for i in range(40)])
    out = tmp_path / "out"
    prepare_files([big], str(out), encoding="bytes", val_fraction=0.2, progress=False)
    meta = prepare_files([small], str(out), encoding="bytes", val_fraction=0.2, progress=False)
    assert all_documents(out) == Counter(f"short {i}" for i in range(40))
    assert os.path.getsize(out / "train.bin") == 2 * meta["train_tokens"]
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]  # no temporary files left
    meta = prepare_files([big], str(out), encoding="bytes", val_fraction=0.2, max_tokens=20_000, progress=False)
    assert 20_000 <= meta["train_tokens"] + meta["val_tokens"] < 20_000 + 1100  # documents of < 1100 bytes


def test_bad_inputs_give_clear_errors(tmp_path):
    out = str(tmp_path / "out")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty.txt is empty"):
        prepare_files([tmp_path / "empty.txt"], out, encoding="bytes")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare_files([tmp_path / "nowhere.txt"], out, encoding="bytes")
    (tmp_path / "one.txt").write_text("a single document cannot fill two splits")
    with pytest.raises(ValueError, match="unknown encoding 'gpt3'; choose one of gpt2, cl100k_base, o200k_base"):
        prepare_files([tmp_path / "one.txt"], out, encoding="gpt3")
    with pytest.raises(ValueError, match="split is empty.*doc_separator"):
        prepare_files([tmp_path / "one.txt"], out, encoding="bytes", progress=False)
    write_jsonl(tmp_path / "rows.jsonl", ["x"], field="content")
    with pytest.raises(ValueError, match=r"rows.jsonl:1 has no field 'text' \(found \['content', 'id'\]\)"):
        prepare_files([tmp_path / "rows.jsonl"], out, encoding="bytes", progress=False)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt is not UTF-8"):
        prepare_files([tmp_path / "latin1.txt"], out, encoding="bytes", progress=False)
    assert not os.path.exists(tmp_path / "out" / "train.bin.tmp")


@pytest.mark.parametrize("cache_env", ["TIKTOKEN_CACHE_DIR", None])
def test_missing_tiktoken_files_say_how_to_fix_it(tmp_path, monkeypatch, cache_env):
    """Offline with no cached files: the error names the encoding and TIKTOKEN_CACHE_DIR."""
    def offline(url):
        raise OSError(f"cannot reach {url}")
    monkeypatch.setattr(tiktoken.load, "read_file", offline)
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "cl100k_base", raising=False)
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    if cache_env:
        monkeypatch.setenv(cache_env, str(tmp_path))
        expected = f"TIKTOKEN_CACHE_DIR={tmp_path} does not hold them"
    else:
        monkeypatch.setenv("DATA_GYM_CACHE_DIR", "")  # tiktoken's own default cache would be a machine-wide folder
        expected = "TIKTOKEN_CACHE_DIR is not set"
    (tmp_path / "one.txt").write_text("text")
    with pytest.raises(OSError, match=f"'cl100k_base' encoding.*{expected}.*set TIKTOKEN_CACHE_DIR=DIR"):
        prepare_files([tmp_path / "one.txt"], str(tmp_path / "out"), encoding="cl100k_base")


def test_loader_checks_say_what_is_wrong(tmp_path):
    meta = write_corpus(tmp_path / "c", [range(1, 40), range(1, 60)])
    with pytest.raises(FileNotFoundError, match="prepare"):
        TokenData(str(tmp_path / "nowhere"), 16, 256)
    with pytest.raises(ValueError, match="has vocab_size 256 but the model only 100: set --vocab_size=256"):
        TokenData(str(tmp_path / "c"), 16, 100)
    with pytest.raises(ValueError, match="block_size=512"):
        TokenData(str(tmp_path / "c"), 512, 256)
    write_meta(str(tmp_path / "c"), {**meta, "dtype": "uint32", "train_tokens": meta["train_tokens"] // 2})
    with pytest.raises(ValueError, match="names the wrong dtype"):
        TokenData(str(tmp_path / "c"), 16, 256)
    write_meta(str(tmp_path / "c"), {**meta, "example_len": 33})
    with pytest.raises(ValueError, match="set --block_size=32"):
        TokenData(str(tmp_path / "c"), 16, 256)
    write_meta(str(tmp_path / "c"), meta)
    (tmp_path / "c" / "val.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="val.bin is missing or empty"):
        TokenData(str(tmp_path / "c"), 16, 256)


def test_windows_are_random_for_training_fixed_for_validation_and_can_start_at_documents(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 256, size=rng.integers(5, 80)) for _ in range(60)]
    write_corpus(tmp_path, docs)
    plain = TokenData(str(tmp_path), 16, 256)
    x, y = plain.train_batch(64, torch.Generator().manual_seed(0))
    assert torch.equal(x[:, 1:], y[:, :-1]) and (x[:, 0] != x[0, 0]).any()
    first = plain.val_batches(4, 3)
    assert all(torch.equal(a, b) for (xa, ya), (xb, yb) in zip(first, plain.val_batches(4, 3)) for a, b in ((xa, xb), (ya, yb)))
    aligned = TokenData(str(tmp_path), 16, 256, doc_aligned_windows=True)
    tokens = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    doc_starts = {0, *(np.flatnonzero(tokens == 0) + 1).tolist()}
    for split, starts in (("train", aligned.starts["train"]), ("val", aligned.val_starts(12))):
        assert set(np.asarray(starts).tolist()) <= doc_starts
    x, _ = aligned.train_batch(64, torch.Generator().manual_seed(0))
    firsts = {int(tokens[s]) for s in doc_starts if s < len(tokens)}
    assert set(x[:, 0].tolist()) <= firsts and len(set(x[:, 0].tolist())) > 10


def test_shakespeare_from_a_local_file_and_from_a_url(tmp_path, capsys):
    (tmp_path / "input.txt").write_text(SPEECHES)
    meta = shakespeare_main([f"--input={tmp_path / 'input.txt'}", f"--out_dir={tmp_path / 'local'}", "--num_proc=1"],
                            "char", "unused")
    assert meta["encoding"] == "char" and meta["train_documents"] + meta["val_documents"] == 40
    url = (tmp_path / "input.txt").as_uri()
    downloaded = shakespeare_main([f"--input={url}", f"--out_dir={tmp_path / 'web'}", "--encoding=bytes"], "char", "")
    assert (tmp_path / "web" / "input.txt").read_text() == SPEECHES and downloaded["source"] == url
    assert "downloading" in capsys.readouterr().out
    (tmp_path / "input.txt").unlink()  # the download is kept: a second run needs no network
    assert fetch(url, str(tmp_path / "web" / "input.txt")) == str(tmp_path / "web" / "input.txt")
    with pytest.raises(ConnectionError, match="could not download.*--input=PATH"):
        fetch(url, str(tmp_path / "nowhere.txt"))


def test_shakespeare_bpe(tmp_path, gpt2):
    (tmp_path / "input.txt").write_text(SPEECHES)
    meta = shakespeare_main([f"--input={tmp_path / 'input.txt'}", f"--out_dir={tmp_path}"], "gpt2", "")
    assert meta["encoding"] == "gpt2" and meta["val_fraction"] == 0.1
    assert all_documents(tmp_path)["All:\nSpeak, speak."] == 20


def test_fineweb_reads_local_files_and_streams_from_the_hub(tmp_path, monkeypatch):
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet
    rows = [f"an educational page about topic {i}. " * 5 for i in range(100)]
    pyarrow.parquet.write_table(pyarrow.table({"text": rows}), tmp_path / "shard.parquet")
    meta = fineweb_main(["--local", str(tmp_path / "shard.parquet"), f"--out_dir={tmp_path / 'local'}",
                         "--encoding=bytes", "--val_fraction=0.1"])
    assert all_documents(tmp_path / "local") == Counter(rows)

    calls = []

    def load_dataset(path, name, split, streaming):  # the hub, endless
        calls.append((path, name, split, streaming))
        return ({"text": rows[i % len(rows)], "id": i} for i in range(10 ** 9))

    monkeypatch.setitem(sys.modules, "datasets", type(sys)("datasets"))
    sys.modules["datasets"].load_dataset = load_dataset
    meta = fineweb_main([f"--out_dir={tmp_path / 'hub'}", "--encoding=bytes", "--max_tokens=50000", "--num_proc=1"])
    assert calls == [("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True)]
    assert 50000 <= meta["train_tokens"] + meta["val_tokens"] < 60000 and "hub" in meta["source"]
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ImportError, match="pip install datasets.*--local"):
        fineweb_main([f"--out_dir={tmp_path / 'hub'}", "--encoding=bytes"])
