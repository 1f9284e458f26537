"""archlab's Gated DeltaNet layer against transformers' on the CPU: forward and backward (issue 28, docs/performance.md).

    python scripts/bench_deltanet.py --threads 2
    python scripts/bench_deltanet.py --lengths 512 1024 2048 --batch 1 --repeats 7 --profile

Issue 28 asks that a ``gated_deltanet`` layer's forward and backward on the CPU run at least as fast as
transformers' own PyTorch path of the same layer (``Qwen3NextGatedDeltaNet`` with
``torch_chunk_gated_delta_rule``: no flash-linear-attention or causal-conv1d kernels exist on the CPU, and
hub kernels are switched off here). Both layers hold the same weights (the mapping of
tests/test_deltanet.py); their outputs are compared first, then each length times forward + backward of
both, alternating in one process after a warm-up, so the figure to read is the ratio (HF / archlab, above 1:
archlab faster), the median of the per-round ratios. The two chunked kernels alone (``chunked_delta_rule``
and ``torch_chunk_gated_delta_rule`` on the same normed q, k, v, g, β) follow, and ``--profile`` lists the
ops that take archlab's step."""

from __future__ import annotations

import argparse
import importlib.util
import os
from statistics import median
from typing import Callable

os.environ["USE_HUB_KERNELS"] = "0"  # transformers' torch path, before transformers is imported

import torch
from omegaconf import OmegaConf
from torch import Tensor
from torch.profiler import ProfilerActivity, profile
from transformers import Qwen3NextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as hf_module
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

from archlab.bench.harness import paired_ratio, time_alternating
from archlab.config import ModelConfig, to_model_config
from archlab.nn.mixers.gated_deltanet import GatedDeltaNet, chunked_delta_rule, l2_normalise


def configs(args: argparse.Namespace) -> tuple[ModelConfig, Qwen3NextConfig]:
    """One layer's sizes on both sides: archlab's ModelConfig and transformers' Qwen3NextConfig."""
    attention = {"kind": "gated_deltanet", "n_head": args.heads, "n_kv_head": None, "qkv_bias": False}
    attention |= {"out_bias": False, "key_heads": args.key_heads, "key_head_dim": args.key_dim}
    attention |= {"v_head_dim": args.value_dim, "conv_kernel": 4, "scan_chunk": args.chunk}
    base = {"vocab_size": 256, "context_length": max(args.lengths), "n_layer": 1, "d_model": args.d_model}
    base |= {"norm": {"kind": "rmsnorm", "eps": 1e-6}, "position": {"kind": "none"}, "attention": attention}
    hf = Qwen3NextConfig(
        hidden_size=args.d_model, linear_num_key_heads=args.key_heads, linear_num_value_heads=args.heads,
        linear_key_head_dim=args.key_dim, linear_value_head_dim=args.value_dim, linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6, num_hidden_layers=1, layer_types=["linear_attention"],
    )  # fmt: skip
    return to_model_config(OmegaConf.create(base)), hf


def copy_weights(ours: GatedDeltaNet, hf: Qwen3NextGatedDeltaNet) -> None:
    """Qwen3-Next groups its in-projection rows per query/key head ([q, k, v, z] and [b, a] of each);
    archlab's one in-projection is [q | k | v | z | b | a] over all heads: the same rows, regrouped."""
    Hk, dk, dv, r = hf.num_k_heads, hf.head_k_dim, hf.head_v_dim, hf.num_v_heads // hf.num_k_heads
    qkvz = hf.in_proj_qkvz.weight.unflatten(0, (Hk, 2 * dk + 2 * r * dv)).split((dk, dk, r * dv, r * dv), dim=1)
    ba = hf.in_proj_ba.weight.unflatten(0, (Hk, 2 * r)).split((r, r), dim=1)
    weights = {
        "in_proj.weight": torch.cat([part.flatten(0, 1) for part in (*qkvz, *ba)]),
        "conv_weight": hf.conv1d.weight[:, 0],
        "A_log": hf.A_log,
        "dt_bias": hf.dt_bias,
        "norm_weight": hf.norm.weight,
        "proj.weight": hf.out_proj.weight,
    }
    ours.load_state_dict({name: w.detach().clone() for name, w in weights.items()})


def layers(args: argparse.Namespace) -> tuple[GatedDeltaNet, Qwen3NextGatedDeltaNet]:
    """Both layers, transformers' at its own initialisation (Linear weights N(0, 0.02²) so outputs stay
    order 1), archlab's a copy of it."""
    cfg, hf_cfg = configs(args)
    torch.manual_seed(0)
    hf = Qwen3NextGatedDeltaNet(hf_cfg, 0)
    with torch.no_grad():
        for p in (hf.in_proj_qkvz.weight, hf.in_proj_ba.weight, hf.out_proj.weight):
            p.normal_(0.0, 0.02)
        hf.conv1d.weight.normal_(0.0, 0.3)
    ours = GatedDeltaNet(cfg)
    copy_weights(ours, hf)
    return ours, hf


def archlab_kernel(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, chunk: int) -> Tensor:
    """``chunked_delta_rule`` in transformers' layout ([B, T, H, d]), queries scaled by 1/sqrt(dk) as HF's are."""
    q, k, v, g, beta = (t.transpose(1, 2) for t in (q * q.shape[-1] ** -0.5, k, v, g, beta))
    return chunked_delta_rule(q, k, v, g, beta, chunk)[0].transpose(1, 2)


def hf_kernel(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, chunk: int) -> Tensor:
    """transformers' ``torch_chunk_gated_delta_rule`` (its chunk: 64)."""
    return hf_module.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta)[0]


KERNELS = {"archlab": archlab_kernel, "hf": hf_kernel}
CPU = torch.device("cpu")


def fwd_bwd(fn: Callable[..., Tensor], inputs: tuple, grad: Tensor, params: list[Tensor]) -> Callable[[], None]:
    """One forward and backward of ``fn(*inputs)`` against a fixed output gradient, gradients cleared after."""

    def step() -> None:
        fn(*inputs).backward(grad)
        for p in params:
            p.grad = None

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16, help="value heads (one state each)")
    parser.add_argument("--key-heads", type=int, default=8, help="query/key heads")
    parser.add_argument("--key-dim", type=int, default=128)
    parser.add_argument("--value-dim", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=64, help="archlab's scan_chunk (transformers': 64)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="the top ops of archlab's step at the longest length")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fused = [name for name in ("fla", "causal_conv1d", "kernels") if importlib.util.find_spec(name) is not None]
    print(f"torch {torch.__version__}, {args.threads} threads; kernel packages installed: {fused or 'none'}")
    print(
        f"layer: d_model {args.d_model}, {args.heads} value heads of {args.value_dim}, {args.key_heads} query/key "
        f"heads of {args.key_dim}, conv 4, chunks of {args.chunk} (HF 64), batch {args.batch}, float32"
    )
    ours, hf = layers(args)
    B, d, H, dk, dv = args.batch, args.d_model, args.heads, args.key_dim, args.value_dim
    gen = torch.Generator().manual_seed(1)

    x = torch.randn(B, max(args.lengths), d, generator=gen)
    with torch.no_grad():
        expected, got = hf(x), ours(x)
    print(f"outputs at {max(args.lengths)} positions: max |archlab - HF| {(got - expected).abs().max().item():.2e} "
          f"(max |HF| {expected.abs().max().item():.2f})")  # fmt: skip

    print(f"\n## Layer forward + backward: median of {args.repeats} interleaved rounds after {args.warmup} warm-up\n")
    print("| length | archlab | HF | HF / archlab |\n|---|---|---|---|")
    for T in args.lengths:
        x = torch.randn(B, T, d, generator=gen, requires_grad=True)
        grad = torch.randn(B, T, d, generator=gen)
        steps = {
            name: fwd_bwd(layer, (x,), grad, [*layer.parameters(), x])
            for name, layer in (("archlab", ours), ("hf", hf))
        }
        times = time_alternating(steps, args.warmup, args.repeats, CPU)
        ratio = paired_ratio(times["archlab"], times["hf"])[1]  # HF / archlab, the median of the rounds'
        ta, tb = median(times["archlab"]), median(times["hf"])
        print(f"| {T} | {ta * 1e3:.0f} ms | {tb * 1e3:.0f} ms | {ratio:.2f} |")

    print("\n## The chunked kernels alone, forward + backward (same normed q, k, v, g, β; H value heads)\n")
    print("| length | chunked_delta_rule | torch_chunk_gated_delta_rule | HF / archlab |\n|---|---|---|---|")
    for T in args.lengths:
        q = l2_normalise(torch.randn(B, T, H, dk, generator=gen)).requires_grad_()
        k = l2_normalise(torch.randn(B, T, H, dk, generator=gen)).requires_grad_()
        v = torch.randn(B, T, H, dv, generator=gen, requires_grad=True)
        g = (-3 * torch.rand(B, T, H, generator=gen)).requires_grad_()
        beta = torch.rand(B, T, H, generator=gen, requires_grad=True)
        grad = torch.randn(B, T, H, dv, generator=gen)
        inputs = (q, k, v, g, beta, args.chunk)
        with torch.no_grad():
            diff = (archlab_kernel(*inputs) - hf_kernel(*inputs)).abs().max().item()
        steps = {name: fwd_bwd(kernel, inputs, grad, [q, k, v, g, beta]) for name, kernel in KERNELS.items()}
        times = time_alternating(steps, args.warmup, args.repeats, CPU)
        ratio = paired_ratio(times["archlab"], times["hf"])[1]
        ta, tb = median(times["archlab"]), median(times["hf"])
        print(f"| {T} | {ta * 1e3:.0f} ms | {tb * 1e3:.0f} ms | {ratio:.2f} |  (max difference {diff:.1e})")

    if args.profile:
        T = max(args.lengths)
        x = torch.randn(B, T, d, generator=gen, requires_grad=True)
        grad = torch.randn(B, T, d, generator=gen)
        for name, layer in (("archlab", ours), ("HF", hf)):
            step = fwd_bwd(layer, (x,), grad, [*layer.parameters(), x])
            step()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
            print(f"\n## {name}'s step at {T} positions: top ops by self CPU time\n")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40))


if __name__ == "__main__":
    main()
