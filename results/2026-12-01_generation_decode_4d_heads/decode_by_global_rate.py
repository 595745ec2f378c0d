import sys, time, torch
sys.path.insert(0, '.')  # run from the repository root
from model import GPT, GPTConfig
torch.set_num_threads(1)
shape = dict(vocab_size=256, block_size=8192+64, n_layer=4, n_head=4, n_embd=128, window=128)
prompt = torch.randint(256, (1, 8192))
for sched, q in (("L", None), ("G", None), ("R", 0.0), ("R", 0.1), ("R", 0.25), ("R", 1.0)):
    torch.manual_seed(0)
    extra = {} if q is None else {"routing": "random", "random_global_q": q}
    m = GPT(GPTConfig(**shape, schedule=sched, **extra)).eval()
    with torch.no_grad():
        cache = m.new_cache(8192 + 64)
        m(prompt, cache=cache)
        x = prompt[:, -1:]
        for _ in range(3): m(x, cache=cache)
        tic = time.perf_counter()
        for _ in range(40): m(x, cache=cache)
        print(sched, q, f"{(time.perf_counter() - tic) / 40 * 1e3:.2f} ms/token")
