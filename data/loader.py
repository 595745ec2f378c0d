"""Memory-mapped token data: random windows for training, a fixed deterministic set for validation."""
import os

import numpy as np
import torch

from data.tokens import read_meta


class TokenData:
    def __init__(self, data_dir, block_size, vocab_size):
        self.data_dir, self.block_size = data_dir, block_size
        self.meta = read_meta(data_dir)
        self.dtype = np.dtype(self.meta["dtype"])
        if self.meta["vocab_size"] > vocab_size:
            raise ValueError(f"the data in {data_dir} has vocab_size {self.meta['vocab_size']} but the model only "
                             f"{vocab_size}: set --vocab_size={self.meta['vocab_size']} or larger")
        for split in ("train", "val"):
            path = os.path.join(data_dir, f"{split}.bin")
            if not os.path.exists(path) or os.path.getsize(path) == 0:
                raise FileNotFoundError(f"{path} is missing or empty: run the corpus's prepare.py again")
            if os.path.getsize(path) % self.dtype.itemsize:
                raise ValueError(f"{path} is not a whole number of {self.dtype} tokens: it is corrupt or meta.json "
                                 f"names the wrong dtype; run the corpus's prepare.py again")
            n = os.path.getsize(path) // self.dtype.itemsize
            if n <= block_size:
                raise ValueError(f"{path} holds {n} tokens, not more than block_size={block_size}: "
                                 f"use a smaller block_size or more data")

    def tokens(self, split):
        # a fresh memmap per batch: numpy memmaps otherwise keep every page they touched in memory
        return np.memmap(os.path.join(self.data_dir, f"{split}.bin"), dtype=self.dtype, mode="r")

    def batch(self, split, starts):
        data = self.tokens(split)
        x = torch.from_numpy(np.stack([data[s:s + self.block_size].astype(np.int64) for s in starts]))
        y = torch.from_numpy(np.stack([data[s + 1:s + 1 + self.block_size].astype(np.int64) for s in starts]))
        return x, y

    def train_batch(self, batch_size, generator):
        n = len(self.tokens("train")) - self.block_size
        return self.batch("train", torch.randint(n, (batch_size,), generator=generator).tolist())

    def val_batches(self, batch_size, n_batches):
        """The same windows every call: evenly spaced over the val split."""
        n = len(self.tokens("val")) - self.block_size
        starts = np.linspace(0, n - 1, batch_size * n_batches).astype(np.int64).tolist()
        return [self.batch("val", starts[i:i + batch_size]) for i in range(0, len(starts), batch_size)]
