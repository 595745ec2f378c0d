"""GPT-2's pretrained weights (through `transformers`, an optional dependency) in a nanoAHA model, so that routing
can be fine-tuned onto a public dense model as the AHA paper does.

    python train.py configs/gpt2_finetune_routed.py                  # init_from='gpt2' (or gpt2-medium, -large, -xl)
    python train.py ... --init_from=hf:PATH                           # a GPT-2 saved with save_pretrained()

GPT-2 has learned absolute positions, biases and the tanh GELU, so the model config must say so
(position_embedding='learned', bias=True, gelu_approximate='tanh') and match its sizes; routers start fresh.
"""
HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def is_pretrained(init_from):
    return init_from in HUB_NAMES or init_from.startswith("hf:")


def required_config(hf_config):
    """The GPTConfig values a GPT-2 checkpoint needs."""
    if hf_config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"this GPT-2 uses activation {hf_config.activation_function!r}; only the tanh GELU "
                         f"(gelu_new) is supported")
    return {"n_layer": hf_config.n_layer, "n_head": hf_config.n_head, "n_embd": hf_config.n_embd,
            "vocab_size": hf_config.vocab_size, "bias": True, "position_embedding": "learned",
            "gelu_approximate": "tanh"}


def gpt2_state_dict(init_from, config):
    """GPT-2's weights, renamed and transposed into this project's state dict, checked against config."""
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        raise ValueError(f"init_from={init_from!r} loads weights with transformers, which is not installed: "
                         f"pip install transformers") from None
    source = init_from[3:] if init_from.startswith("hf:") else init_from
    try:
        hf = GPT2LMHeadModel.from_pretrained(source)
    except OSError as e:
        raise ValueError(f"cannot load GPT-2 weights {source!r} ({str(e).splitlines()[0]}): offline, save a model "
                         f"with save_pretrained() and pass --init_from=hf:PATH") from None
    wrong = {k: v for k, v in required_config(hf.config).items() if getattr(config, k) != v}
    if wrong:
        raise ValueError(f"init_from={init_from!r} needs " + " ".join(f"--{k}={v!r}" for k, v in wrong.items()) +
                         f" (this config has {', '.join(f'{k}={getattr(config, k)!r}' for k in wrong)})")
    if config.block_size > hf.config.n_positions:
        raise ValueError(f"block_size={config.block_size} is longer than GPT-2's {hf.config.n_positions} "
                         f"learned positions: use block_size <= {hf.config.n_positions}")
    theirs = hf.state_dict()
    conv1d = {"attn.c_attn": "attn.qkv", "attn.c_proj": "attn.proj", "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}
    ours = {"wte.weight": theirs["transformer.wte.weight"],
            "wpe.weight": theirs["transformer.wpe.weight"][:config.block_size],
            "ln_f.weight": theirs["transformer.ln_f.weight"], "ln_f.bias": theirs["transformer.ln_f.bias"]}
    for i in range(config.n_layer):
        prefix = f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            for param in ("weight", "bias"):
                ours[f"blocks.{i}.{norm}.{param}"] = theirs[f"{prefix}{norm}.{param}"]
        for name, mine in conv1d.items():  # GPT-2's Conv1D stores (in, out): a Linear's weight transposed
            ours[f"blocks.{i}.{mine}.weight"] = theirs[f"{prefix}{name}.weight"].t().contiguous()
            ours[f"blocks.{i}.{mine}.bias"] = theirs[f"{prefix}{name}.bias"]
    ours["lm_head.weight"] = ours["wte.weight"]  # tied, as in GPT-2
    return ours
