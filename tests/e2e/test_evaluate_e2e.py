import json
import math
import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import evaluate
import probe
import prune
import sample
import train
from data.loader import TokenData
from helpers import CPU_FP32, byte_corpus, run_script, train_configs
from model import GPT, GPTConfig, Routing
from nanoaha.checkpoint import load_checkpoint, load_model, save_checkpoint
from nanoaha.evaluation import (
    evaluate_checkpoint,
    evaluate_loss,
    evaluate_losses,
    fixed_val_batches,
    position_edges,
    threshold_sweep,
)
from nanoaha.key_tokens import key_token_labels

EVAL_TOKENS, BATCH = 2048, 32  # 64 windows of 32 tokens in two batches: a tiny model runs faster in few calls
FAST = [f"--eval_tokens={EVAL_TOKENS}", f"--batch_size={BATCH}", "--device=cpu"]
SPEC_KEYS = {"checkpoint", "run", "layers", "model_config", "data_dir", "encoding", "eval_tokens", "val_loss",
             "perplexity", "bits_per_byte", "global_frac", "global_frac_per_layer", "global_frac_per_head",
             "attention_flop_frac_ideal", "attention_flop_frac_computed", "attention_flop_frac_inference",
             "kv_cache_bytes", "kv_cache_bytes_dense",
             "context_length", "threshold_sweep", "key_loss", "other_loss", "key_frac", "key_tokens",
             "forced_routing", "key_routing", "loss_by_position"}
SWEEP_KEYS = {"threshold", "val_loss", "global_frac", "attention_flop_frac_ideal", "attention_flop_frac_computed"}


def train_run(out_dir, corpus, **overrides):
    values = {"data_dir": str(corpus), "out_dir": str(out_dir), "block_size": 32, "n_layer": 2, "n_head": 2,
              "n_embd": 32, "window": 8, "batch_size": 4, "max_iters": 20, "eval_interval": 20, "eval_iters": 1,
              "log_interval": 20, "warmup_iters": 5, "learning_rate": 3e-3, "router_lambda": 0.01,
              "router_lambda_ramp": 10, "router_init_std": 0.1, "tensorboard": False, "progress_bar": False,
              **CPU_FP32, **overrides}
    train.train(*train_configs(values))
    return str(out_dir)


def evaluated(path, **options):
    return evaluate_checkpoint(path, eval_tokens=EVAL_TOKENS, batch_size=BATCH, **options)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A byte corpus, a routed model with learned routers and one with random routing, trained once."""
    root = tmp_path_factory.mktemp("evaluate")
    corpus = byte_corpus(root / "corpus")
    return SimpleNamespace(root=root, corpus=str(corpus), routed=train_run(root / "runs" / "routed", corpus),
                           random=train_run(root / "runs" / "random", corpus, routing="random",
                                            random_global_q=0.3, max_iters=4))


def batches_of(model, corpus):
    return fixed_val_batches(TokenData(corpus, model.config.block_size, model.config.vocab_size), EVAL_TOKENS, BATCH)


def forced_local_loss(path, batches):
    """The loss of the checkpoint's weights with every routed layer turned local (the model, not a threshold)."""
    ckpt = load_checkpoint(path, "cpu")
    model = GPT(GPTConfig(**{**ckpt["model_config"], "schedule": "L"}))
    model.load_state_dict({k: v for k, v in ckpt["model"].items() if ".router." not in k})
    return evaluate_loss(model, batches)[0]


def test_threshold_sweep_runs_from_forced_global_to_forced_local(runs):
    model, _ = load_model(runs.routed, "cpu")
    batches = batches_of(model, runs.corpus)
    with torch.no_grad():
        max_p = max(p.max().item() for x, _ in batches for p in model(x).probs)
    assert max_p < 1.0  # so threshold 1 is above every p
    thresholds = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]
    sweep = threshold_sweep(model, batches, thresholds)
    assert model.config.router_threshold == 0.5 and all(b.attn.router.config.router_threshold == 0.5
                                                        for b in model.blocks)
    assert [row["threshold"] for row in sweep] == thresholds and all(set(row) == SWEEP_KEYS for row in sweep)
    fracs = [row["global_frac"] for row in sweep]
    assert fracs == sorted(fracs, reverse=True) and fracs[0] == 1.0 and fracs[-1] == 0.0
    assert len(set(fracs)) >= 4  # a curve, not a switch
    ideal = [row["attention_flop_frac_ideal"] for row in sweep]
    assert ideal == sorted(ideal, reverse=True) and ideal[0] == pytest.approx(1.0)
    assert sweep[0]["val_loss"] == pytest.approx(evaluate_loss(model, batches, routing=Routing(force="global"))[0], rel=1e-6)
    assert sweep[-1]["val_loss"] == pytest.approx(forced_local_loss(runs.routed, batches), rel=1e-5)
    assert sweep[0]["val_loss"] != pytest.approx(sweep[-1]["val_loss"], rel=1e-4)  # the two ends differ
    trained = evaluate_loss(model, batches)[0]
    assert sweep[thresholds.index(0.5)]["val_loss"] == pytest.approx(trained, rel=1e-6)


def test_evaluation_has_the_spec_keys_and_is_the_same_twice(runs):
    first = evaluated(runs.random)
    torch.rand(5)  # another RNG state: random routing must still draw the same gates
    assert evaluated(runs.random) == first
    assert set(first) == SPEC_KEYS and first["threshold_sweep"] == [] and first["forced_routing"] is None
    assert first["run"] == "random" and first["layers"] == "RR" and first["data_dir"] == runs.corpus
    assert 0.2 < first["global_frac"] < 0.4  # random_global_q = 0.3
    model, _ = load_model(runs.random, "cpu")
    before = torch.get_rng_state()
    assert evaluate_loss(model, batches_of(model, runs.corpus))[0] == first["val_loss"]
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG did not move

    result = evaluated(runs.routed, context_length=100)
    assert set(result) == SPEC_KEYS and len(result["threshold_sweep"]) == 5
    assert [row["threshold"] for row in result["threshold_sweep"]] == [0.1, 0.3, 0.5, 0.7, 0.9]
    assert result["encoding"] == "bytes" and result["eval_tokens"] == 64 * 32
    assert result["perplexity"] == pytest.approx(math.exp(result["val_loss"]))
    assert result["bits_per_byte"] == pytest.approx(result["val_loss"] / math.log(2))
    model, _ = load_model(runs.routed, "cpu")
    data = TokenData(runs.corpus, 32, 256)
    x, y = data.batch("val", data.val_starts(64))  # the fixed windows, in one batch
    with torch.no_grad():
        out = model(x, y)
    assert result["val_loss"] == pytest.approx(out.lm_loss.item(), rel=1e-5)
    # evaluation ran sparse (no gradient): it computed less than training in the model's exact mode does
    assert result["model_config"]["routed_mode"] == "exact"
    assert result["attention_flop_frac_ideal"] < result["attention_flop_frac_inference"] < \
        result["attention_flop_frac_computed"]
    gates = [g.float() for g in out.gates]
    assert result["global_frac"] == pytest.approx(torch.stack(gates).mean().item())
    assert result["global_frac_per_layer"] == pytest.approx([g.mean().item() for g in gates])
    assert result["global_frac_per_head"] == [pytest.approx(g.mean(dim=(0, 2)).tolist()) for g in gates]
    assert result["context_length"] == 100 and result["kv_cache_bytes"] == result["kv_cache_bytes_dense"] == \
        2 * (2 * 32 * 4) * 100  # 2 layers of keys and values, 32 wide, fp32: routed keeps every position
    assert evaluated(runs.routed, dtype="bfloat16", thresholds=())["kv_cache_bytes"] == 2 * (2 * 32 * 2) * 32


def test_key_and_other_loss_split_the_val_loss_on_the_same_windows(runs):
    # the corpus' lines are ~28 bytes long: in 32-token windows a copy of 8 bytes from beyond the window of 8 is
    # rare (none in these windows), one of 2 bytes is not
    default = evaluated(runs.routed, thresholds=())
    assert default["key_tokens"] == {"k": 8, "window": 8, "n_sink": 0}  # bytes: k 8; the model's window
    assert default["key_frac"] == 0 and default["key_loss"] is None
    assert default["other_loss"] == pytest.approx(default["val_loss"])
    result = evaluated(runs.routed, key_k=2)
    share = result["key_frac"]
    assert result["key_tokens"]["k"] == 2 and 0 < share < 0.1 and result["val_loss"] == default["val_loss"]
    assert share * result["key_loss"] + (1 - share) * result["other_loss"] == pytest.approx(result["val_loss"])
    # by hand: the fixed windows in one batch, the labels of the rule, each target's loss from the logits
    model, _ = load_model(runs.routed, "cpu")
    data = TokenData(runs.corpus, 32, 256)
    x, y = data.batch("val", data.val_starts(64))
    labels = key_token_labels(torch.cat([x, y[:, -1:]], 1), 2, 8, 0)
    with torch.no_grad():
        out = model(x, y)
        losses = F.cross_entropy(out.logits.transpose(1, 2), y, reduction="none")
    assert share == pytest.approx(labels.float().mean().item())
    # one label set for models of several windows: the copies from beyond a window of 30, not the model's 8
    # (a line is ~28 bytes: a copy from the line before is within 30)
    wide = evaluated(runs.routed, key_k=2, key_window=30, thresholds=())
    assert wide["key_tokens"] == {"k": 2, "window": 30, "n_sink": 0} and wide["val_loss"] == result["val_loss"]
    wide_labels = key_token_labels(torch.cat([x, y[:, -1:]], 1), 2, 30, 0)
    assert wide["key_frac"] == pytest.approx(wide_labels.float().mean().item()) and wide["key_frac"] < share
    # the routers against the key labels: layer 0 (a token any head sent global) and its head 1, by hand
    report = {(row["layer"], row["head"]): row for row in result["key_routing"]}
    assert len(report) == sum(g is not None for g in out.gates) * (1 + model.config.n_head)
    for head, gate in (("any", out.gates[0].any(1)), (1, out.gates[0][:, 1])):
        row = report[0, head]
        assert row["global_frac"] == pytest.approx(gate.float().mean().item())
        assert row["recall"] == pytest.approx((gate & labels).sum().item() / labels.sum().item())
        assert row["precision"] == pytest.approx((gate & labels).sum().item() / gate.sum().item())
    assert result["key_loss"] == pytest.approx(losses[labels].mean().item(), rel=1e-5)
    assert result["other_loss"] == pytest.approx(losses[~labels].mean().item(), rel=1e-5)
    # the sweep's rows are split alike; the trained threshold's row is the evaluation's
    assert all(set(row) == SWEEP_KEYS | {"key_loss", "other_loss"} for row in result["threshold_sweep"])
    trained = result["threshold_sweep"][2]
    assert trained["threshold"] == 0.5 and trained["key_loss"] == pytest.approx(result["key_loss"], rel=1e-6)
    # forced global and forced local: the model with every routed head global, and with every layer local
    batches = batches_of(model, runs.corpus)
    forced = result["forced_routing"]
    assert forced["global"]["val_loss"] == pytest.approx(evaluate_loss(model, batches, routing=Routing(force="global"))[0],
                                                         rel=1e-6)
    assert forced["local"]["val_loss"] == pytest.approx(forced_local_loss(runs.routed, batches), rel=1e-5)
    assert forced["global"]["key_loss"] != forced["local"]["key_loss"]
    # one layer's routers forced local, the other's as trained: the model with that layer turned local
    assert sorted(forced) == ["global", "local", "local_layer0", "local_layer1"]
    for layer, schedule in ((0, "LR"), (1, "RL")):
        ckpt = load_checkpoint(runs.routed, "cpu")
        one_local = GPT(GPTConfig(**{**ckpt["model_config"], "schedule": schedule}))
        one_local.load_state_dict({k: v for k, v in ckpt["model"].items() if f"blocks.{layer}.attn.router." not in k})
        loss = evaluate_loss(one_local, batches)[0]
        assert forced[f"local_layer{layer}"]["val_loss"] == pytest.approx(loss, rel=1e-5)


def test_loss_by_position_splits_the_val_loss_and_shows_no_gap_where_the_window_holds_the_prefix(runs):
    assert position_edges(32, 8) == [0, 8, 16, 32] and position_edges(1024, 32)[-3:] == [256, 512, 1024]
    assert position_edges(32, 32) == [0, 32] and position_edges(32, 40) == [0, 32]
    result = evaluated(runs.routed, thresholds=())
    buckets = result["loss_by_position"]
    assert [(b["from"], b["to"], b["targets"]) for b in buckets] == [(0, 7, 8 * 64), (8, 15, 8 * 64), (16, 31, 16 * 64)]
    assert sum(b["loss"] * b["targets"] for b in buckets) / (32 * 64) == pytest.approx(result["val_loss"], rel=1e-5)
    model, _ = load_model(runs.routed, "cpu")
    data = TokenData(runs.corpus, 32, 256)
    x, y = data.batch("val", data.val_starts(64))
    with torch.no_grad():
        losses = F.cross_entropy(model(x, y).logits.transpose(1, 2), y, reduction="none")
    assert buckets[2]["loss"] == pytest.approx(losses[:, 16:].mean().item(), rel=1e-5)
    # the same weights with every routed head global and every one local: the same loss where the window holds
    # the whole prefix (positions 0-7), not beyond it
    batches, edges = batches_of(model, runs.corpus), position_edges(32, 8)
    forced = [evaluate_losses(model, batches, routing=Routing(force=how), edges=edges)[0]["loss_by_position"]
              for how in ("global", "local")]
    assert forced[0][0]["loss"] == pytest.approx(forced[1][0]["loss"], rel=1e-5)
    assert abs(forced[0][2]["loss"] - forced[1][2]["loss"]) > 1e-3
    assert "loss_by_position" not in evaluate_losses(model, batches)[0]  # train.py's evaluations do not pay for it


def test_command_line_writes_json_and_the_markdown_table(runs, tmp_path, capsys):
    out = tmp_path / "eval"
    evaluate.main([str(runs.root / "runs"), f"--out_dir={out}", "--thresholds=0.2,0.8", "--key_k=2", *FAST])
    assert sorted(os.listdir(out)) == ["eval.md", "random.json", "routed.json"]
    written = json.load(open(out / "routed.json"))
    assert set(written) == SPEC_KEYS | {"settings", "format"}
    assert [row["threshold"] for row in written["threshold_sweep"]] == [0.2, 0.8]
    settings = written.pop("settings")  # what evaluate.py adds: the settings that decide the numbers
    assert written.pop("format") == 1  # and the file's format (nanoaha/formats.py)
    assert settings["thresholds"] == [0.2, 0.8] and settings["eval_tokens"] == EVAL_TOKENS
    assert written == evaluated(runs.routed, thresholds=(0.2, 0.8), key_k=2)
    table = (out / "eval.md").read_text()
    rows = [line for line in table.split("\n\n")[0].splitlines() if line.startswith(("| random ", "| routed "))]
    assert [row.split(" | ")[0:2] for row in rows] == [["| random", "RR"], ["| routed", "RR"]]
    assert f"{written['val_loss']:.4f}" in rows[1] and f"bpb {written['bits_per_byte']:.4f}" in rows[1]
    assert f"| {written['key_loss']:.4f} / {written['other_loss']:.4f} (" in rows[1]
    assert "| every routed head local | " in table and "| layer 1's routers local | " in table and settings["key_k"] == 2
    assert "Threshold sweep of routed" in table and "Threshold sweep of random" not in table
    printed = capsys.readouterr().out
    assert table in printed and f"val loss {written['val_loss']:.4f}" in printed
    assert "key tokens (copies from beyond the window; k 2, window 8, 0 sinks): " in printed
    assert "loss by context position (at 0-7 the window holds the whole prefix): 0-7 " in printed
    by_position = "| routed | " + " | ".join(f"{b['loss']:.4f}" for b in written["loss_by_position"]) + " |"
    assert "| run | 0-7 | 8-15 | 16-31 |" in table and by_position in table

    evaluate.main([runs.random, *FAST])  # no --out_dir: beside the ckpt
    assert json.load(open(os.path.join(runs.random, "eval.json")))["run"] == "random"


def test_probe_command_line_prints_each_head_and_writes_json(runs, tmp_path, capsys):
    out = tmp_path / "probe.json"
    probe.main([str(runs.root / "runs"), "--span=12", "--n_spans=4", "--batch_size=2", "--device=cpu", f"--out={out}"])
    written = json.load(open(out))
    assert [os.path.basename(os.path.dirname(r["checkpoint"])) for r in written] == ["random", "routed"]
    routed = written[1]
    assert routed["span"] == 12 and routed["n_spans"] == 4 and routed["window"] == 8
    assert routed["copy_gain"] == pytest.approx(routed["first_loss"] - routed["second_loss"])
    assert [layer["kind"] for layer in routed["layers"]] == ["routed", "routed"]
    assert all(len(layer[score]) == 2 for layer in routed["layers"] for score in ("induction", "previous", "far"))
    printed = capsys.readouterr().out
    assert f"routed (RR, window 8): copy gain {routed['copy_gain']:+.3f} nats" in printed
    assert f"| routed | {routed['copy_gain']:+.3f} | " in printed
    for span, problem in ((8, "is within the window"), (17, "exceed")):
        run = run_script("probe.py", runs.routed, f"--span={span}", "--device=cpu")
        assert run.returncode == 1 and "Traceback" not in run.stderr and problem in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1


def test_bad_input_on_the_command_line_has_no_traceback(tmp_path):
    for script in ("evaluate.py", "prune.py", "probe.py"):
        run = run_script(script, tmp_path / "nothing", *([] if script == "probe.py" else [f"--out_dir={tmp_path / 'p'}"]))
        assert run.returncode != 0 and "Traceback" not in run.stderr
        assert run.stderr.strip().startswith("error: no checkpoint at") and len(run.stderr.strip().splitlines()) == 1


def test_pruning_keeps_busy_layers_and_matches_the_forced_local_model(runs, tmp_path, capsys):
    # layer 0 always global, layer 1 never: only layer 1 is below 5%
    ckpt = load_checkpoint(runs.routed, "cpu")
    ckpt["model"]["blocks.0.attn.router.logits.bias"].fill_(30.0)
    ckpt["model"]["blocks.1.attn.router.logits.bias"].fill_(-30.0)
    os.makedirs(tmp_path / "biased")
    save_checkpoint(str(tmp_path / "biased" / "ckpt.pt"), ckpt)
    biased = evaluated(str(tmp_path / "biased"), thresholds=())
    assert biased["global_frac_per_layer"] == [1.0, 0.0]
    prune.main([str(tmp_path / "biased"), f"--out_dir={tmp_path / 'pruned'}", *FAST])
    report = capsys.readouterr().out
    assert "pruned layers [1]: RR -> RL" in report
    per_position = 2 * 2 * 16 * 4
    assert f"KV cache at 32 positions (float32): {per_position * 64:,} -> {per_position * (32 + 8):,} bytes, " \
           f"{per_position * 24:,} saved" in report
    pruned = evaluated(str(tmp_path / "pruned"), thresholds=())
    assert pruned["layers"] == "RL" and pruned["global_frac_per_layer"] == [1.0, None]
    assert pruned["val_loss"] == pytest.approx(biased["val_loss"], rel=1e-5)  # layer 1 was local already
    assert f"val loss {biased['val_loss']:.4f} -> {pruned['val_loss']:.4f}" in report
    assert pruned["kv_cache_bytes"] == per_position * (32 + 8)

    # every routed layer pruned: the loss of the trained model forced local (threshold above every p)
    prune.main([runs.routed, f"--out_dir={tmp_path / 'all'}", "--min_global_frac=1.01", *FAST])
    assert "pruned layers [0, 1]: RR -> LL" in capsys.readouterr().out
    model, _ = load_model(runs.routed, "cpu")
    batches = batches_of(model, runs.corpus)
    model.config.router_threshold = 1.01
    forced_local = evaluate_loss(model, batches)[0]
    result = evaluated(str(tmp_path / "all"))
    assert result["layers"] == "LL" and result["threshold_sweep"] == [] and result["global_frac"] is None
    assert result["val_loss"] == pytest.approx(forced_local, rel=1e-5)
    assert result["kv_cache_bytes"] == per_position * 2 * 8
    sample.main([f"--out_dir={tmp_path / 'all'}", "--max_new_tokens=20", "--device=cpu", "--num_samples=2"])
    assert capsys.readouterr().out.count("-" * 40) == 2
