"""Memory-mapped token data: random windows for training, a fixed deterministic set for validation.

Where a window may start:
- anywhere (the default);
- right after an end-of-text token or at 0, with doc_aligned_windows=True, so every window opens with the
  start of a document (it may run on into the next ones);
- at the start of an example, when meta.json has 'example_len' (synthetic tasks): the data is a sequence of
  fixed-length examples and a window is one whole example, so block_size must be example_len - 1.

Per-token arrays named in meta.json's 'token_arrays' (<split>.<name>.bin, uint8, entry i describing token i)
come along: 'loss_mask' is applied to the targets (-1 where it is 0, so those tokens carry no loss), and
token_array() reads any of them aligned with the targets.
"""
import os

import numpy as np
import torch

from data.tokens import prepare_hint, read_meta, token_path


class TokenData:
    def __init__(self, data_dir, block_size, vocab_size, doc_aligned_windows=False):
        self.data_dir, self.block_size = data_dir, block_size
        self.meta = read_meta(data_dir)
        self.dtype = np.dtype(self.meta["dtype"])
        self.arrays = self.meta.get("token_arrays", {})
        if self.meta["vocab_size"] > vocab_size:
            raise ValueError(f"the data in {data_dir} has vocab_size {self.meta['vocab_size']} but the model only "
                             f"{vocab_size}: set --vocab_size={self.meta['vocab_size']} or larger")
        example_len = self.meta.get("example_len")
        if example_len and block_size != example_len - 1:
            raise ValueError(f"the data in {data_dir} holds examples of {example_len} tokens: set "
                             f"--block_size={example_len - 1} so that a window is one example")
        self.starts = {}
        for split in ("train", "val"):
            n = self.check_files(split)
            self.meta.setdefault(f"{split}_tokens", n)  # checkpoints record it: resuming checks the data
            if n <= block_size:
                raise ValueError(f"{token_path(data_dir, split)} holds {n} tokens, not more than "
                                 f"block_size={block_size}: use a smaller block_size or more data")
            if example_len:
                if n % example_len:
                    raise ValueError(f"{token_path(data_dir, split)} holds {n:,} tokens, not a whole number of "
                                     f"examples of {example_len}: prepare it again, e.g. {self.hint()}")
                self.starts[split] = np.arange(0, n, example_len)
            elif doc_aligned_windows:
                self.starts[split] = self.document_starts(split)
            else:
                self.starts[split] = None  # every position up to n - block_size - 1

    def hint(self):
        """The command that prepares this corpus again (for error messages)."""
        return prepare_hint(self.data_dir, self.meta)

    def check_files(self, split):
        """Checks the token file and its arrays against meta.json; returns the number of tokens."""
        path = token_path(self.data_dir, split)
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            raise FileNotFoundError(f"{path} is missing or empty: prepare the corpus again, e.g. "
                                    f"{self.hint()}")
        size = os.path.getsize(path)
        expected = self.meta.get(f"{split}_tokens")
        if size % self.dtype.itemsize or (expected is not None and size != expected * self.dtype.itemsize):
            said = f"{expected:,} {self.dtype} tokens" if expected is not None else f"{self.dtype} tokens"
            raise ValueError(f"{path} has {size:,} bytes but meta.json says {said}: the file is corrupt or meta.json "
                             f"names the wrong dtype; prepare it again, e.g. {self.hint()}")
        n = size // self.dtype.itemsize
        for name in self.arrays:
            array_path = token_path(self.data_dir, split, name)
            if not os.path.exists(array_path) or os.path.getsize(array_path) != n:
                raise ValueError(f"{array_path} should hold one uint8 per token ({n:,} bytes) but is missing or "
                                 f"of another size; prepare it again, e.g. {self.hint()}")
        return n

    def document_starts(self, split):
        """0 and every position after an end-of-text token that leaves room for a whole window."""
        data = self.tokens(split)
        eot, step = self.meta["eot_token"], 1 << 24
        after_eot = [np.flatnonzero(data[i:i + step] == eot) + i + 1 for i in range(0, len(data), step)]
        starts = np.concatenate([[0], *after_eot])
        starts = starts[starts < len(data) - self.block_size]
        if len(starts) == 0:
            raise ValueError(f"no document of {token_path(self.data_dir, split)} starts early enough for a window of "
                             f"block_size={self.block_size}: use a smaller block_size or doc_aligned_windows=False")
        return starts

    def tokens(self, split, array=None):
        # a fresh memmap per batch: numpy memmaps otherwise keep every page they touched in memory
        dtype = self.dtype if array is None else np.uint8
        return np.memmap(token_path(self.data_dir, split, array), dtype=dtype, mode="r")

    def windows(self, split, starts, offset, array=None):
        data = self.tokens(split, array)
        return torch.from_numpy(np.stack([data[s + offset:s + offset + self.block_size].astype(np.int64)
                                          for s in starts]))

    def batch(self, split, starts):
        """(x, y) for windows starting at starts; y is -1 where the loss mask says a target carries no loss."""
        x, y = self.windows(split, starts, 0), self.windows(split, starts, 1)
        top = max(int(x.max()), int(y.max()))
        if top >= self.meta["vocab_size"]:
            raise ValueError(f"{token_path(self.data_dir, split)} holds token id {top} but meta.json says "
                             f"vocab_size {self.meta['vocab_size']}: prepare it again, e.g. {self.hint()}")
        if "loss_mask" in self.arrays:
            y[self.token_array(split, "loss_mask", starts) == 0] = -1
        return x, y

    def token_array(self, split, name, starts):
        """The per-token array `name` for the windows at starts, aligned with the targets y."""
        return self.windows(split, starts, 1, name)

    def train_starts(self, n, generator):
        """n random window starts of the train split, drawn from generator."""
        starts = self.starts["train"]
        if starts is None:
            return torch.randint(len(self.tokens("train")) - self.block_size, (n,), generator=generator).tolist()
        return starts[torch.randint(len(starts), (n,), generator=generator).numpy()].tolist()

    def train_batch(self, batch_size, generator):
        return self.batch("train", self.train_starts(batch_size, generator))

    def val_starts(self, n):
        """n window starts, the same every call: evenly spaced over the val split."""
        starts = self.starts["val"]
        count = len(self.tokens("val")) - self.block_size if starts is None else len(starts)
        picks = np.linspace(0, count - 1, n).astype(np.int64)
        return (picks if starts is None else starts[picks]).tolist()

    def val_batches(self, batch_size, n_batches):
        starts = self.val_starts(batch_size * n_batches)
        return [self.batch("val", starts[i:i + batch_size]) for i in range(0, len(starts), batch_size)]
