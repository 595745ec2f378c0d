import json
import math
import os
from dataclasses import asdict

import pytest
import torch

import evaluate
import prune
from model import GPT, GPTConfig, KVCache
from nanoaha.checkpoint import load_checkpoint, load_model, save_checkpoint
from nanoaha import evaluation
from nanoaha.evaluation import kv_cache_summary
from nanoaha.pruning import layers_to_prune, prune_checkpoint
from nanoaha.routing_stats import kv_cache_bytes


def untrained_checkpoint(path, corpus, **config):
    """A checkpoint as train.py writes it, of a freshly initialised model (fast)."""
    mcfg = GPTConfig(**{"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32, "window": 8, **config})
    torch.manual_seed(0)
    os.makedirs(path, exist_ok=True)
    save_checkpoint(os.path.join(path, "ckpt.pt"), {
        "model": GPT(mcfg).state_dict(), "optimizer": None, "model_config": asdict(mcfg),
        "train_config": {"data_dir": str(corpus)}, "iter_num": 0, "best_val_loss": math.inf,
        "data_meta": json.load(open(os.path.join(corpus, "meta.json"))), "rng": {}})
    return str(path)


@pytest.mark.parametrize("schedule, passes", [("R", 1 + 3 + 2 + 2), ("LG", 1)])
def test_evaluation_shows_progress_over_every_pass_it_makes(tmp_path, prepared_corpus, monkeypatch, schedule,
                                                            passes):
    """One bar over every batch of every pass: the loss, then for learned routers each threshold of the sweep
    (3), forced global and forced local, and each routed layer forced local (2); it ends full."""
    bars = []

    class Bar(evaluation.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.shown = not self.disable
            bars.append(self)

    monkeypatch.setattr(evaluation, "tqdm", Bar)
    run = untrained_checkpoint(tmp_path / "run", prepared_corpus, schedule=schedule)
    evaluation.evaluate_checkpoint(run, eval_tokens=32 * 6, batch_size=2, thresholds=(0.3, 0.5, 0.7),
                                   progress=True)
    (bar,) = bars
    assert bar.shown and bar.total == passes * 3 and bar.n == bar.total
    evaluation.evaluate_checkpoint(run, eval_tokens=32 * 6, batch_size=2, thresholds=(0.3,))
    assert not bars[1].shown  # off unless asked for (evaluate.py asks on a terminal)


def test_kv_cache_bytes_are_what_the_cache_holds():
    config = GPTConfig(block_size=64, n_layer=3, n_head=2, n_embd=32, schedule="GLR", window=8, n_sink=2)
    per_position = 2 * 2 * 16 * 4  # keys and values, 2 heads of 16, fp32
    assert kv_cache_bytes(config, 40, 4) == per_position * (40 + 10 + 40)
    assert kv_cache_bytes(config, 6, 4) == per_position * (6 + 6 + 6)
    assert kv_cache_summary(config, 40, 4)["kv_cache_bytes_dense"] == per_position * 3 * 40
    model = GPT(config).eval()
    for prompt, steps in ((30, 10), (5, 1), (5, 0)):
        cache = model.new_cache(capacity=prompt + steps)
        with torch.no_grad():
            model(torch.randint(256, (1, prompt)), cache=cache)
            for _ in range(steps):
                model(torch.randint(256, (1, 1)), cache=cache)
        held = sum(c.bytes for c in cache)
        assert held == kv_cache_bytes(config, prompt + steps, 4)


def test_bad_input_ends_with_one_line(tmp_path, prepared_corpus):
    small_vocab = untrained_checkpoint(tmp_path / "small_vocab", prepared_corpus, vocab_size=64)
    good = untrained_checkpoint(tmp_path / "good", prepared_corpus)
    for argv, message in (([str(tmp_path / "nothing")], "no checkpoint at"),
                          ([str(tmp_path / "corpus")], "no checkpoint at"),  # a folder without runs
                          ([small_vocab], "has vocab_size 256 but checkpoint"),
                          ([good, "--thresholds=0.1,1.5"], "outside [0, 1]"),
                          ([good, "--thresholds=-0.1"], "outside [0, 1]"),
                          ([good, "--router_threshold=2.0"], "outside [0, 1]"),
                          ([good, f"--data_dir={tmp_path / 'nowhere'}"], "meta.json not found"),
                          ([good, "--eval_tokens=0"], "eval_tokens=0"),
                          ([good, "--key_k=-1"], "key_k=-1: give the length of the matched k-gram"),
                          ([], "name at least one checkpoint")):
        with pytest.raises(SystemExit) as e:
            evaluate.main(argv + ["--device=cpu"])
        assert message in str(e.value.code) and "\n" not in str(e.value.code), argv
    for argv, message in (([good, "--out_dir="], "pass --out_dir"),
                          ([good, f"--out_dir={good}"], "pass --out_dir"),  # never over the source
                          ([good, f"--out_dir={tmp_path / 'p'}", "--min_global_frac=-1"], "min_global_frac=-1"),
                          ([untrained_checkpoint(tmp_path / "dense", prepared_corpus, schedule="G"),
                            f"--out_dir={tmp_path / 'p'}"], "no routed layers"),
                          ([str(tmp_path / "nothing"), f"--out_dir={tmp_path / 'p'}"], "no checkpoint at"),
                          ([f"--out_dir={tmp_path / 'p'}"], "name one checkpoint")):
        with pytest.raises(SystemExit) as e:
            prune.main(argv + ["--device=cpu"])
        assert message in str(e.value.code) and "\n" not in str(e.value.code), argv
    assert not os.path.exists(tmp_path / "p")


def test_prune_checkpoint_turns_layers_local_and_drops_their_routers(tmp_path, prepared_corpus):
    path = untrained_checkpoint(tmp_path / "run", prepared_corpus, n_layer=4, schedule="RG")
    assert layers_to_prune([0.01, 1.0, 0.2, 1.0], GPTConfig(n_layer=4, schedule="RG").kinds, 0.05) == [0]
    assert layers_to_prune([0.01, 1.0, 0.2, 1.0], GPTConfig(n_layer=4, schedule="RG").kinds, 0.3) == [0, 2]
    assert layers_to_prune([0.5, None, 0.01, None], GPTConfig(n_layer=4, schedule="RL").kinds, 0.05) == [2]
    ckpt = load_checkpoint(path, "cpu")
    pruned = prune_checkpoint(ckpt, [2], {"from": path})
    assert set(pruned) == set(ckpt) | {"pruned"} and pruned["optimizer"] is None
    assert pruned["model_config"]["schedule"] == "RGLG" and ckpt["model_config"]["schedule"] == "RG"
    assert pruned["pruned"] == {"layers": [2], "from": path}
    assert set(ckpt["model"]) - set(pruned["model"]) == {"blocks.2.attn.router.logits.weight",
                                                         "blocks.2.attn.router.logits.bias",
                                                         "blocks.2.attn.router.committed"}
    save_checkpoint(str(tmp_path / "pruned.pt"), pruned)
    model, _ = load_model(str(tmp_path / "pruned.pt"), "cpu")  # strict: no router left over, none missing
    assert model.config.layer_letters == "RGLG" and model.blocks[2].attn.router is None
    assert torch.equal(model.blocks[2].attn.qkv.weight, ckpt["model"]["blocks.2.attn.qkv.weight"])


def test_a_negative_pruning_level_names_the_default_level():
    from nanoaha import pruning
    with pytest.raises(ValueError, match=r"min_global_frac=-0.1: give a global fraction >= 0 \(0.05: below 5%\)"):
        pruning.prune("no/such/ckpt", "out", min_global_frac=-0.1)



def test_pruning_keeps_a_layer_exactly_at_the_level_and_prunes_one_just_below():
    """'below min_global_frac' is strict: a layer global exactly as often as the level asks for stays routed."""
    from nanoaha.pruning import layers_to_prune
    level = 0.05
    fracs = [level, math.nextafter(level, 0.0), level * 2, 0.0]
    assert layers_to_prune(fracs, ["routed", "routed", "routed", "local"], level) == [1]
    assert layers_to_prune([0.0, 0.0], ["routed", "routed"], 0.0) == []  # level 0 prunes nothing



def test_count_gates_scores_each_head_and_the_layer_against_labels_by_hand():
    """Precision: of the tokens routed global, the fraction labelled 1; recall: of those labelled 1, the fraction
    routed global; unknown labels (unscored targets) count only in the global fraction; a layer without
    routers (None) is left out."""
    from data.synthetic.tasks import UNKNOWN_LABEL
    from nanoaha.evaluation import count_gates, routing_report
    gates = [None, torch.tensor([[[1, 0, 1, 0], [0, 0, 1, 1]]], dtype=torch.bool)]  # (B=1, H=2, T=4)
    labels = torch.tensor([[1, 0, 0, UNKNOWN_LABEL]])
    counts = {}
    count_gates(counts, gates, labels)
    report = {(row["layer"], row["head"]): (row["global_frac"], row["precision"], row["recall"])
              for row in routing_report(counts)}
    assert set(report) == {(1, "any"), (1, 0), (1, 1)}
    assert report[1, 0] == (0.5, 0.5, 1.0)     # global at 0 (key) and 2 (not key)
    assert report[1, 1] == (0.5, 0.0, 0.0)     # global at 2 (not key) and 3 (unknown); misses the key at 0
    assert report[1, "any"] == (0.75, 0.5, 1.0)


def test_a_model_with_a_budget_of_heads_and_committed_heads_is_evaluated_and_pruned(tmp_path, prepared_corpus):
    """router_global_heads: the KV-cache comparison's dense model has no routed heads for the budget (the
    evaluation that ended a grid run); pruning a layer keeps the budget where routed heads are left and drops it
    where none are."""
    path = untrained_checkpoint(tmp_path / "run", prepared_corpus, schedule="R", router_per_token=False,
                                router_global_heads=1)
    result = evaluation.evaluate_checkpoint(path, eval_tokens=32 * 4, batch_size=2, thresholds=(0.5,))
    assert result["global_frac"] == pytest.approx(0.25)  # one of the four routed heads
    assert result["kv_cache_bytes"] == result["kv_cache_bytes_dense"]
    ckpt = load_checkpoint(path, "cpu")
    assert prune_checkpoint(ckpt, [1])["model_config"]["router_global_heads"] == 1
    pruned = prune_checkpoint(ckpt, [0, 1])["model_config"]
    assert pruned["schedule"] == "LL" and pruned["router_global_heads"] == 0
    GPTConfig(**pruned)  # a valid model


def test_a_routed_layer_whose_heads_all_committed_local_caches_only_its_window():
    """GPT.window_heads: a routed layer whose heads all committed to the local path holds a local layer's cache
    (the window and sinks), and generates exactly what the model with a full cache generates; a layer with one
    head committed local and one that may go global keeps the window for the first, every position for the
    other (a SplitKVCache)."""
    config = GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, schedule="R", window=8, n_sink=2,
                       router_per_token=False)
    torch.manual_seed(0)
    model = GPT(config).eval()
    prompt = torch.randint(256, (1, 30))
    for head in range(2):
        model.blocks[0].attn.router.commit(head, 0)
    model.blocks[1].attn.router.commit(0, 0)
    assert model.window_heads() == [[0, 1], [0]]
    per_head_position = 2 * 16 * 4
    assert kv_cache_bytes(config, 40, 4, model.window_heads()) == per_head_position * (2 * 10 + 10 + 40)
    cache = model.new_cache(capacity=40)
    with torch.no_grad():
        model(prompt, cache=cache)
        for _ in range(10):
            model(torch.randint(256, (1, 1)), cache=cache)
    assert [type(c).__name__ for c in cache] == ["KVCache", "SplitKVCache"] and cache[0].local
    assert sum(c.bytes for c in cache) == kv_cache_bytes(config, 40, 4, model.window_heads())
    # the window cache gives what the full one gives: a committed-local head reads only its window
    without_cache = model.generate(prompt, 10, temperature=0, use_kv_cache=False)
    assert torch.equal(model.generate(prompt, 10, temperature=0), without_cache)


@pytest.mark.parametrize("gathers", [False, True])
def test_a_split_cache_decodes_what_the_full_cache_decodes(gathers, monkeypatch):
    """Per-token routed heads beside heads committed local (0 and 2 of 4), two sequences: every decode step's
    logits with the SplitKVCache equal those with a full cache of every head, on the CPU's per-head path and on
    the gather path the GPU takes (kernels.layer.decode_gathers)."""
    monkeypatch.setattr("kernels.layer.decode_gathers", lambda q: gathers)
    config = GPTConfig(block_size=64, n_layer=2, n_head=4, n_embd=32, schedule="R", window=6, n_sink=1,
                       router_init_std=1.0)
    torch.manual_seed(0)
    model = GPT(config).eval()
    for head in (0, 2):
        model.blocks[1].attn.router.commit(head, 0)
    tokens = torch.randint(256, (2, 40))
    split = model.new_cache(capacity=40)
    full = [KVCache(kind, 40, config.window, config.n_sink) for kind in config.kinds]
    assert type(split[1]).__name__ == "SplitKVCache" and split[1].full_heads == [1, 3]
    global_decisions = 0
    with torch.no_grad():
        for cache in (split, full):
            model(tokens[:, :20], cache=cache)
        for t in range(20, 40):
            a, b = model(tokens[:, t:t + 1], cache=split), model(tokens[:, t:t + 1], cache=full)
            torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
            assert torch.equal(a.gates[1], b.gates[1]) and not a.gates[1][:, [0, 2]].any()
            global_decisions += int(a.gates[1].sum())
    assert global_decisions > 0  # the routed heads went global at some steps: the split's full part was read
    assert sum(c.bytes for c in split) < sum(c.bytes for c in full)
