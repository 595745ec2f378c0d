import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import small_config
from model import GPT
from nanoaha.copy_probe import copy_probe, head_scores, head_sums, layer_weights, probe_sequences

SPAN = 20  # > window 8, 2 * SPAN <= block_size 48


def repeated(n=3, span=SPAN, vocab=64, seed=0):
    tokens = np.random.default_rng(seed).integers(vocab, size=n * span * 2)
    return probe_sequences(tokens, span, n)


def test_probe_sequences_repeat_evenly_spaced_spans_and_refuse_overlap():
    tokens = np.arange(100)
    seqs = probe_sequences(tokens, 10, 4)
    assert seqs.shape == (4, 20) and seqs.dtype == torch.int64
    assert seqs[:, :10].tolist() == [list(range(s, s + 10)) for s in (0, 25, 50, 75)]
    assert torch.equal(seqs[:, 10:], seqs[:, :10])
    with pytest.raises(ValueError, match="overlapping"):
        probe_sequences(tokens, 30, 4)
    with pytest.raises(ValueError, match="at least 2"):
        probe_sequences(tokens, 1, 4)


def test_head_scores_of_hand_built_attention():
    span, window, T = 6, 3, 12
    t = torch.arange(T)
    previous = torch.zeros(1, 1, T, T)
    previous[0, 0, t[1:], t[1:] - 1] = 1.0
    previous[0, 0, 0, 0] = 1.0
    copy = torch.eye(T)[None, None].clone()
    copy[0, 0, t[span:], t[span:]] = 0.0
    copy[0, 0, t[span:], t[span:] - span + 1] = 1.0  # second copy reads the token after the earlier occurrence
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    scores = {name: head_scores(head_sums(w, span, window))
              for name, w in (("previous", previous), ("copy", copy), ("uniform", uniform[None, None]))}
    assert scores["previous"]["previous"] == [1.0] and scores["previous"]["induction"] == [0.0]
    assert scores["copy"]["induction"] == [1.0] and scores["copy"]["previous"] == [0.0]
    # uniform causal attention over the first copy: query q puts (q - window + 1) / (q + 1) beyond the window
    far = sum(max(0, q - window + 1) / (q + 1) for q in range(span)) / span
    assert scores["uniform"]["far"] == [pytest.approx(far)]
    assert scores["previous"]["far"] == [0.0] and "global" not in scores["uniform"]
    # routed: batch row 0 global on the second copy; row 0 reads the copy source, row 1 the previous token
    hard = torch.zeros(2, 1, T, dtype=torch.bool)
    hard[0, 0, span:] = True
    routed = head_scores(head_sums(torch.cat([copy, previous]), span, window, hard))
    assert routed["global"] == [0.5] and routed["induction_when_global"] == [1.0]
    # previous-token weight: 1 on row 1's T - 1 queries (all local), 0 on row 0's
    assert routed["previous_when_global"] == [0.0]
    assert routed["previous_when_local"] == [pytest.approx((T - 1) / (T - 1 + span - 1))]
    none_global = head_scores(head_sums(previous, span, window, torch.zeros(1, 1, T, dtype=torch.bool)))
    assert np.isnan(none_global["previous_when_global"][0]) and none_global["previous_when_local"] == [1.0]


@pytest.mark.parametrize("schedule, overrides", [("GL", {}), ("R", {"router_init_std": 1.0}),
                                                  ("R", {"routing": "random", "random_global_q": 0.5}),
                                                  ("LR", {"n_sink": 2, "router_init_std": 1.0})])
def test_layer_weights_are_the_attention_each_layer_computed(schedule, overrides):
    """weights @ v, projected, is each attention module's output: the probe reads what the model used."""
    torch.manual_seed(0)
    model = GPT(small_config(schedule=schedule, **overrides)).eval()
    seen = []
    hooks = [b.attn.register_forward_hook(lambda m, args, out: seen.append((m, args, out))) for b in model.blocks]
    x = repeated()
    with torch.no_grad():
        out = model(x, x)
        for hook in hooks:
            hook.remove()
        for attn, (h, cos, sin, *_), (y, hard, *_) in seen:
            weights = layer_weights(attn, h, cos, sin, hard)
            B, T, C = h.shape
            v = attn.qkv(h).view(B, T, 3, attn.n_head, attn.head_dim).permute(2, 0, 3, 1, 4)[2]
            rebuilt = attn.proj((weights @ v).transpose(1, 2).reshape(B, T, C))
            torch.testing.assert_close(rebuilt, y, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    if "R" in schedule:
        routed = [g for g in out.gates if g is not None]
        assert all(0 < g.float().mean() < 1 for g in routed)  # mixed decisions: both masks were exercised


def test_copy_probe_losses_are_the_first_and_second_copies_same_targets():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="G")).eval()
    seqs = repeated()
    result = copy_probe(model, seqs)
    with torch.no_grad():  # one prefix at a time: the target of each position, without the probe's indexing
        def loss_at(p):
            logits = model(seqs[:, :p + 1]).logits[:, -1]
            return F.cross_entropy(logits, seqs[:, p + 1], reduction="none")
        first = torch.stack([loss_at(p) for p in range(SPAN - 1)]).mean().item()
        second = torch.stack([loss_at(p) for p in range(SPAN, 2 * SPAN - 1)]).mean().item()
    assert result["first_loss"] == pytest.approx(first, rel=1e-5)
    assert result["second_loss"] == pytest.approx(second, rel=1e-5)
    assert result["copy_gain"] == pytest.approx(first - second, rel=1e-4, abs=1e-6)
    assert [layer["global"] for layer in result["layers"]] == [[1.0, 1.0], [1.0, 1.0]]


def test_a_local_model_reads_nothing_beyond_its_window():
    torch.manual_seed(0)
    result = copy_probe(GPT(small_config(schedule="L")).eval(), repeated())
    for layer in result["layers"]:
        assert layer["kind"] == "local" and layer["induction"] == layer["far"] == layer["global"] == [0.0, 0.0]
        assert all(p > 0 for p in layer["previous"])


def test_batches_pool_exactly():
    torch.manual_seed(0)
    model = GPT(small_config(schedule="R", router_init_std=1.0)).eval()
    seqs = repeated(n=4)
    whole, batched = copy_probe(model, seqs, batch_size=4), copy_probe(model, seqs, batch_size=3)
    assert batched["n_spans"] == whole["n_spans"] == 4
    for key in ("first_loss", "second_loss"):
        assert batched[key] == pytest.approx(whole[key], rel=1e-5)
    for a, b in zip(whole["layers"], batched["layers"]):
        assert set(a) == {"kind", "induction", "previous", "far", "global", "previous_when_local",
                          "previous_when_global", "induction_when_global"}
        for name in set(a) - {"kind"}:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-7)
