"""Token files shared by every corpus: <dir>/train.bin, <dir>/val.bin (flat arrays of token ids, documents
separated by the end-of-text token) and <dir>/meta.json describing them."""
import json
import os

import numpy as np


def token_dtype(vocab_size):
    return np.uint16 if vocab_size <= 2 ** 16 else np.uint32


def write_tokens(out_dir, split, documents, dtype, eot_token):
    """Write documents (iterable of int arrays) to <out_dir>/<split>.bin, replacing any previous file.
    Streams to a temporary file and renames it, so an interrupted run never leaves half a corpus."""
    path = os.path.join(out_dir, f"{split}.bin")
    n_tokens = n_docs = 0
    with open(path + ".tmp", "wb") as f:
        for doc in documents:
            tokens = np.append(np.asarray(doc, dtype=dtype), np.array([eot_token], dtype=dtype))
            f.write(tokens.tobytes())
            n_tokens += len(tokens)
            n_docs += 1
    os.replace(path + ".tmp", path)
    return n_tokens, n_docs


def write_meta(out_dir, meta):
    path = os.path.join(out_dir, "meta.json")
    with open(path + ".tmp", "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(path + ".tmp", path)


def read_meta(data_dir):
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: prepare the corpus first, e.g. "
                                f"python {os.path.join(data_dir, 'prepare.py')}")
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is corrupt ({e}); run the corpus's prepare.py again") from None


def codec(encoding):
    """(encode, decode) for an encoding name from meta.json: 'bytes' or a tiktoken encoding."""
    if encoding == "bytes":
        return (lambda text: list(text.encode("utf-8"))), (lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    import tiktoken
    enc = tiktoken.get_encoding(encoding)
    return (lambda text: enc.encode(text, allowed_special="all")), enc.decode
