"""PyTorch scaled_dot_product_attention on the 12B prefill shapes (perf/NOTES.md).

Same shapes as gates/prefill_attention_bench.cc: 16 query heads, causal, bf16; head_dim 256
over 8 KV heads and head_dim 512 over 1 KV head; 4 x 2048 and 1 x 8192 tokens. Each backend
is tried alone; one that refuses the shape is reported as such. TFLOP/s counts the causal
FLOPs (4 x head_dim per visible (row, head, key)), median of 15 CUDA-event timings.
"""
import statistics
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def time_ms(fn, warmup=3, repeats=15):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    torch.manual_seed(0)
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    print("| head_dim | kv heads | step | backend | ms | TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for hd, kvh in ((256, 8), (512, 1)):
        for b, s in ((4, 2048), (1, 8192)):
            q = (torch.rand(b, 16, s, hd, device="cuda", dtype=torch.bfloat16) - 0.5)
            k = torch.rand(b, kvh, s, hd, device="cuda", dtype=torch.bfloat16) * 2 - 1
            v = torch.rand(b, kvh, s, hd, device="cuda", dtype=torch.bfloat16) * 2 - 1
            # GQA expanded up front: not every backend takes enable_gqa.
            ke = k.repeat_interleave(16 // kvh, dim=1)
            ve = v.repeat_interleave(16 // kvh, dim=1)
            flops = 4.0 * hd * 16 * b * s * (s + 1) / 2
            for name, backend in backends:
                try:
                    with sdpa_kernel(backend):
                        ms = time_ms(lambda: F.scaled_dot_product_attention(
                            q, ke, ve, is_causal=True, scale=1.0))
                    print(f"| {hd} | {kvh} | {b} x {s} | {name} | {ms:.3f} | "
                          f"{flops / ms / 1e9:.1f} |")
                except RuntimeError as e:
                    print(f"| {hd} | {kvh} | {b} x {s} | {name} | refused | "
                          f"{str(e).splitlines()[0][:60]} |")


if __name__ == "__main__":
    main()
