"""Turn text into a tokenized corpus: <out_dir>/train.bin, val.bin and meta.json (the format of data/tokens.py).

    python data/prepare.py books/ notes.txt dump.jsonl shard.parquet --out_dir=data/mycorpus
    python data/prepare.py corpus.txt --out_dir=data/mychars --encoding=char --doc_separator='\\n\\n'

Inputs are text files, folders (searched recursively, hidden files skipped), .jsonl files (one JSON object per
line, the document in --text_field) and .parquet files (the document in column --text_field; needs pyarrow).
A text file is one document, or several when --doc_separator is given. Every document goes to val with
probability --val_fraction, drawn from a generator seeded with --seed, so the split is by document and the same
for the same inputs and seed. Each document is followed by the encoding's end-of-text token. Input is streamed:
it is read in chunks, encoded by --num_proc worker processes when it is larger than one chunk, and written as it
comes, so a corpus larger than memory works. The workers ignore Ctrl-C and SIGTERM sent to the process group:
this process handles them and ends its workers.

A re-run replaces the corpus in --out_dir, but only when the new one is complete: it is built in a staging
folder inside --out_dir and its files are renamed into place at the end, meta.json last, so a failure (a bad
input line, a full disk) or an interrupt (Ctrl-C, SIGTERM) leaves the previous corpus whole, and says so.

What a corpus is: meta.json's 'source' (the inputs, or the corpus a preparer names, e.g. "Python 3.12.3
standard library at ..."), 'encoding' and, for the synthetic tasks, 'task'. Re-preparing the same source and
encoding (with another --max_tokens, --val_fraction, --seed, ...) replaces the corpus; a folder that holds a
corpus of another source or encoding is replaced only with --overwrite.
"""
import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import signal
import sys
import urllib.request
from collections import deque
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from data.atomic_files import atomic_write  # noqa: E402
from nanoaha.configurator import run_main  # noqa: E402
from data.tokens import (ENCODINGS, Encoder, Interrupted, TokenWriter, check_replaceable,  # noqa: E402
                         replacing_corpus, signals_held, token_path, write_meta)

CHUNK_CHARS = 1 << 20  # characters of text per unit of work for an encoding process


def find_files(inputs, pattern="*"):
    """The files named by inputs, folders expanded recursively (sorted, hidden files and folders skipped)."""
    files = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.rglob(pattern) if p.is_file()
                           and not any(part.startswith(".") for part in p.relative_to(path).parts))
            if not found:
                raise ValueError(f"folder {path} holds no files matching {pattern!r}")
            files.extend(found)
        elif path.is_file():
            if path.stat().st_size == 0:
                raise ValueError(f"{path} is empty")
            files.append(path)
        else:
            raise FileNotFoundError(f"input {path} does not exist")
    return files


def text_documents(path, separator):
    """The file's text as one document, or split at every separator (read in blocks: any file size works)."""
    with open(path, encoding="utf-8") as f:
        if not separator:
            yield f.read()
            return
        rest = ""
        for block in iter(lambda: f.read(CHUNK_CHARS), ""):
            *done, rest = (rest + block).split(separator)
            yield from done
        yield rest


def jsonl_documents(path, text_field):
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_number} is not valid JSON ({e})") from None
            if not isinstance(row, dict) or text_field not in row:
                keys = sorted(row) if isinstance(row, dict) else type(row).__name__
                raise ValueError(f"{path}:{line_number} has no field {text_field!r} (found {keys}); "
                                 f"set --text_field")
            yield row[text_field]


def parquet_documents(path, text_field):
    try:
        import pyarrow.parquet
    except ImportError:
        raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from None
    parquet = pyarrow.parquet.ParquetFile(path)
    if text_field not in parquet.schema_arrow.names:
        raise ValueError(f"{path} has no column {text_field!r} (found {parquet.schema_arrow.names}); "
                         f"set --text_field")
    for batch in parquet.iter_batches(batch_size=1024, columns=[text_field]):
        yield from batch.column(0).to_pylist()


def read_documents(files, text_field="text", doc_separator=None):
    for path in files:
        try:
            if path.suffix == ".jsonl":
                yield from jsonl_documents(path, text_field)
            elif path.suffix == ".parquet":
                yield from parquet_documents(path, text_field)
            else:
                yield from text_documents(path, doc_separator)
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not UTF-8 text; leave it out or convert it") from None


def chunked(documents):
    """Lists of documents of about CHUNK_CHARS characters in all."""
    chunk, size = [], 0
    for doc in documents:
        if not isinstance(doc, str):
            raise ValueError(f"a document is {type(doc).__name__}, not text: {str(doc)[:80]!r}")
        chunk.append(doc)
        size += len(doc)
        if size >= CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _ignore_group_signals():
    """A worker's first act: Ctrl-C, `timeout`, `kill -TERM -PGID` and schedulers signal the whole process group,
    and stopping is the parent's to do (it kills its workers on the way out). A worker that died of the signal
    took its chunk with it, and a pool that waited for that chunk waited for ever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _encoding_worker(connection, encoding, chars, inherited):
    """Chunks of documents in, their token arrays (or the error) out, through a pipe of its own, until None.
    inherited: the other pipe ends a forked worker holds, closed so that a dead parent or sibling is an EOF."""
    _ignore_group_signals()
    for other in inherited:
        other.close()
    try:
        encoder = Encoder(encoding, chars)
    except Exception as e:
        encoder = e
    with contextlib.suppress(EOFError, BrokenPipeError):  # the preparer died (SIGKILL): nothing more will come
        _serve(connection, encoder)


def _serve(connection, encoder):
    for docs in iter(connection.recv, None):
        try:
            if isinstance(encoder, Exception):
                raise encoder
            connection.send([encoder.encode(doc) for doc in docs])
        except Exception as e:
            connection.send(e)


def _received(connection):
    try:
        result = connection.recv()
    except EOFError:  # its worker died (not of a group signal, which it ignores): the run fails, it never waits
        raise OSError("an encoding process died (killed, or out of memory?); prepare again, with a smaller "
                      "--num_proc") from None
    if isinstance(result, Exception):
        raise result
    return result


def encoded_chunks(documents, encoder, num_proc):
    """Lists of token arrays, one list per chunk of documents, in input order. More than one chunk and
    num_proc > 1: encoded by num_proc worker processes, one chunk each at a time (memory stays bounded whatever
    the input size), the next chunk read while they encode."""
    chunks = chunked(documents)
    head = list(itertools.islice(chunks, 2))
    if num_proc <= 1 or len(head) < 2:
        for chunk in itertools.chain(head, chunks):
            yield [encoder.encode(doc) for doc in chunk]
        return
    # Not multiprocessing.Pool: its workers share queues and locks, so one killed mid-send (a SIGTERM to the
    # process group) hung Pool.terminate(), and one killed with a chunk hung Pool.join(). Here every worker has a
    # pipe of its own: the workers ignore group signals, and the parent, whatever ends it, kills them at once.
    pipes = [multiprocessing.Pipe() for _ in range(num_proc)]
    ends = [end for pipe in pipes for end in pipe]
    workers = []
    try:
        with signals_held():  # a forked worker would otherwise raise on a signal before it ignores it
            for ours, theirs in pipes:
                worker = multiprocessing.Process(target=_encoding_worker, args=(
                    theirs, encoder.name, encoder.chars, [end for end in ends if end is not theirs]))
                worker.start()
                workers.append(worker)
        for _, theirs in pipes:
            theirs.close()  # the worker's end is the worker's: its death is then an EOF here, not a hang
        pending = deque()  # the pipes of the workers at work, in the order of their chunks
        for i, chunk in enumerate(itertools.chain(head, chunks)):
            ours = pipes[i % num_proc][0]  # round robin: the worker that had the oldest chunk, when all are busy
            done = _received(pending.popleft()) if len(pending) == num_proc else None
            ours.send(chunk)
            pending.append(ours)
            if done is not None:
                yield done
        while pending:
            yield _received(pending.popleft())
    finally:  # also on an error, Ctrl-C, SIGTERM or max_tokens reached (GeneratorExit)
        for worker in workers:
            worker.kill()  # idle, or encoding a chunk no one will read: nothing is lost
        for worker in workers:
            worker.join()
        for end in ends:
            end.close()


def prepare(documents, out_dir, encoding="gpt2", val_fraction=0.05, seed=0, source="", num_proc=None,
            max_tokens=None, progress=True, overwrite=True):
    """documents: a function returning a fresh iterator of document strings (called twice for the 'char'
    encoding, which first collects the character set). max_tokens: stop after the first document that reaches
    this many tokens in all (0 or None: no limit). Returns the meta dict written to <out_dir>/meta.json.

    The corpus is built beside the one out_dir may hold and replaces it only when complete (see
    data.tokens.replacing_corpus): an error or Ctrl-C leaves the previous corpus whole. overwrite=False (the
    command lines' default) refuses to replace a corpus of another source or encoding (see the module
    docstring)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction={val_fraction} must be between 0 and 1")
    chars = None
    if encoding == "char":
        seen = set()
        for doc in documents():
            seen.update(doc)
        chars = "".join(sorted(seen))
    encoder = Encoder(encoding, chars)
    check_replaceable(out_dir, {"source": source, "encoding": encoding}, overwrite)
    with replacing_corpus(out_dir) as staging:
        if progress:
            print(f"preparing {out_dir} from {source or 'the input'} ({encoding}); the corpus there is replaced "
                  f"when this completes", flush=True)
        meta = _write_corpus(staging, documents, encoder, chars, val_fraction, seed, source, num_proc, max_tokens,
                             progress)
    return meta


def _write_corpus(out_dir, documents, encoder, chars, val_fraction, seed, source, num_proc, max_tokens, progress):
    encoding = encoder.name
    rng = np.random.default_rng(seed)
    counts = {"train": [0, 0], "val": [0, 0]}  # tokens, documents
    eot = np.array([encoder.eot_token])
    bar = tqdm(desc=f"encoding ({encoding})", unit="tok", unit_scale=True, disable=not progress, dynamic_ncols=True)
    encoded = encoded_chunks(documents(), encoder, num_proc or min(8, os.cpu_count() or 1))
    with TokenWriter(token_path(out_dir, "train"), encoder.dtype) as train_writer, \
            TokenWriter(token_path(out_dir, "val"), encoder.dtype) as val_writer, contextlib.closing(encoded), \
            contextlib.closing(bar):  # closed on an error too, so that the error starts a line of its own
        writers = {"train": train_writer, "val": val_writer}
        for tokens in itertools.chain.from_iterable(encoded):
            if len(tokens) == 0:
                continue
            split = "val" if rng.random() < val_fraction else "train"
            writers[split].write(np.concatenate([tokens, eot]))
            counts[split][0] += len(tokens) + 1
            counts[split][1] += 1
            bar.update(len(tokens) + 1)
            if max_tokens and counts["train"][0] + counts["val"][0] >= max_tokens:
                break
        bar.close()
        for split, (_, n_docs) in counts.items():
            if n_docs == 0:
                total = counts["train"][1] + counts["val"][1]
                raise ValueError(f"the {split} split is empty: {total} non-empty document(s) in {source or 'the input'}"
                                 f" with val_fraction={val_fraction}; give more documents (e.g. --doc_separator to "
                                 f"split text files) or change --val_fraction")
    meta = {"encoding": encoding, "vocab_size": encoder.vocab_size, "dtype": np.dtype(encoder.dtype).name,
            "eot_token": encoder.eot_token, "train_tokens": counts["train"][0], "val_tokens": counts["val"][0],
            "train_documents": counts["train"][1], "val_documents": counts["val"][1], "source": source,
            "val_fraction": val_fraction, "seed": seed}
    if chars is not None:
        meta["chars"] = chars
    write_meta(out_dir, meta)
    return meta


def prepare_files(inputs, out_dir, text_field="text", doc_separator=None, pattern="*", source=None, **options):
    """prepare() on files and folders; options as for prepare()."""
    files = find_files(inputs, pattern)
    return prepare(lambda: read_documents(files, text_field, doc_separator), out_dir,
                   source=source or ", ".join(str(i) for i in inputs), **options)


def fetch(source, path):
    """A local copy of source: source itself if it is a file, else the URL downloaded once to path."""
    if os.path.isfile(source):
        return source
    if not os.path.exists(path):
        print(f"downloading {source} to {path}")
        try:
            atomic_write(path, lambda tmp: urllib.request.urlretrieve(source, tmp))
        except (OSError, ValueError) as e:
            raise ConnectionError(f"could not download {source} ({e}); offline, pass a local copy with "
                                  f"--input=PATH") from None
    return path


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def open_fraction(text):
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be between 0 and 1")
    return value


def add_options(parser, encoding="gpt2"):
    """The options every corpus's prepare.py shares."""
    parser.add_argument("--encoding", default=encoding, choices=ENCODINGS)
    parser.add_argument("--val_fraction", type=open_fraction, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_proc", type=positive_int, default=None,
                        help="encoding processes (default: CPUs, at most 8)")
    parser.add_argument("--max_tokens", type=positive_int, default=None, help="stop after about this many tokens")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a corpus of another source or encoding that --out_dir holds")


def options(args):
    return {"encoding": args.encoding, "val_fraction": args.val_fraction, "seed": args.seed,
            "num_proc": args.num_proc, "max_tokens": args.max_tokens, "overwrite": args.overwrite}


def run_preparer(main, argv):
    """A preparer's command line: run_main's one-line errors, and an interrupt (Ctrl-C, or SIGTERM, which
    would otherwise end the process without cleaning up) also ends it with one line, after the staging folder
    is removed; exit status 128 + the signal's number, as a shell reports a process that a signal ended."""
    def terminate(signum, frame):
        raise Interrupted("SIGTERM")
    signal.signal(signal.SIGTERM, terminate)
    try:
        run_main(main, argv)
    except KeyboardInterrupt as e:
        message = str(e) if str(e).startswith("interrupted") else f"interrupted{f' ({e})' if str(e) else ''}"
        print(f"error: {message}", file=sys.stderr)
        sys.exit(128 + (signal.SIGTERM if isinstance(e, Interrupted) else signal.SIGINT))


def report(meta, out_dir):
    print(f"wrote {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens ({meta['train_documents']:,} + "
          f"{meta['val_documents']:,} documents, {meta['encoding']}, vocab {meta['vocab_size']:,}, {meta['dtype']}) "
          f"to {out_dir}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="text files, folders, .jsonl or .parquet files")
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--text_field", default="text", help="field (.jsonl) or column (.parquet) of the text")
    parser.add_argument("--doc_separator", default=None,
                        help="split text files into documents at this string (escapes such as \\n are decoded)")
    parser.add_argument("--glob", default="*", help="which files of a folder to read, e.g. '*.md'")
    add_options(parser)
    args = parser.parse_args(argv)
    separator = args.doc_separator.encode().decode("unicode_escape") if args.doc_separator else None
    meta = prepare_files(args.inputs, args.out_dir, args.text_field, separator, args.glob, **options(args))
    report(meta, args.out_dir)
    return meta


if __name__ == "__main__":
    run_preparer(main, sys.argv[1:])
