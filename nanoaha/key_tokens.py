"""Key tokens: the targets of an evaluation window that a copy could predict only from beyond the local window.
Average loss hides them; evaluation reports the loss on key targets and on the others apart
(nanoaha/evaluation.py, train.py).

The rule, model-free. A window holds tokens x[0..T]: inputs x[0..T-1], targets y[t] = x[t+1], the model
predicting y[t] at position t. For (k, window, n_sink), target y[t] is a *key token* when
- the k input tokens ending at t, x[t-k+1..t] (so t >= k-1), also end at an earlier position s < t,
  x[s-k+1..s] == x[t-k+1..t], followed by the same next token, x[s+1] == x[t+1]: an occurrence a copy
  (induction) head could copy the target from; its *copy source* is position s+1;
- at least one copy source lies beyond what local attention at t sees: s+1 <= t - window (the window is keys
  t-window+1 .. t) and s+1 >= n_sink (the first n_sink positions are sinks, which local attention also sees);
- and no copy source lies where local attention sees it: not in t-window+1 .. t, not below n_sink (if local
  attention can copy the target, long context is not needed for it).

Only a window's own tokens count (each window of a batch is labelled alone), and the rule depends on the text,
k, window and n_sink, never on a model. It is LongPPL-like: LongPPL (Fang et al., "What is Wrong with
Perplexity for Long-context Language Modeling?", ICLR 2025) picks key tokens by the log-probability a model
gains from long over short context; this is the model-free copy version of that question. Its limit: not every
long-range dependency is a verbatim copy (a name used again in another form, a closing bracket, a fact
restated), and a copy the rule finds may be predictable without one.

How: every k+1 tokens x[c-k..c] (a k-gram and the token after it) get an exact id per window; the copy sources
of the target ending at c are the earlier positions c' < c with the same id. Per id, the first position and
the first one at or past the sinks, and per position the previous one with the same id, decide the label:
O(B T log T) time and O(B T k) memory, so 8192-token windows need no chunking.
"""
import torch

BYTE_KEY_K, BPE_KEY_K = 8, 4  # byte-level text needs a longer match than BPE (GPT-2 tokens: ~3-4 bytes of code)


def default_key_k(vocab_size):
    """The default k of a corpus: 8 for byte-level ones (vocab <= 256), 4 for BPE."""
    return BYTE_KEY_K if vocab_size <= 256 else BPE_KEY_K


def check_key_k(key_k):
    """One line for a key_k that is not a k (0 stands for the default)."""
    if isinstance(key_k, bool) or not isinstance(key_k, int) or key_k < 0:
        raise ValueError(f"key_k={key_k!r}: give the length of the matched k-gram, an integer >= 1 (0: the "
                         f"default, {BYTE_KEY_K} for byte-level corpora, {BPE_KEY_K} for BPE)")


def resolve_key_k(key_k, vocab_size):
    """key_k as set (0: the corpus' default), checked."""
    check_key_k(key_k)
    return key_k or default_key_k(vocab_size)


def key_token_labels(tokens, k, window, n_sink=0):
    """(B, T) bool: which targets of each window are key tokens (module docstring). tokens: (B, T + 1), each
    row a window's inputs followed by its last target."""
    if k < 1 or window < 1 or n_sink < 0:
        raise ValueError(f"key tokens need k >= 1, window >= 1 and n_sink >= 0, not k={k}, window={window}, "
                         f"n_sink={n_sink}")
    tokens = torch.as_tensor(tokens, dtype=torch.long).cpu()
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens of shape {tuple(tokens.shape)}: give (windows, T + 1) with T >= 1")
    B, T = tokens.shape[0], tokens.shape[1] - 1
    labels = torch.zeros(B, T, dtype=torch.bool)
    n = T + 1 - k  # positions c = k .. T end a k-gram followed by a token: targets t = c - 1 = k-1 .. T-1
    if n < 1:
        return labels
    grams = tokens.unfold(1, k + 1, 1)  # (B, n, k + 1): x[c-k .. c] for c = k .. T
    # exact ids (no hash collisions); the window's index is part of the row, so windows never match each other
    rows = torch.cat([torch.arange(B).repeat_interleave(n)[:, None], grams.reshape(B * n, k + 1)], 1)
    ids = torch.unique(rows, dim=0, return_inverse=True)[1]
    ends = torch.arange(k, T + 1).repeat(B)  # each row's last position c
    never = T + 1  # past every position
    first = torch.full((int(ids.max()) + 1,), never).scatter_reduce(0, ids, ends, "amin")
    past_sinks = torch.where(ends >= n_sink, ends, never)
    first_past_sinks = torch.full_like(first, never).scatter_reduce(0, ids, past_sinks, "amin")
    # the previous position with the same id: a stable sort keeps each id's positions in order
    order = torch.sort(ids, stable=True)[1]
    same = ids[order][1:] == ids[order][:-1]
    previous = torch.full_like(ends, -1)
    previous[order[1:]] = torch.where(same, ends[order][:-1], -1)
    in_window = (previous >= 0) & (previous >= ends - window)    # the latest source is in c-window .. c-1
    in_sinks = first[ids] < torch.clamp(ends, max=n_sink)         # a source below n_sink (and below c)
    beyond = first_past_sinks[ids] <= ends - 1 - window           # a source in n_sink .. t - window
    labels[:, k - 1:] = (beyond & ~in_window & ~in_sinks).view(B, n)
    return labels


def batch_key_labels(x, y, k, window, n_sink=0):
    """Key-token labels (B, T) of a batch's targets y (inputs x): False where y carries no loss (-1)."""
    # x[t+1] is y[t] for every t but the last; a masked last target (-1) matches nothing earlier
    tokens = torch.cat([x.cpu(), y[:, -1:].cpu()], 1)
    return key_token_labels(tokens, k, window, n_sink) & (y != -1).cpu()
