"""First look at torch.compile on the CPU: tok/s of 4 steps after 2 (compiling) steps, eager and compiled, fp32 and bf16.

    TORCH_LOGS=graph_breaks python results/2026-12-02_cpu_bf16_speed/compile_first_look.py G,L
    TORCH_LOGS=graph_breaks python results/2026-12-02_cpu_bf16_speed/compile_first_look.py R,R:sparse
"""
import sys, time, os, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from model import GPT, GPTConfig
from nanoaha.train_config import TrainConfig
from nanoaha.training import configure_optimizer
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
kinds = sys.argv[1].split(",")
for kind in kinds:
    sched, mode = (kind.split(":") + ["exact"])[:2]
    for dtype in (torch.float32, torch.bfloat16):
        for comp in (False, True):
            config = GPTConfig(vocab_size=256, block_size=1024, n_layer=4, n_head=4, n_embd=128, window=32,
                               schedule=sched, routed_mode=mode, attention_backend="torch")
            torch.manual_seed(0)
            model = GPT(config)
            opt = configure_optimizer(model, TrainConfig(), "cpu")
            m = torch.compile(model) if comp else model
            x = torch.randint(256, (4, 1024))
            def step():
                with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                    loss = m(x, x).loss
                loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            try:
                step(); step()
            except Exception as e:
                print(kind, dtype, "compile" if comp else "eager", "FAILED", type(e).__name__, str(e)[:200], flush=True); continue
            warm = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(4): step()
            tps = 4 * 4096 / (time.perf_counter() - t0)
            print(f"{kind:10s} {str(dtype):15s} {'compiled' if comp else 'eager':8s} {tps:8,.0f} tok/s  (first 2 steps {warm:.1f}s)", flush=True)
