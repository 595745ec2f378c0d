"""Synthetic long-range tasks whose ground truth says which predictions need distant context.

Each task makes examples of seq_len tokens (an Example) with, per token i, describing the prediction of token i
(made at position i - 1, as the targets of a language model are the inputs shifted by one):
- answer: 1 where token i is an answer the task scores;
- source: the position of the token that this prediction needs, -1 where it needs none (the token is random,
  or follows from the last few tokens), UNKNOWN where nobody knows (real text).
needs_global(source, window, n_sink) turns sources into the label "needs context beyond the window": a local
query at position i - 1 reads positions i - window .. i - 1 and the first n_sink positions (attention sinks), so
the prediction needs global attention iff (i - 1) - source >= window and source >= n_sink. The label is about
one layer's window: a stack of local layers can relay information further, a little at a time, which recall
tasks make hard in practice.

Task tokens have ids offset + 0 .. vocab_size - 1 (offset: the text vocabulary when real text is involved, so
task tokens never collide with text tokens).
"""
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

UNKNOWN = -2
UNKNOWN_LABEL = 255  # needs_global where the source is UNKNOWN


class Example(NamedTuple):
    tokens: np.ndarray  # (seq_len,) int64
    answer: np.ndarray  # (seq_len,) uint8
    source: np.ndarray  # (seq_len,) int64


def needs_global(source, window, n_sink=0):
    """uint8 labels: 1 where the prediction of token i needs a token that a local query at position i - 1 does
    not read (outside its window and not one of the first n_sink positions), 0 where it does not,
    UNKNOWN_LABEL where that is not known."""
    source = np.asarray(source)
    i = np.arange(len(source))
    labels = ((source >= n_sink) & (i - 1 - source >= window)).astype(np.uint8)
    labels[source == UNKNOWN] = UNKNOWN_LABEL
    return labels


def place(rng, lo, hi, n, length):
    """Sorted starts of n non-overlapping spans of `length` tokens inside positions lo .. hi - 1, uniformly
    among all such placements (choose n of the free + n slots, then widen each chosen slot to a span)."""
    free = hi - lo - n * length
    if free < 0:
        raise ValueError(f"{n} spans of {length} tokens do not fit in positions {lo}..{hi - 1}: "
                         f"use a longer block_size or fewer/shorter spans")
    return lo + np.sort(rng.choice(free + n, n, replace=False)) + np.arange(n) * (length - 1)


@dataclass
class Recall:
    """Multi-query associative recall (MQAR, as in Zoology): n_pairs key-value pairs open the example, then
    n_queries of those keys come back at random places, each followed by its value, the answer. Filler tokens
    everywhere else. Keys are distinct, values random: an answer needs the value of its pair, nothing nearer.
    With repeat_queries a pair may be asked several times (n_queries may exceed n_pairs): more answers per
    example, and an answer's source is the latest earlier occurrence of its pair, which may be a query."""
    n_pairs: int = 16
    n_queries: int = 16
    n_keys: int = 64
    n_values: int = 64
    n_filler: int = 16
    min_gap: int = 0  # queries start at least min_gap tokens after the pairs ...
    max_gap: int = 0  # ... and end at most max_gap tokens after them (0: anywhere up to the end)
    repeat_queries: bool = False  # queries drawn with replacement from the pairs

    def validate(self):
        if not 1 <= self.n_pairs <= self.n_keys or self.n_queries < 1:
            raise ValueError(f"need 1 <= n_pairs ({self.n_pairs}) <= n_keys ({self.n_keys}) and n_queries >= 1 "
                             f"({self.n_queries}): pairs have distinct keys")
        if self.n_queries > self.n_pairs and not self.repeat_queries:
            raise ValueError(f"n_queries ({self.n_queries}) > n_pairs ({self.n_pairs}) asks some pair twice: "
                             f"set repeat_queries=True or use n_queries <= n_pairs")

    @property
    def vocab_size(self):
        return self.n_filler + self.n_keys + self.n_values

    def token_ranges(self):
        keys = self.n_filler
        values = keys + self.n_keys
        return {"filler": [0, keys], "keys": [keys, values], "values": [values, values + self.n_values]}

    def example(self, rng, seq_len, offset=0, text=None):
        pairs_end = 2 * self.n_pairs
        hi = min(seq_len, pairs_end + self.max_gap) if self.max_gap else seq_len
        return self.build(seq_len, keys=rng.choice(self.n_keys, self.n_pairs, replace=False),
                          values=rng.integers(self.n_values, size=self.n_pairs),
                          asked=rng.choice(self.n_pairs, self.n_queries, replace=self.repeat_queries),
                          query_starts=place(rng, pairs_end + self.min_gap, hi, self.n_queries, 2),
                          filler=rng.integers(self.n_filler, size=seq_len), offset=offset)

    def build(self, seq_len, keys, values, asked, query_starts, filler, offset=0):
        """The example from its choices: pair p at positions 2p, 2p+1; query q asks pair asked[q] at
        query_starts[q] (key), its answer one later. The source of an answer is the latest earlier value of its
        pair (query_starts are sorted)."""
        ranges = self.token_ranges()
        key_ids, value_ids = ranges["keys"][0] + np.asarray(keys), ranges["values"][0] + np.asarray(values)
        tokens = np.array(filler, dtype=np.int64)
        tokens[0:2 * len(keys):2], tokens[1:2 * len(keys):2] = key_ids, value_ids
        answer, source = np.zeros(seq_len, np.uint8), np.full(seq_len, -1, np.int64)
        latest_value = 2 * np.arange(len(keys)) + 1
        for pair, start in zip(asked, query_starts):
            tokens[start], tokens[start + 1] = key_ids[pair], value_ids[pair]
            answer[start + 1], source[start + 1] = 1, latest_value[pair]
            latest_value[pair] = start + 1
        return Example(tokens + offset, answer, source)


@dataclass
class Copy:
    """Copy / induction: a random span of span_len symbols, repeated later right after a COPY marker. The
    repeat is the answer; each of its tokens needs its counterpart in the first occurrence."""
    span_len: int = 8
    n_symbols: int = 64
    n_filler: int = 16
    min_distance: int = 0  # from the span's start to the repeat's start (0: span_len + 1, the least possible)
    max_distance: int = 0  # 0: as far as the example allows

    def validate(self):
        if self.span_len < 1:
            raise ValueError(f"span_len={self.span_len} must be at least 1")

    @property
    def vocab_size(self):
        return self.n_filler + self.n_symbols + 1

    def token_ranges(self):
        symbols = self.n_filler
        return {"filler": [0, symbols], "symbols": [symbols, symbols + self.n_symbols],
                "copy_marker": [self.vocab_size - 1, self.vocab_size]}

    def example(self, rng, seq_len, offset=0, text=None):
        least = max(self.min_distance, self.span_len + 1)
        most = min(self.max_distance or seq_len, seq_len - self.span_len)
        if least > most:
            raise ValueError(f"no distance in {least}..{most} fits a span of {self.span_len} and its repeat in "
                             f"{seq_len} tokens: use a longer block_size or a shorter span/distance")
        distance = rng.integers(least, most + 1)
        first = rng.integers(0, seq_len - self.span_len - distance + 1)
        return self.build(seq_len, span=rng.integers(self.n_symbols, size=self.span_len), first=first,
                          repeat=first + distance, filler=rng.integers(self.n_filler, size=seq_len), offset=offset)

    def build(self, seq_len, span, first, repeat, filler, offset=0):
        """The span at positions first.., the COPY marker at repeat - 1, the repeated span at repeat.."""
        n = len(span)
        tokens = np.array(filler, dtype=np.int64)
        tokens[first:first + n] = tokens[repeat:repeat + n] = self.token_ranges()["symbols"][0] + np.asarray(span)
        tokens[repeat - 1] = self.token_ranges()["copy_marker"][0]
        answer, source = np.zeros(seq_len, np.uint8), np.full(seq_len, -1, np.int64)
        answer[repeat:repeat + n], source[repeat:repeat + n] = 1, first + np.arange(n)
        return Example(tokens + offset, answer, source)


@dataclass
class Needle:
    """Needle in a haystack: real text with n_needles planted facts "FACT key v_1 .. v_m" (m = value_len), and
    at the end a question "ASK key" followed by that key's value, the answer. Each answer token needs its
    counterpart in the needle; with a single needle the asked key needs the needle's key too. The text tokens'
    needs are unknown."""
    n_needles: int = 1
    value_len: int = 3
    n_keys: int = 64
    n_values: int = 64
    min_distance: int = 0  # from a needle's start to the question's start (0: no limit) ...
    max_distance: int = 0  # ... (0: no limit)

    def validate(self):
        if not 1 <= self.n_needles <= self.n_keys:
            raise ValueError(f"need 1 <= n_needles ({self.n_needles}) <= n_keys ({self.n_keys}): keys are distinct")

    @property
    def vocab_size(self):
        return 2 + self.n_keys + self.n_values

    def token_ranges(self):
        return {"fact_marker": [0, 1], "ask_marker": [1, 2], "keys": [2, 2 + self.n_keys],
                "values": [2 + self.n_keys, self.vocab_size]}

    def example(self, rng, seq_len, offset=0, text=None):
        length = 2 + self.value_len  # of a needle, and of the question
        question = seq_len - length
        lo = max(0, question - self.max_distance) if self.max_distance else 0
        hi = min(question - self.min_distance, question - length) + length
        return self.build(seq_len, keys=rng.choice(self.n_keys, self.n_needles, replace=False),
                          values=rng.integers(self.n_values, size=(self.n_needles, self.value_len)),
                          asked=rng.integers(self.n_needles), needle_starts=place(rng, lo, hi, self.n_needles, length),
                          text=text, offset=offset)

    def build(self, seq_len, keys, values, asked, needle_starts, text, offset=0):
        """Needle j "FACT keys[j] values[j]" at needle_starts[j], the question about needle `asked` at the end,
        text filling the other positions in order. offset applies to the task tokens, not to the text."""
        ranges, length = self.token_ranges(), 2 + self.value_len
        if text is None or len(text) < seq_len:
            raise ValueError(f"the needle task needs at least {seq_len} tokens of text as the haystack")
        key_ids = offset + ranges["keys"][0] + np.asarray(keys)
        value_ids = offset + ranges["values"][0] + np.asarray(values)
        tokens, source = np.zeros(seq_len, np.int64), np.full(seq_len, UNKNOWN, np.int64)
        is_text = np.ones(seq_len, bool)

        def plant(start, marker, key, value):
            tokens[start:start + length] = [offset + ranges[marker][0], key, *value]
            is_text[start:start + length], source[start:start + length] = False, -1

        for start, key, value in zip(needle_starts, key_ids, value_ids):
            plant(start, "fact_marker", key, value)
        question = seq_len - length
        plant(question, "ask_marker", key_ids[asked], value_ids[asked])
        tokens[is_text] = np.asarray(text[:is_text.sum()], dtype=np.int64)
        answer = np.zeros(seq_len, np.uint8)
        answer[question + 2:], source[question + 2:] = 1, needle_starts[asked] + 2 + np.arange(self.value_len)
        if len(keys) == 1:
            source[question + 1] = needle_starts[0] + 1
        return Example(tokens, answer, source)


TASKS = {"recall": Recall, "copy": Copy, "needle": Needle}
