"""Token files shared by every corpus and task: <dir>/<split>.bin (a flat array of token ids, each document
followed by the end-of-text token), optional per-token arrays <dir>/<split>.<name>.bin aligned with it, and
<dir>/meta.json describing them. Also the encodings that turn text into token ids.

A preparer writes a corpus through replacing_corpus(): the new files are built in a staging folder inside the
corpus folder and renamed into place only when all are complete, meta.json last, so a failed or interrupted
preparation leaves the previous corpus whole."""
import contextlib
import json
import os
import shutil
import signal
import threading

import numpy as np

from data.atomic_files import write_json
from data.processes import pid_alive

TIKTOKEN_ENCODINGS = ("gpt2", "cl100k_base", "o200k_base", "r50k_base", "p50k_base")
ENCODINGS = ("gpt2", "cl100k_base", "o200k_base", "bytes", "char")


def token_dtype(vocab_size):
    return np.uint16 if vocab_size <= 2 ** 16 else np.uint32


def token_path(data_dir, split, array=None):
    return os.path.join(data_dir, f"{split}.bin" if array is None else f"{split}.{array}.bin")


class TokenWriter:
    """Streams arrays to a file through <path>.tmp, renamed into place only when the block exits without an
    error: an interrupted run never leaves a half-written file under the real name, and a re-run replaces."""

    def __init__(self, path, dtype):
        self.path, self.dtype = path, np.dtype(dtype)
        self.count = 0

    def __enter__(self):
        self.file = open(self.path + ".tmp", "wb")
        return self

    def write(self, array):
        array = np.asarray(array)
        if array.size and (array.min() < 0 or array.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"{self.path}: values outside the range of {self.dtype}")
        self.file.write(array.astype(self.dtype, copy=False).tobytes())
        self.count += array.size

    def __exit__(self, error_type, error, traceback):
        self.file.close()
        if error_type is None:
            os.replace(self.path + ".tmp", self.path)
        else:
            os.remove(self.path + ".tmp")


def write_tokens(out_dir, split, documents, dtype, eot_token):
    """Write documents (iterable of int arrays), each followed by eot_token, to <out_dir>/<split>.bin.
    Returns (tokens written, documents written)."""
    n_docs = 0
    with TokenWriter(token_path(out_dir, split), dtype) as writer:
        for doc in documents:
            writer.write(doc)
            writer.write([eot_token])
            n_docs += 1
    return writer.count, n_docs


def write_meta(out_dir, meta):
    write_json(os.path.join(out_dir, "meta.json"), meta, indent=2)


def read_meta(data_dir):
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: prepare the corpus first, e.g. {prepare_hint(data_dir)}")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is corrupt ({e}); prepare the corpus again, e.g. {prepare_hint(data_dir)}") \
                from None


DATA_DIR = os.path.dirname(os.path.abspath(__file__))  # the repository's data/: the preparers


def shown(path):
    """path as a user can type it here: relative to the working directory when inside it, else absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def prepare_hint(data_dir, meta=None):
    """A command that (re)prepares the corpus in data_dir, for error messages; it names only preparers that
    exist. A synthetic task (meta.json has 'task', or, without meta.json, a folder named after a task and
    without a prepare.py of its own) is written by data/synthetic/prepare.py; a corpus with its own
    <data_dir>/prepare.py by that; any other by data/prepare.py from its input files."""
    from data.synthetic.tasks import TASKS
    own = os.path.join(data_dir, "prepare.py")
    out = f"--out_dir={data_dir}"
    synthetic = shown(os.path.join(DATA_DIR, "synthetic", "prepare.py"))
    if meta and "task" in meta:
        options = "".join(f" --{k}={meta[k]}" for k in ("window", "n_sink") if k in meta)
        if meta.get("example_len"):
            options = f" --block_size={meta['example_len'] - 1}" + options
        return f"python {synthetic} --task={meta['task']}{options} {out} (and the task's options)"
    if os.path.isfile(own):
        return f"python {own}"
    name = os.path.basename(os.path.normpath(data_dir))
    if meta is None and name in TASKS:
        return f"python {synthetic} --task={name} {out} (and the task's options)"
    files = f"python {shown(os.path.join(DATA_DIR, 'prepare.py'))} FILES {out}"
    if meta is not None:
        return f"{files} (it was prepared from {meta.get('source') or 'unknown input'})"
    return f"{files} for text, or python {synthetic} --task=TASK {out} for a synthetic task"


# ---------------------------------------------------------------------------------------- replacing a corpus

IDENTITY = ("task", "source", "encoding")  # what a corpus is: a re-preparation may change anything else


def describe(meta):
    what = f"task {meta['task']!r}" if meta.get("task") else repr(meta.get("source") or "unknown input")
    return f"{what}, encoding {meta.get('encoding')}"


def check_replaceable(out_dir, new, overwrite):
    """Raises unless out_dir holds no corpus, or one with the same identity (meta.json's task, source and
    encoding) as the meta dict `new`, or overwrite is set."""
    try:
        old = read_meta(out_dir)
    except (OSError, ValueError):  # no corpus there, or one whose meta.json is unreadable: nothing to keep
        return
    if overwrite or [old.get(k) for k in IDENTITY] == [new.get(k) for k in IDENTITY]:
        return
    raise FileExistsError(f"{out_dir} holds a corpus of {describe(old)}, not of {describe(new)}: pass --overwrite to "
                          f"replace it, or choose another --out_dir")


class Interrupted(KeyboardInterrupt):
    """A termination signal (SIGTERM), raised where Ctrl-C raises KeyboardInterrupt."""


def _corpus_files(meta):
    """The files of the corpus meta describes, meta.json last."""
    names = [f"{split}.{array}.bin" for split in ("train", "val") for array in meta.get("token_arrays", {})]
    return ["train.bin", "val.bin", *names, "meta.json"]


def _with_note(error, note):
    """error with note appended to its message, of its own type where that takes a message alone."""
    if isinstance(error, KeyboardInterrupt):
        return type(error)(f"interrupted{f' ({error})' if str(error) else ''}; {note}")
    for kind in (ValueError, OSError, ImportError):
        if isinstance(error, kind):
            try:
                return type(error)(f"{error}; {note}")
            except Exception:
                return kind(f"{error}; {note}")
    return None


STAGING = ".preparing."  # + the preparer's pid: the staging folder inside the corpus folder


@contextlib.contextmanager
def replacing_corpus(out_dir):
    """Yields a staging folder inside out_dir, where the preparer writes the whole new corpus (token files,
    arrays, meta.json). When the block completes, every file is renamed into out_dir, meta.json last, and the
    previous corpus's files that the new one lacks are removed: a reader sees the old meta.json until every new
    token file is in place. An error or an interrupt removes the staging folder and leaves the previous corpus
    whole; the error raised says so. (Renames within one folder are atomic; the swap of several files is not,
    but it takes microseconds, meta.json comes last, and a Ctrl-C or SIGTERM is handled only after it.)"""
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):  # left by a preparer that was killed (SIGKILL): nothing else removes them
        pid = name[len(STAGING):]
        if name.startswith(STAGING) and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)
    had_corpus = os.path.exists(os.path.join(out_dir, "meta.json"))
    staging = os.path.join(out_dir, f"{STAGING}{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.mkdir(staging)
    try:
        yield staging
        with open(os.path.join(staging, "meta.json")) as f:
            meta = json.load(f)
        new_files = _corpus_files(meta)
        missing = [name for name in new_files if not os.path.isfile(os.path.join(staging, name))]
        if missing:
            raise FileNotFoundError(f"the preparer wrote no {', '.join(missing)}")
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        noted = _with_note(e, f"the corpus in {out_dir} is unchanged" if had_corpus else
                           f"no corpus was written to {out_dir}")
        if noted is None:
            raise
        raise noted.with_traceback(e.__traceback__) from None
    try:
        old = read_meta(out_dir) if had_corpus else {}
    except ValueError:
        old = {}
    with signals_held():  # a Ctrl-C or SIGTERM now waits until every file is in place: no half-swapped corpus
        for name in new_files:
            os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
        for name in set(_corpus_files(old)) - set(new_files):  # arrays the new corpus does not have
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(out_dir, name))
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def signals_held(signals=(signal.SIGINT, signal.SIGTERM)):
    """Handles these signals only when the block ends: their handlers (which raise, or end the process) are
    replaced by ones that only take note, and the first noted signal is handled on the way out. (Blocking them
    with pthread_sigmask would not do: another thread, tqdm's monitor for one, would take them.)"""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    received = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append((signum, frame)))
                for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum, frame in received[:1]:
            if callable(previous[signum]):
                previous[signum](signum, frame)
            elif previous[signum] == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


def load_tiktoken(name):
    """A tiktoken encoding; when its files can be neither found in the cache nor downloaded, an error that
    says where tiktoken looked and how to fix it."""
    import tiktoken
    try:
        return tiktoken.get_encoding(name)
    except (OSError, ValueError) as e:  # no network (requests' errors are OSErrors), or a corrupt download
        cache = os.environ.get("TIKTOKEN_CACHE_DIR")
        where = f"TIKTOKEN_CACHE_DIR={cache} does not hold them" if cache else "TIKTOKEN_CACHE_DIR is not set"
        raise OSError(
            f"tiktoken could not load the files of the {name!r} encoding ({type(e).__name__}: {e}); {where}. "
            f"Online, tiktoken downloads them once into its cache. Offline, run "
            f"`TIKTOKEN_CACHE_DIR=DIR python -c \"import tiktoken; tiktoken.get_encoding('{name}')\"` on a machine "
            f"with internet, copy DIR here and set TIKTOKEN_CACHE_DIR=DIR") from None


class Encoder:
    """One encoding: vocab_size, eot_token, encode(text) -> np.ndarray of ids (special-token text such as
    '<|endoftext|>' inside a document is encoded as ordinary text, so only the preparer writes end-of-text
    tokens), decode(ids) -> str.

    'bytes': UTF-8 bytes, vocab 256; the end-of-text token is byte 0 (NUL), removed from the text.
    'char': one id per character of `chars` (the corpus's character set, kept in meta.json), end-of-text last.
    Others: tiktoken encodings."""

    def __init__(self, name, chars=None):
        if name not in ENCODINGS + TIKTOKEN_ENCODINGS:
            raise ValueError(f"unknown encoding {name!r}; choose one of {', '.join(ENCODINGS)}")
        self.name, self.chars = name, chars
        if name == "bytes":
            self.vocab_size, self.eot_token = 256, 0
        elif name == "char":
            if not chars:
                raise ValueError("the 'char' encoding needs the corpus's character set (meta.json 'chars')")
            self.codepoints = np.array([ord(c) for c in chars])
            if np.any(np.diff(self.codepoints) <= 0):
                raise ValueError("'chars' must be sorted and without repeats")
            self.vocab_size, self.eot_token = len(chars) + 1, len(chars)
        else:
            self.tiktoken = load_tiktoken(name)
            self.vocab_size, self.eot_token = self.tiktoken.n_vocab, self.tiktoken.eot_token
        self.dtype = token_dtype(self.vocab_size)

    def encode(self, text):
        if self.name == "bytes":
            return np.frombuffer(text.encode("utf-8").replace(b"\0", b""), dtype=np.uint8).astype(self.dtype)
        if self.name == "char":
            codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            ids = np.searchsorted(self.codepoints, codepoints).clip(max=len(self.codepoints) - 1)
            unknown = self.codepoints[ids] != codepoints
            if unknown.any():
                raise ValueError(f"character {chr(codepoints[unknown][0])!r} is not in the char vocabulary")
            return ids.astype(self.dtype)
        return np.array(self.tiktoken.encode_ordinary(text), dtype=self.dtype)

    def decode(self, ids):
        ids = [int(i) for i in ids]
        if self.name == "bytes":
            return bytes(ids).decode("utf-8", errors="replace")
        if self.name == "char":
            return "".join(self.chars[i] if i < len(self.chars) else "<|endoftext|>" for i in ids)
        return self.tiktoken.decode(ids)


def codec(encoding, chars=None):
    """(encode, decode) for prompts and samples; encoding and chars as in meta.json."""
    if encoding == "synthetic":  # task token ids (data/synthetic/), written as numbers
        return (lambda text: [int(t) for t in text.split()]), (lambda ids: " ".join(str(int(i)) for i in ids))
    encoder = Encoder(encoding, chars)
    if encoding in ("bytes", "char"):
        return (lambda text: encoder.encode(text).tolist()), encoder.decode
    return (lambda text: encoder.tiktoken.encode(text, allowed_special="all")), encoder.decode
