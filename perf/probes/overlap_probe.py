# Probe (issue 12): does running a prefill step as two row halves on two CUDA streams hide the
# memory-bound kernels (norms, rope/KV write, gelu*up) under the other half's GEMMs?
# Torch stand-ins with the 12B local layer's shapes; cuBLAS GEMMs via torch.matmul. Prints
# ms per layer for: one stream 8192 rows; one stream two 4096-row halves; two streams.
import sys
import torch
import torch.nn.functional as F

H, I, QO, KVO = 3840, 15360, 4096, 2048
import os
LAYERS, REPS = 8, int(os.environ.get("REPS", "5"))
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)
# Weights of std 1/sqrt(k) and an RMS norm before every GEMM input keep the activations near unit
# scale, rep after rep. Two earlier versions did not: one let x grow without bound (its GEMMs
# ran on inf/NaN), the next let it shrink to zero; in both the tensor cores ran faster than on
# random bits (~787 against ~680 TFLOP/s), so their overlap figures do not count. The script
# prints the GEMM-only rate: it must read ~680 TFLOP/s-equivalent for the figures to count.
Ws = [dict(qkv=torch.randn(QO + 2 * KVO, H, device=dev, dtype=dt) * H ** -0.5,
           o=torch.randn(H, QO, device=dev, dtype=dt) * QO ** -0.5,
           gu=torch.randn(2 * I, H, device=dev, dtype=dt) * H ** -0.5,
           d=torch.randn(H, I, device=dev, dtype=dt) * I ** -0.5,
           n=torch.ones(H, device=dev, dtype=dt)) for _ in range(LAYERS)]


def bufs(rows):
  return dict(x=torch.randn(rows, H, device=dev, dtype=dt), h=torch.randn(rows, H, device=dev, dtype=dt),
              qkv=torch.empty(rows, QO + 2 * KVO, device=dev, dtype=dt),
              o=torch.empty(rows, H, device=dev, dtype=dt),
              gu=torch.empty(rows, 2 * I, device=dev, dtype=dt),
              act=torch.empty(rows, I, device=dev, dtype=dt))


def ops(b, W, attn):
  rows = b["x"].shape[0]
  seqs = rows // 2048
  def qkv(): torch.matmul(b["h"], W["qkv"].t(), out=b["qkv"])
  def rope(): b["qkv"].mul_(1.0)
  def att():
    if not attn: return
    q = b["qkv"][:, :QO].view(seqs, 2048, 16, 256).transpose(1, 2)
    k = b["qkv"][:, QO:QO + KVO].view(seqs, 2048, 8, 256).transpose(1, 2)
    v = b["qkv"][:, QO + KVO:].view(seqs, 2048, 8, 256).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    b["attn"] = a.transpose(1, 2).reshape(rows, QO)
  def o():
    src = b["attn"] if attn else b["qkv"][:, :QO]
    torch.matmul(src, W["o"].t(), out=b["o"])
  def n1(): b["x"].add_(b["o"]); b["h"].copy_(F.rms_norm(b["x"], (H,), W["n"]))
  def gu(): torch.matmul(b["h"], W["gu"].t(), out=b["gu"])
  def gelu():
    torch.mul(b["gu"][:, :I], b["gu"][:, I:], out=b["act"])  # gelu*up's bytes: read 2, write 1
  def down(): torch.matmul(b["act"], W["d"].t(), out=b["o"])
  def n2(): b["x"].add_(b["o"]); b["h"].copy_(F.rms_norm(b["x"], (H,), W["n"]))
  return [qkv, rope, att, o, n1, gu, gelu, down, n2]


def timed(fn):
  s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
  fn(); torch.cuda.synchronize()
  t = []
  for _ in range(REPS):
    s.record(); fn(); e.record(); e.synchronize(); t.append(s.elapsed_time(e))
  if os.environ.get("TRACE"):
    print("  per rep ms/layer:", " ".join(f"{x / LAYERS:.2f}" for x in t), flush=True)
  t.sort()
  return t[len(t) // 2] / LAYERS


def main():
  for attn in (False, True):
    full, ha, hb = bufs(8192), bufs(4096), bufs(4096)
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    def one():
      for W in Ws:
        for f in ops(full, W, attn): f()
    def halves_serial():
      for W in Ws:
        for f in ops(ha, W, attn) + ops(hb, W, attn): f()
    def two_streams():
      cur = torch.cuda.current_stream()
      sa.wait_stream(cur); sb.wait_stream(cur)
      for W in Ws:
        A, B = ops(ha, W, attn), ops(hb, W, attn)
        for fa, fb in zip(A, B):
          with torch.cuda.stream(sa): fa()
          with torch.cuda.stream(sb): fb()
      cur.wait_stream(sa); cur.wait_stream(sb)
    def only(kind):
      names = {"gemm": (0, 3, 5, 7), "mem": (1, 4, 6, 8), "attn": (2,)}[kind]
      def fn():
        for W in Ws:
          fs = ops(full, W, attn)
          for i in names: fs[i]()
      return fn
    r = dict(one=timed(one), halves=timed(halves_serial), streams=timed(two_streams),
             gemm=timed(only("gemm")), mem=timed(only("mem")))
    if attn: r["attn"] = timed(only("attn"))
    print(("attention " if attn else "no attention ") +
          " ".join(f"{k}={v:.3f}" for k, v in r.items()) + " ms/layer", flush=True)
    print(f"  finite: {bool(torch.isfinite(full['x']).all())}, |h| rms "
          f"{full['h'].float().pow(2).mean().sqrt().item():.2f}; GEMMs "
          f"{3672e9 / (r['gemm'] * 1e-3) / 1e12:.0f} TFLOP/s", flush=True)
    print(f"  two streams vs one: {r['streams'] / r['one']:.3f}; hidden of mem: "
          f"{(r['one'] - r['streams']) / r['mem']:.2f}", flush=True)


main()
