"""Never lose a run: refused overwrites, non-finite steps, latest and best checkpoints, signals, setting ranges,
resuming on other data, and one-line errors from every script."""

import numpy as np
import pytest

from data.loader import TokenData
from data.tokens import write_meta, write_tokens
from model import GPTConfig
from nanoaha.configurator import ConfigError, parse_args
from sample import SampleConfig
from nanoaha.train_config import TrainConfig


@pytest.mark.parametrize("setting", ["batch_size=0", "eval_interval=0", "log_interval=0", "grad_accum=0",
                                     "eval_iters=0", "n_layer=0", "n_head=0", "dtype='float8'", "max_iters=-5",
                                     "min_lr=-1e-4", "learning_rate=0", "p_dense=1.5", "router_threshold=2",
                                     "dropout=1.0", "router_lambda=-1", "attention_backend='cuda'"])
def test_settings_out_of_range_name_the_setting(setting):
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=key):
        parse_args([f"--{setting}"], TrainConfig, GPTConfig)


@pytest.mark.parametrize("setting", ["top_k=0", "temperature=-1", "max_new_tokens=-5", "num_samples=0",
                                     "router_threshold=1.5"])
def test_sample_settings_out_of_range_name_the_setting(setting):
    with pytest.raises(ConfigError, match=setting.split("=")[0]):
        parse_args([f"--{setting}"], SampleConfig)


def test_token_ids_beyond_the_vocab_of_meta_json_are_named(tmp_path):
    tokens = np.arange(200, dtype=np.uint16) % 120
    for split in ("train", "val"):
        write_tokens(str(tmp_path), split, [tokens], np.uint16, 0)
    write_meta(str(tmp_path), {"encoding": "bytes", "vocab_size": 100, "dtype": "uint16", "eot_token": 0})
    data = TokenData(str(tmp_path), 150, 256)
    with pytest.raises(ValueError, match="token id 119 but meta.json says vocab_size 100"):
        data.val_batches(1, 1)
