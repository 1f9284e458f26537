"""archlab's Mamba-2 layer against transformers' on the CPU: forward, and forward + backward (issue 28, docs/performance.md).

    python scripts/bench_mamba2.py --threads 2
    python scripts/bench_mamba2.py --lengths 512 1024 2048 --repeats 7 --profile

transformers' ``Mamba2Mixer`` runs its PyTorch path on the CPU (``mamba2_chunk_scan`` and the reference
``causal_conv1d_fn``: mamba_ssm and causal-conv1d are CUDA kernels, and hub kernels are switched off here).
Both layers hold the same weights (the tensors are the same, see tests/test_mamba2.py); their outputs are
compared first, then each length times both, alternating in one process after a warm-up, so the figure
to read is the ratio (HF / archlab, above 1: archlab faster), the median of the per-round ratios.
``--profile`` lists the ops that take archlab's step."""

from __future__ import annotations

import argparse
import os
from statistics import median
from typing import Callable

os.environ["USE_HUB_KERNELS"] = "0"  # transformers' torch path, before transformers is imported

import torch
from omegaconf import OmegaConf
from torch import Tensor
from torch.profiler import ProfilerActivity, profile
from transformers import Mamba2Config
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

from archlab.bench.harness import paired_ratio, time_alternating
from archlab.config import to_model_config
from archlab.nn.mixers.mamba2 import Mamba2


def layers(args: argparse.Namespace) -> tuple[Mamba2, Mamba2Mixer]:
    """Both layers at the same sizes and chunk, transformers' at its own initialisation (its Linear weights
    N(0, 0.02²) so outputs stay order 1), archlab's a copy of it."""
    attention = {"kind": "mamba2", "n_head": args.heads, "n_kv_head": None, "head_dim": args.head_dim}
    attention |= {"state_size": args.state, "groups": args.groups, "qkv_bias": False, "out_bias": False}
    attention |= {"scan_chunk": args.chunk}
    base = {"vocab_size": 256, "n_layer": 1, "d_model": args.d_model, "norm": {"kind": "rmsnorm", "eps": 1e-5}}
    base |= {"position": {"kind": "none"}, "mlp": {"kind": "none"}, "attention": attention}
    hf_cfg = Mamba2Config(
        hidden_size=args.d_model, num_heads=args.heads, head_dim=args.head_dim,
        expand=args.heads * args.head_dim // args.d_model, state_size=args.state, n_groups=args.groups,
        chunk_size=args.chunk, num_hidden_layers=1,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = Mamba2Mixer(hf_cfg, 0).eval()  # eval: the fused training kernel is not tried
    with torch.no_grad():
        for p in (hf.in_proj.weight, hf.out_proj.weight):
            p.normal_(0.0, 0.02)
        hf.conv1d.weight.normal_(0.0, 0.3)
        if hf.conv1d.bias is not None:  # use_conv_bias, Mamba2Config's default
            hf.conv1d.bias.zero_()
    ours = Mamba2(to_model_config(OmegaConf.create(base)))
    names = {"in_proj.weight": "in_proj.weight", "conv_weight": "conv1d.weight", "conv_bias": "conv1d.bias"}
    names |= {"dt_bias": "dt_bias", "A_log": "A_log", "D": "D", "norm_weight": "norm.weight"}
    names |= {"proj.weight": "out_proj.weight"}
    state = hf.state_dict()
    ours.load_state_dict({ours_name: state[hf_name].clone() for ours_name, hf_name in names.items()})
    return ours, hf


def forward(layer: torch.nn.Module, x: Tensor, grad: Tensor) -> Callable[[], None]:
    """One forward of ``layer`` on ``x`` without autograd (``grad`` unused: ``forward_backward``'s signature)."""

    def step() -> None:
        with torch.no_grad():
            layer(x)

    return step


def forward_backward(layer: torch.nn.Module, x: Tensor, grad: Tensor) -> Callable[[], None]:
    """One forward and backward of ``layer`` on ``x`` against the output gradient ``grad``, gradients cleared after."""

    def step() -> None:
        layer(x).backward(grad)
        for p in (*layer.parameters(), x):
            p.grad = None

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--state", type=int, default=128)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=64, help="the chunk of both sides (transformers' default: 256)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="the top ops of archlab's step at the longest length")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    print(
        f"layer: d_model {args.d_model}, {args.heads} heads of {args.head_dim}, state {args.state}, {args.groups} "
        f"groups, conv 4, chunks of {args.chunk} on both sides, batch {args.batch}, float32"
    )
    ours, hf = layers(args)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, max(args.lengths), args.d_model, generator=gen)
    with torch.no_grad():
        expected, got = hf(x), ours(x)
    print(f"outputs at {max(args.lengths)} positions: max |archlab - HF| {(got - expected).abs().max().item():.2e} "
          f"(max |HF| {expected.abs().max().item():.2f})")  # fmt: skip

    print(f"\n## Median of {args.repeats} interleaved rounds after {args.warmup} warm-up\n")
    print("| length | forward: archlab | HF | HF / archlab | forward + backward: archlab | HF | HF / archlab |")
    print("|---|---|---|---|---|---|---|")
    for T in args.lengths:
        x = torch.randn(args.batch, T, args.d_model, generator=gen, requires_grad=True)
        grad = torch.randn(args.batch, T, args.d_model, generator=gen)

        row = [f"{T}"]
        for make in (forward, forward_backward):
            steps = {"archlab": make(ours, x, grad), "hf": make(hf, x, grad)}
            times = time_alternating(steps, args.warmup, args.repeats, torch.device("cpu"))
            ratio = paired_ratio(times["archlab"], times["hf"])[1]  # HF / archlab, the median of the rounds'
            row += [f"{median(times[name]) * 1e3:.0f} ms" for name in steps] + [f"{ratio:.2f}"]
        print("| " + " | ".join(row) + " |")

    if args.profile:
        T = max(args.lengths)
        x = torch.randn(args.batch, T, args.d_model, generator=gen, requires_grad=True)
        ours(x).sum().backward()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            ours(x).sum().backward()
        print(f"\n## archlab's step at {T} positions: top ops by self CPU time\n")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40))


if __name__ == "__main__":
    main()
