# Probe (issue 12): torch.matmul (cuBLAS) on the 192 GEMMs of one 12B 8192-row prefill step, in
# skinny_gemm_bench's order and buffers (one x, one w, one y, reused), with two data recipes:
# torch.randn and the engine's (Irwin-Hall sum of four 16-bit uniforms, rescaled). Prints ms and
# TFLOP/s per step (median of 5 after one warm-up), three times each.
import torch

M, H, I = 8192, 3840, 15360
shapes = [(8192, H, 40), (8704, H, 8), (H, 4096, 40), (H, 8192, 8), (2 * I, H, 48), (H, I, 48)]
flops = sum(2.0 * M * n * k * l for n, k, l in shapes)
dev, dt = "cuda", torch.bfloat16


def irwin_hall(count, std):
  u = torch.randint(0, 65536, (4, count), device=dev, dtype=torch.int32).float().sum(0) / 65536.0
  return ((u - 2.0) * 1.7320508 * std).to(dt)


def run(label, x, w, y):
  def view(buf, r, c): return buf[: r * c].view(r, c)
  def step():
    for l in range(48):
      g = l % 6 == 5
      for n, k, _ in (shapes[1 if g else 0], shapes[3 if g else 2], shapes[4], shapes[5]):
        torch.matmul(view(x, M, k), view(w, n, k).t(), out=view(y, M, n))
  s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  for rep in range(3):
    step(); torch.cuda.synchronize()
    t = []
    for _ in range(5):
      s.record(); step(); e.record(); e.synchronize(); t.append(s.elapsed_time(e))
    ms = sorted(t)[2]
    print(f"torch {label}: {ms:.1f} ms, {flops / ms / 1e9:.0f} TFLOP/s", flush=True)


torch.manual_seed(0)
wmax = max(n * k for n, k, _ in shapes)
y = torch.empty(M * 2 * I, device=dev, dtype=dt)
run("randn", torch.randn(M * I, device=dev, dtype=dt), torch.randn(wmax, device=dev, dtype=dt) * 0.02, y)
run("irwin-hall", irwin_hall(M * I, 1.0), irwin_hall(wmax, 0.02), y)
