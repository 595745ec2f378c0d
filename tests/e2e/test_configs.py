"""The GPU-scale configs, run as they are but shrunk (tiny sizes, two steps, fp32, no compile) on the CPU."""
import json

import train
from helpers import flags
from model import GPTConfig
from nanoaha import checkpoint
from nanoaha.configurator import parse_args
from nanoaha.train_config import TrainConfig

SHRINK = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 64, "window": 16, "batch_size": 2,
          "max_iters": 2, "eval_interval": 2, "eval_iters": 1, "warmup_iters": 1, "router_lambda_start": 0,
          "router_lambda_ramp": 1, "dtype": "float32", "compile": False, "tensorboard": False, "device": "cpu"}


def shrunk(files, tmp_path, corpus, name, **overrides):
    values = {**SHRINK, "data_dir": str(corpus), "out_dir": str(tmp_path / name), **overrides}
    return parse_args([*files, *flags(values)], TrainConfig, GPTConfig)


def test_the_gpt2_small_configs_run_shrunk(tmp_path, tiny_corpus):
    base = "configs/gpt2_small.py"
    runs = {"dense": [base], "LLLLLG": [base, "configs/gpt2_small_LLLLLG.py"],
            "routed": [base, "configs/gpt2_small_routed.py"]}
    for name, files in runs.items():
        tcfg, mcfg = shrunk(files, tmp_path, tiny_corpus, name)
        assert (tcfg.dataset, mcfg.vocab_size) == ("fineweb_edu", 50304)  # what the full config trains on
        result = train.train(tcfg, mcfg)
        (_, before), (_, after) = json.load(open(tmp_path / name / "train_summary.json"))["val_history"]
        # untrained, val loss is about ln(50304) = 10.8 on any data; two steps of the config's recipe lower it
        assert len(result["losses"]) == 2 and after < before - 0.05, (name, before, after)
    layers = {name: checkpoint.load_checkpoint(str(tmp_path / name), "cpu")["model_config"]["schedule"]
              for name in runs}
    assert layers == {"dense": "G", "LLLLLG": "LLLLLG", "routed": "R"}
    tcfg, mcfg = shrunk([base, "configs/gpt2_small_routed_finetune.py"], tmp_path, tiny_corpus, "finetuned",
                        init_from=str(tmp_path / "dense" / "ckpt.pt"))
    assert train.train(tcfg, mcfg)["routing"]["routed_global_frac"] > 0
