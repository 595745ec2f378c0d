"""The key-token rule (nanoaha/key_tokens.py) on hand-made windows, and against a slow loop that spells it out."""
import random

import pytest
import torch

from nanoaha.key_tokens import batch_key_labels, default_key_k, key_token_labels, resolve_key_k

FILLER = [10, 11, 12, 13, 14, 15]  # tokens that occur once: no match of their own


def keys(window_tokens, k, window, n_sink=0):
    """The targets t (y[t] = x[t+1]) of one window that are key tokens."""
    return key_token_labels(torch.tensor([window_tokens]), k, window, n_sink)[0].nonzero().flatten().tolist()


def slow_keys(x, k, window, n_sink):
    """The rule as written in the module docstring, one target at a time."""
    found = []
    for t in range(len(x) - 1):
        sources = [s + 1 for s in range(k - 1, t) if t >= k - 1
                   and x[s - k + 1:s + 1] == x[t - k + 1:t + 1] and x[s + 1] == x[t + 1]]
        seen_locally = [c for c in sources if t - window + 1 <= c <= t or c < n_sink]
        beyond = [c for c in sources if n_sink <= c <= t - window]
        if beyond and not seen_locally:
            found.append(t)
    return found


def test_a_repeat_beyond_the_window_is_key_and_inside_it_is_not():
    x = [1, 2, 3, *FILLER, 1, 2, 3]  # target t=10 (the second 3): context (1, 2), copy source position 2
    assert keys(x, k=2, window=4) == [10]
    assert keys(x, k=2, window=8) == [10]  # the source at t - window: just outside the window
    assert keys(x, k=2, window=9) == []    # ... and one more position of window sees it


def test_a_repeat_followed_by_another_token_is_not_key():
    assert keys([1, 2, 3, *FILLER, 1, 2, 4], k=2, window=4) == []


def test_a_match_of_k_minus_1_tokens_is_not_key():
    x = [5, 1, 2, 3, *FILLER, 6, 1, 2, 3]  # (1, 2) -> 3 repeats, (x, 1, 2) -> 3 does not
    assert keys(x, k=2, window=4) == [12]
    assert keys(x, k=3, window=4) == []


def test_a_source_only_in_the_sinks_is_not_key():
    x = [1, 2, 3, *FILLER, 1, 2, 3]  # the copy source is position 2
    assert keys(x, k=2, window=4, n_sink=3) == []    # a sink: local attention sees it
    assert keys(x, k=2, window=4, n_sink=2) == [10]  # past the sinks


def test_one_source_beyond_the_window_and_one_inside_is_not_key():
    x = [1, 2, 3, 10, 11, 12, 13, 1, 2, 3, 14, 1, 2, 3]  # (1, 2) -> 3 three times: sources 2, 9
    assert keys(x, k=2, window=4) == [8]       # t=12 also sees its source 9 in the window
    assert keys(x, k=2, window=3) == [8, 12]   # with a shorter window both sources of t=12 are beyond


def test_targets_before_k_minus_1_are_never_key():
    x = [1, 2, 1, 2, 1, 2, 1, 2]
    assert keys(x, k=1, window=1) == [2, 3, 4, 5, 6]  # t=1 has no earlier 2; the others copy from 2 back
    labels = key_token_labels(torch.tensor([x]), 3, 1)[0]
    assert labels[:2].tolist() == [False, False] and labels[2:].any()
    assert key_token_labels(torch.tensor([[1, 2, 3]]), 4, 1).tolist() == [[False, False]]  # shorter than k


def test_windows_of_a_batch_are_labelled_alone():
    first, second = [1, 2, 3, *FILLER, 1, 2, 3], [16, 17, 18, 19, 20, 21, 22, 23, 24, 1, 2, 3]
    together = key_token_labels(torch.tensor([first, second]), 2, 4)
    assert together[0].nonzero().flatten().tolist() == keys(first, 2, 4) == [10]
    assert not together[1].any()  # its (1, 2) -> 3 occurs in the other window only


@pytest.mark.parametrize("seed", range(6))
def test_it_agrees_with_a_slow_loop_on_random_windows(seed):
    rng = random.Random(seed)
    for _ in range(40):
        k, window, n_sink = rng.randint(1, 4), rng.randint(1, 12), rng.choice([0, 0, 1, 3])
        alphabet, T, B = rng.randint(2, 4), rng.randint(1, 60), rng.randint(1, 3)
        x = [[rng.randrange(alphabet) for _ in range(T + 1)] for _ in range(B)]
        labels = key_token_labels(torch.tensor(x), k, window, n_sink)
        assert [row.nonzero().flatten().tolist() for row in labels] == [slow_keys(row, k, window, n_sink)
                                                                         for row in x], (k, window, n_sink, x)


def test_the_random_windows_have_key_and_other_tokens():
    """So that the agreement above is not an agreement on all-False labels."""
    rng = random.Random(0)
    x = [[rng.randrange(3) for _ in range(200)] for _ in range(4)]
    labels = key_token_labels(torch.tensor(x), 3, 8, 1)
    assert 0 < labels.float().mean() < 1


def test_a_batch_labels_its_targets_and_skips_the_unscored_ones():
    tokens = torch.tensor([[1, 2, 3, *FILLER, 1, 2, 3]])
    x, y = tokens[:, :-1], tokens[:, 1:].clone()
    assert batch_key_labels(x, y, 2, 4)[0].nonzero().flatten().tolist() == [10]  # the last target comes from y
    y[0, 10] = -1  # a loss mask: the target carries no loss
    assert not batch_key_labels(x, y, 2, 4).any()


def test_long_windows_match_the_slow_loop_where_checked():
    torch.manual_seed(0)
    x = torch.randint(4, (2, 8193))
    labels = key_token_labels(x, 6, 64, 4)
    assert labels.shape == (2, 8192)
    head = x[0, :301].tolist()  # a window's labels depend only on the tokens up to the target
    assert labels[0, :300].nonzero().flatten().tolist() == slow_keys(head, 6, 64, 4)


def test_default_k_and_bad_settings():
    assert default_key_k(256) == 8 and default_key_k(65) == 8 and default_key_k(50257) == 4
    assert resolve_key_k(0, 256) == 8 and resolve_key_k(0, 50304) == 4 and resolve_key_k(5, 256) == 5
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"key_k=.*integer >= 1 \(0: the default, 8 for byte-level") as e:
            resolve_key_k(bad, 256)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="window >= 1"):
        key_token_labels(torch.tensor([[1, 2, 3]]), 2, 0)
