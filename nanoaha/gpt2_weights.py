"""GPT-2's pretrained weights (through `transformers`, an optional dependency) in a nanoAHA model, so that routing
can be fine-tuned onto a public dense model as the AHA paper does.

    python train.py configs/gpt2_finetune_routed.py                  # init_from='gpt2' (or gpt2-medium, -large, -xl)
    python train.py ... --init_from=hf:PATH                           # a GPT-2 saved with save_pretrained()

GPT-2 has learned absolute positions, biases and the tanh GELU, so the model config must say so
(position_embedding='learned', bias=True, gelu_approximate='tanh') and match its sizes; routers start fresh.

The sizes are checked first, without the network (a hub GPT-2's from HUB_SIZES, a saved one's from its
config.json). The weights come from the saved folder or the local Hugging Face cache; only when they are in
neither is the hub asked, and only after one quick request (PROBE_TIMEOUT) says it answers: offline, the
error is one line at once instead of the hub client's 5 retries over 30 s.

transformers (>= 5) imports the `kernels` distribution, a name this project's kernels/ folder also has: every use
of transformers goes through transformers_scope(), which lets it find its own.
"""
import contextlib
import importlib
import importlib.util
import json
import os
import sys
import urllib.error
import urllib.request
from types import SimpleNamespace

# The hub's GPT-2 sizes (their config.json), so a model config is checked before anything is downloaded
HUB_SIZES = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280),
             "gpt2-xl": (48, 25, 1600)}  # n_layer, n_head, n_embd
HUB_NAMES = tuple(HUB_SIZES)
PROBE_TIMEOUT = 3  # seconds: is the hub reachable at all? Offline, the hub's client retries for 30 s


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


def check_config(init_from, config, hf_config):
    """Raises with the settings to change unless config can hold the GPT-2 that hf_config describes."""
    wrong = {k: v for k, v in required_config(hf_config).items() if getattr(config, k) != v}
    if wrong:
        raise ValueError(f"init_from={init_from!r} needs " + " ".join(f"--{k}={v!r}" for k, v in wrong.items()) +
                         f" (this config has {', '.join(f'{k}={getattr(config, k)!r}' for k in wrong)})")
    if config.block_size > hf_config.n_positions:
        raise ValueError(f"block_size={config.block_size} is longer than GPT-2's {hf_config.n_positions} "
                         f"learned positions: use block_size <= {hf_config.n_positions}")


def known_config(source):
    """The config of a hub GPT-2 (from HUB_SIZES) or of a saved one (its config.json), without the network;
    None when it cannot be known before loading."""
    if source in HUB_SIZES:
        n_layer, n_head, n_embd = HUB_SIZES[source]
        return SimpleNamespace(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=50257, n_positions=1024,
                               activation_function="gelu_new")
    path = os.path.join(source, "config.json")
    if os.path.isfile(path):
        with open(path) as f:
            values = json.load(f)
        defaults = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "n_positions": 1024,
                    "activation_function": "gelu_new"}  # transformers' GPT2Config defaults
        return SimpleNamespace(**{k: values.get(k, v) for k, v in defaults.items()})
    return None


def hub_unreachable():
    """Why the Hugging Face hub cannot be reached (one quick request, no retries), or None when it can."""
    import huggingface_hub.constants
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    endpoint = huggingface_hub.constants.ENDPOINT
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=PROBE_TIMEOUT).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (OSError, ValueError) as e:
        return f"{endpoint} is unreachable: {getattr(e, 'reason', e)}"
    return None


def cached(source):
    """Whether the local Hugging Face cache holds the hub model `source` (its config.json, at least)."""
    from huggingface_hub import try_to_load_from_cache
    try:
        return isinstance(try_to_load_from_cache(source, "config.json"), str)
    except ValueError:  # not a valid hub name
        return False


_INSTALLED_KERNELS = {}  # the installed distribution's top module, kept while this project's holds the name


@contextlib.contextmanager
def transformers_scope():
    """Inside: `import kernels` finds the installed distribution that transformers uses (imported once, kept
    between scopes), not this project's kernels/ (first on sys.path, as the project root is); after: this
    project's again. Modules that imported either keep what they imported; their submodules' names differ."""
    ours = importlib.import_module("kernels")  # this project's: loaded now so that it can be put back
    root = os.path.dirname(os.path.abspath(ours.__file__))
    saved_modules = {name: module for name, module in sys.modules.items()
                     if (name == "kernels" or name.startswith("kernels."))
                     and os.path.abspath(getattr(module, "__file__", None) or "").startswith(root + os.sep)}
    saved_path = list(sys.path)
    for name in saved_modules:
        del sys.modules[name]
    sys.modules.update(_INSTALLED_KERNELS)
    project = os.path.dirname(root)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != project]
    try:
        yield
    finally:
        sys.path[:] = saved_path
        if "kernels" in sys.modules and sys.modules["kernels"] is not ours:
            _INSTALLED_KERNELS["kernels"] = sys.modules["kernels"]
        sys.modules.update(saved_modules)


def import_transformers():
    """transformers with its GPT-2 classes loaded, imported where it finds its own `kernels`."""
    with transformers_scope():
        import transformers
        transformers.GPT2Config, transformers.GPT2LMHeadModel  # noqa: B018 (lazy attributes: load them here)
    return transformers


def load_gpt2(source):
    """transformers' GPT2LMHeadModel from a saved folder, the local Hugging Face cache or (only when the hub
    answers a quick request) the hub. Offline and not cached: one line at once, before even importing
    transformers, instead of the hub client's 30 s of retries."""
    fix = (f"connect to the internet once to download {source!r} into the Hugging Face cache, or pass "
           f"--init_from=hf:PATH with a GPT-2 saved by save_pretrained()")
    if os.path.isdir(source) or cached(source):
        try:
            with transformers_scope():
                return import_transformers().GPT2LMHeadModel.from_pretrained(source, local_files_only=True)
        except OSError as e:
            if os.path.isdir(source):
                raise ValueError(f"cannot load GPT-2 weights from {source} ({str(e).splitlines()[0]}): pass "
                                 f"--init_from=hf:PATH with a GPT-2 saved by save_pretrained()") from None
    why = hub_unreachable()
    if why:
        where = "not in the Hugging Face cache" if source in HUB_NAMES else \
            f"no folder {source} here, not in the Hugging Face cache"
        raise ValueError(f"cannot load GPT-2 weights {source!r}: {where}, and {why}; {fix}")
    try:
        with transformers_scope():
            return import_transformers().GPT2LMHeadModel.from_pretrained(source)
    except OSError as e:
        raise ValueError(f"cannot load GPT-2 weights {source!r} ({str(e).splitlines()[0]}); {fix}") from None


def gpt2_state_dict(init_from, config):
    """GPT-2's weights, renamed and transposed into this project's state dict, checked against config: the
    sizes first (from HUB_SIZES or the saved config.json), before anything is loaded or downloaded."""
    if importlib.util.find_spec("transformers") is None:
        raise ValueError(f"init_from={init_from!r} loads weights with transformers, which is not installed: "
                         f"pip install transformers")
    source = init_from[3:] if init_from.startswith("hf:") else init_from
    expected = known_config(source)
    if expected is not None:
        check_config(init_from, config, expected)
    hf = load_gpt2(source)
    check_config(init_from, config, hf.config)
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
