"""nanoaha/formats.py: every file kind carries its version, older ones come up through their migrations, a newer
one is refused in one line; what the writers write reads back unchanged."""
import pytest
import torch

from nanoaha import formats
from nanoaha.checkpoint import load_checkpoint, save_checkpoint


def test_an_unversioned_file_of_each_kind_reads_as_the_current_format():
    ckpt = formats.upgrade("checkpoint", {"model": {}, "model_config": {}, "iter_num": 3})
    assert ckpt["format"] == formats.current("checkpoint")
    assert (ckpt["dtype"], ckpt["train_wall_s"], ckpt["copy_history"], ckpt["head_history"]) == (None, None, [], [])
    result = formats.upgrade("evaluation", {"val_loss": 1.0, "settings": {"data_dir": "/old/checkout/data/stdlib"}})
    assert result["settings"] == {"data_dir": "data/stdlib", "key_window": 0}
    summary = formats.upgrade("train_summary", {"complete": True})
    assert summary["copy_history"] == [] and summary["train_wall_s"] is None and summary["nonfinite_steps"] is None
    assert formats.upgrade("rows", {"grid": "g", "rows": []})["comparisons"] == {}


def test_a_current_file_is_read_as_written_and_a_newer_one_is_refused():
    written = formats.stamp("train_summary", {"complete": True, "train_wall_s": 12.0, "copy_history": [[0, 0.1]],
                                              "val_history": [], "key_history": [], "nonfinite_steps": 2})
    assert formats.upgrade("train_summary", dict(written)) == written
    with pytest.raises(ValueError, match=r"^x\.json is a rows of format 99, newer than .*update nanoAHA"):
        formats.upgrade("rows", {"format": 99}, "x.json")
    assert formats.upgrade("rows", None) is None  # a missing file stays missing


def test_a_checkpoint_records_its_format_and_loads_through_the_migrations(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(path, {"model": {}, "model_config": {}, "dtype": "float32", "train_wall_s": 5.0})
    assert torch.load(path, weights_only=False)["format"] == formats.current("checkpoint")
    torch.save({"model": {}, "model_config": {}}, path)  # written before versions
    assert load_checkpoint(path, "cpu")["train_wall_s"] is None


def test_a_routed_checkpoint_from_before_commits_loads_with_no_head_committed(tmp_path):
    """Format 2 had no Router.committed buffer: the migration adds one per router (-1: every head routed), so
    load_model's strict load takes the old weights."""
    from dataclasses import asdict
    from model import GPT, GPTConfig
    from nanoaha.checkpoint import load_model
    config = GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=8, window=2, schedule="RL")
    model = GPT(config)
    state = {k: v for k, v in model.state_dict().items() if not k.endswith(".committed")}
    assert len(state) == len(model.state_dict()) - 1
    path = str(tmp_path / "ckpt.pt")
    torch.save({"model": state, "model_config": asdict(config), "format": 2, "data_meta": {}}, path)
    ckpt = load_checkpoint(path, "cpu")
    assert ckpt["model"]["blocks.0.attn.router.committed"].tolist() == [-1, -1]
    assert ckpt["commit_history"] == [] and ckpt["commit_streak"] is None and ckpt["commit_recent"] is None
    loaded, _ = load_model(path, "cpu")
    assert loaded.blocks[0].attn.router.paths == (-1, -1)
    torch.testing.assert_close(loaded.blocks[0].attn.router.logits.bias, model.blocks[0].attn.router.logits.bias)
