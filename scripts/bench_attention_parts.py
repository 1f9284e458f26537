"""What issue 26's attention parts cost and which kernel runs them, on a GPU or the CPU (docs/performance.md).

    python scripts/bench_attention_parts.py                 # the GPU if there is one, else the CPU (smaller)
    python scripts/bench_attention_parts.py device=cpu

Three parts: (A) the device against the CPU in float32 (logits, every gradient, bf16 logits, cached greedy
decoding) on tiny random models past every window and chunk; (B) the attention kernels a bf16 training step
runs, beside the path archlab-bench names; (C) that step's median time and peak memory per variant,
variants interleaved round by round in one process. The "before" row runs sinks as the float bias
[1, H, Tq, Tk + 1] archlab used until the sink key replaced it, for the ratio between the two."""

from __future__ import annotations

import statistics
import sys
import time
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

import archlab.nn.mixers.attention as attention
from archlab import build_model, compose_model
from archlab.bench.harness import attention_paths
from archlab.generate import generate
from archlab.nn.model import Decoder

TINY = ["model=nano", "model/position=rope", "model.attention.n_kv_head=2", "model.context_length=128"]
CHECKS = {
    "sinks": ["model.attention.sinks=true"],
    "sinks, window": ["model.attention.sinks=true", "model.attention.window=16"],
    "sinks, softcap": ["model.attention.sinks=true", "model.attention.softcap=5.0"],
    "sinks, sliding/full layers": [
        "model.attention.sinks=true",
        "model/layers=irope",
        "model.layers.kinds.local.attention.window=16",
    ],
    "chunk, l2 QK-norm, query scale": [
        "model.attention.chunk=16",
        "model.attention.qk_norm=l2",
        "model.attention.query_scale_beta=0.1",
        "model.attention.query_scale_length=8",
    ],
    "iRoPE, chunked local layers": [
        "model/layers=irope",
        "model.layers.kinds.local.attention.window=null",
        "+model.layers.kinds.local.attention.chunk=16",
    ],
    "gate elementwise": ["model.attention.gate=elementwise"],
    "gate head": ["model.attention.gate=head"],
}
VARIANTS = {
    "plain": [],
    "window=512": ["model.attention.window=512"],
    "sinks": ["model.attention.sinks=true"],
    "sinks as a float bias (before)": ["model.attention.sinks=true"],
    "sinks, window=512": ["model.attention.sinks=true", "model.attention.window=512"],
    "gate=elementwise": ["model.attention.gate=elementwise"],
    "gate=head": ["model.attention.gate=head"],
    "chunk=512": ["model.attention.chunk=512"],
    "rope": ["model/position=rope"],
    "rope, qk_norm=l2": ["model/position=rope", "model.attention.qk_norm=l2"],
    "query_scale_beta=0.1": ["model.attention.query_scale_beta=0.1"],
    "softcap=50": ["model.attention.softcap=50.0"],
}
SINK_KEY = attention.sink_key


def float_bias_sinks(
    q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], sinks: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The earlier sink path, in ``sink_key``'s place: one more zero key last, the mask a float bias whose
    last column is each head's sink (SDPA's memory-efficient kernel, not flash, takes a float bias)."""
    H, Tq, Tk = q.shape[1], q.shape[2], k.shape[2]
    visible = attention.visible_keys(mask, Tq, Tk, q.device)
    bias = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill(~visible, float("-inf"))
    bias = bias.view((1,) * (4 - bias.dim()) + tuple(bias.shape)).expand(1, H, Tq, Tk)
    column = sinks.to(q.dtype).view(1, H, 1, 1).expand(1, H, Tq, 1)
    zero = k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])
    return q, torch.cat((k, zero), 2), torch.cat((v, zero), 2), torch.cat((bias, column), -1)


def relative(a: Tensor, b: Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


def randomised(overrides: list[str], device: torch.device) -> Decoder:
    """A tiny model with every weight moved off its init: vectors (biases, norm scales, sinks) by N(0, 0.5²)."""
    torch.manual_seed(0)
    model = build_model(compose_model(overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.02))
    return model.to(device)


def check_against_cpu(device: torch.device) -> int:
    """Part A; the number of variants that failed."""
    print(f"\n## A. {device.type} against the CPU in float32 (96 tokens: past every window and chunk)")
    failures = 0
    for name, overrides in CHECKS.items():
        cpu, dev = randomised(TINY + overrides, torch.device("cpu")), randomised(TINY + overrides, device)
        x = torch.randint(0, 256, (3, 96))
        expected, got = cpu(x), dev(x.to(device))
        expected.square().mean().backward()
        got.square().mean().backward()
        grads = max(relative(d.grad, c.grad) for c, d in zip(cpu.parameters(), dev.parameters()))  # type: ignore[arg-type]
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            low = dev(x.to(device))
        prompt = x[:2, :40]
        with torch.no_grad():
            same = bool((generate(cpu.eval(), prompt, 60) == generate(dev.eval(), prompt.to(device), 60).cpu()).all())
        ok = relative(got, expected) < 1e-5 and grads < 1e-4 and relative(low, expected) < 3e-2 and same
        failures += not ok
        print(
            f"{name:32s} logits {relative(got, expected):.1e}  gradients (max) {grads:.1e}  "
            f"bf16 logits {relative(low, expected):.1e}  cached greedy decoding equal: {same}  {'OK' if ok else 'FAIL'}"
        )
    return failures


def main() -> None:
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    device = torch.device(args.get("device", "cuda" if torch.cuda.is_available() else "cpu"))
    small = device.type == "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__} on {name}")
    failures = check_against_cpu(device) if device.type != "cpu" else 0

    layers, d, heads, batch, T = (2, 256, 4, 2, 256) if small else (4, 1024, 16, 8, 2048)
    size = [f"model.n_layer={layers}", f"model.d_model={d}", f"model.attention.n_head={heads}"]
    size += ["model.vocab_size=32000", f"model.context_length={T}"]
    models = {}
    for variant, overrides in VARIANTS.items():
        cfg = compose_model(["model=nano", *size, *overrides])
        models[variant] = (cfg, build_model(cfg, device=device))
    x = torch.randint(0, 32000, (batch, T), device=device)

    def step(variant: str) -> None:
        attention.sink_key = float_bias_sinks if variant.endswith("(before)") else SINK_KEY  # type: ignore[assignment]
        model = models[variant][1]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).flatten(0, 1).float(), x.flatten())
        loss.backward()
        model.zero_grad(set_to_none=True)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    print(f"\n## B. Attention kernels of a bf16 training step ({batch} x {T} tokens), and archlab-bench's name")
    kind = device.type.upper()  # the profiler's DeviceType name: CUDA or CPU
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for variant, (cfg, _) in models.items():
        step(variant)
        with profile(activities=activities) as prof:
            step(variant)
        words = ("flash", "fmha", "efficient", "attention")
        kernels = sorted(
            {
                e.key[:60]
                for e in prof.key_averages()
                if e.device_type.name == kind and any(w in e.key.lower() for w in words)
            }
        )
        print(
            f"{variant}\n    archlab-bench: {attention_paths(cfg, device, torch.bfloat16, T)}\n    kernels: {kernels[:4]}"
        )

    rounds, per_round = (3, 1) if small else (9, 5)
    print(f"\n## C. bf16 training step (forward and backward): {layers} layers, d_model {d}, {heads} heads, ")
    print(f"batch {batch} x {T}; median of {rounds} interleaved rounds of {per_round} steps\n")
    memory: dict[str, float] = {}
    for variant in models:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        step(variant)
        synchronize()
        if device.type == "cuda":
            memory[variant] = torch.cuda.max_memory_allocated(device) / 2**30
    times: dict[str, list[float]] = {variant: [] for variant in models}
    for _ in range(rounds):
        for variant in models:
            synchronize()
            start = time.perf_counter()
            for _ in range(per_round):
                step(variant)
            synchronize()
            times[variant].append((time.perf_counter() - start) / per_round)
    plain = statistics.median(times["plain"])
    print("| variant | step | vs plain | spread (max/min) | peak memory |\n|---|---|---|---|---|")
    for variant, seconds in times.items():
        median = statistics.median(seconds)
        peak = f"{memory[variant]:.2f} GiB" if variant in memory else "-"
        print(
            f"| `{variant}` | {median * 1e3:.1f} ms | {median / plain:.2f}x | {max(seconds) / min(seconds):.2f} | {peak} |"
        )
    attention.sink_key = SINK_KEY
    if failures:
        sys.exit(f"{failures} variant(s) differ from the CPU")


if __name__ == "__main__":
    main()
