import time, torch, torch.nn.functional as F
torch.set_num_threads(1)
S, D, H = 8192, 32, 4
k = torch.randn(1, H, S + 64, D)[:, :, :S]; v = torch.randn(1, H, S + 64, D)[:, :, :S]; q = torch.randn(1, H, 1, D)
def t(f, n=200):
    for _ in range(10): f()
    tic = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - tic) / n * 1e6
for rnd in range(3):
    print(f"all 4 heads {t(lambda: F.scaled_dot_product_attention(q, k, v)):.0f} us | "
          f"one head 2D {t(lambda: F.scaled_dot_product_attention(q[0, 1], k[0, 1], v[0, 1])):.0f} us | "
          f"one head 4D {t(lambda: F.scaled_dot_product_attention(q[:, 1:2], k[:, 1:2], v[:, 1:2])):.0f} us | "
          f"one head manual {t(lambda: torch.softmax(q[0,1] @ k[0,1].T * D**-0.5, -1) @ v[0,1]):.0f} us")
