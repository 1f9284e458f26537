"""archlab's recurrent token mixers against transformers' own torch path of the same layer, on the CPU:
forward, and forward + backward (issue 42, docs/performance.md).

    python scripts/bench_mixers.py --threads 2
    python scripts/bench_mixers.py --mixers mamba --lengths 512 1024 --repeats 7

Each mixer's transformers model is built with one layer at the sizes below and converted by archlab's own
Hugging Face record (``archlab.interop.hf.from_hf``), so both layers hold the same weights; the script
compares their outputs first, then times both at each length, alternating in one process after a warm-up:
the figure to read is the ratio (HF / archlab, above 1: archlab faster), the median of the per-round
ratios. transformers runs its PyTorch path (hub kernels off; mamba_ssm, causal-conv1d and fla are CUDA
kernels). A mixer whose family archlab does not convert in this checkout is skipped, saying so."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from statistics import median
from typing import Any, Callable, cast

os.environ["USE_HUB_KERNELS"] = "0"  # transformers' torch path, before transformers is imported

import torch
import transformers
from torch import Tensor, nn

from archlab.bench.harness import paired_ratio, time_alternating
from archlab.errors import ConfigError
from archlab.interop.hf import from_hf


@dataclass(frozen=True)
class Case:
    """One mixer: transformers' model and config class, its config keys at benchmark sizes (one layer), the
    path of the layer's mixer inside it, and how to call that mixer on hidden states alone."""

    model_class: str
    config_class: str
    keys: dict[str, Any]
    path: str
    call: Callable[[nn.Module, Tensor], Tensor]


def first(output: Any) -> Tensor:
    """A layer's output tensor, where it returns a tuple."""
    return output[0] if isinstance(output, tuple) else output


CASES: dict[str, Case] = {
    # Mamba-1: 2·d_model channels of state 16, Δ of rank d_model/16, conv 4 (MambaConfig's proportions)
    "mamba": Case(
        "MambaForCausalLM",
        "MambaConfig",
        dict(hidden_size=1024, state_size=16, expand=2, conv_kernel=4, use_bias=False, use_conv_bias=True),
        "backbone.layers.0.mixer",
        lambda layer, x: layer(x),
    ),
    # Griffin's recurrent block, RecurrentGemma's proportions: lru_width d_model, gates in 8 blocks, conv 4
    "rglru": Case(
        "RecurrentGemmaForCausalLM",
        "RecurrentGemmaConfig",
        dict(num_attention_heads=8, block_types=["recurrent"], conv1d_width=4, intermediate_size=256),
        "model.layers.0.temporal_block",
        lambda layer, x: layer(x, torch.arange(x.shape[1])[None].expand(x.shape[0], -1), None, use_cache=False),
    ),
    # Kimi Delta Attention, Kimi-Linear's proportions: heads of 128, conv 4, a one-layer model of it alone
    "kda": Case(
        "KimiLinearForCausalLM",
        "KimiLinearConfig",
        dict(num_attention_heads=8, num_key_value_heads=8, linear_num_heads=8, linear_head_dim=128)
        | dict(layer_types=["linear_attention"], mlp_layer_types=["dense"], intermediate_size=256),
        "model.layers.0.self_attn",
        lambda layer, x: layer(x),
    ),
    # LFM2's gated short convolution, conv 3, one conv layer
    "short_conv": Case(
        "Lfm2ForCausalLM",
        "Lfm2Config",
        dict(num_attention_heads=8, num_key_value_heads=8, layer_types=["conv"], conv_L_cache=3)
        | dict(intermediate_size=256, block_auto_adjust_ff_dim=False),
        "model.layers.0.conv",
        lambda layer, x: layer(x),
    ),
    # xLSTM's mLSTM layer, xLSTM-7B's proportions: 8 heads, keys half the values' width, chunks of 64
    "mlstm": Case(
        "xLSTMForCausalLM",
        "xLSTMConfig",
        dict(num_heads=8, num_blocks=1, return_last_states=True),
        "backbone.blocks.0.mlstm_layer",
        lambda layer, x: layer(x),
    ),
    # MiniMax-01's lightning attention: heads of 128, blocks of 256, one linear-attention layer
    "lightning": Case(
        "MiniMaxForCausalLM",
        "MiniMaxConfig",
        dict(num_attention_heads=6, num_key_value_heads=6, head_dim=128, layer_types=["linear_attention"])
        | dict(intermediate_size=256, num_local_experts=2, num_experts_per_tok=1),
        "model.layers.0.self_attn",
        lambda layer, x: layer(x, None, None),
    ),
    # Falcon-H1's parallel mixer: attention and Mamba-2 side by side on one normed input, each scaled (its
    # multipliers, which archlab's record folds into the weights); H1's proportions at d_model 768: 8 query
    # heads of 64 over 2 key heads, SSM heads of 64 with state 128, in one group, conv 4
    "parallel": Case(
        "FalconH1ForCausalLM",
        "FalconH1Config",
        dict(num_attention_heads=8, num_key_value_heads=2, head_dim=64, intermediate_size=256)
        | dict(mamba_d_ssm=1536, mamba_n_heads=24, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1)
        | dict(mamba_chunk_size=128, attention_in_multiplier=0.5, ssm_out_multiplier=0.25, attn_out_multiplier=2.0),
        "model",
        lambda model, x: parallel_mixer(model, x),
    ),
}


def parallel_mixer(model: Any, x: Tensor) -> Tensor:
    """Falcon-H1's first layer's mixers on ``x`` as its decoder layer sums them (``FalconH1DecoderLayer``: the
    norm before and the MLP after left out), causal attention at positions 0..T-1."""
    layer = model.layers[0]
    positions = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    attn = layer.self_attn(
        hidden_states=x * layer.attention_in_multiplier,
        attention_mask=None,
        position_embeddings=model.rotary_emb(x, positions),
    )[0]
    return layer.mamba(hidden_states=x) * layer.ssm_out_multiplier + attn * layer.attn_out_multiplier


class Mixer(nn.Module):
    """archlab's first layer's mixer called as its Decoder calls it on ``x`` alone: with the model's rotation
    of positions 0..T-1 (a mixer with attention rotates its queries and keys; a recurrent one ignores it)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self.mixer: Any = model.blocks[0].attn

    def forward(self, x: Tensor) -> Tensor:
        rotary = cast(Any, self.model).position.rotary(torch.arange(x.shape[1]), x.dtype, cached=False)
        return self.mixer(x, rotary)


def layers(name: str, d_model: int, seed: int = 0) -> tuple[Mixer, nn.Module]:
    """archlab's mixer (as ``Mixer`` calls it) and transformers' for ``name``, the same weights: transformers'
    model at its own initialisation, converted by archlab's record."""
    case = CASES[name]
    keys = dict(case.keys, hidden_size=d_model, num_hidden_layers=1, vocab_size=256, pad_token_id=0)
    keys |= dict(bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    hf = getattr(transformers, case.model_class)(getattr(transformers, case.config_class)(**keys)).eval()
    return Mixer(from_hf(hf).eval()), hf.get_submodule(case.path)


def forward(call: Callable[[], Tensor], grad: Tensor, params: list[Tensor]) -> Callable[[], None]:
    """One forward without autograd (``grad`` and ``params`` unused: ``forward_backward``'s signature)."""

    def step() -> None:
        with torch.no_grad():
            call()

    return step


def forward_backward(call: Callable[[], Tensor], grad: Tensor, params: list[Tensor]) -> Callable[[], None]:
    """One forward and backward against the output gradient ``grad``, the gradients of ``params`` cleared after."""

    def step() -> None:
        call().backward(grad)
        for p in params:
            p.grad = None

    return step


def bench(name: str, args: argparse.Namespace) -> None:
    """Outputs compared, then the timing table of mixer ``name``."""
    try:
        ours, hf = layers(name, args.d_model)
    except (ConfigError, KeyError, AttributeError) as e:
        print(f"\n## {name}: skipped ({type(e).__name__}: {e})")
        return
    case = CASES[name]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, max(args.lengths), args.d_model, generator=gen)
    with torch.no_grad():
        expected, got = first(case.call(hf, x)), ours(x)
    print(f"\n## {name}: {sum(p.numel() for p in ours.mixer.parameters()):,} parameters a layer")
    print(
        f"\noutputs at {max(args.lengths)} positions: max |archlab - HF| {(got - expected).abs().max().item():.2e} "
        f"(max |HF| {expected.abs().max().item():.2f}); median of {args.repeats} interleaved rounds after "
        f"{args.warmup} warm-up\n"
    )
    print("| length | forward: archlab | HF | HF / archlab | forward + backward: archlab | HF | HF / archlab |")
    print("|---|---|---|---|---|---|---|")
    for T in args.lengths:
        x = torch.randn(args.batch, T, args.d_model, generator=gen, requires_grad=True)
        grad = torch.randn(args.batch, T, args.d_model, generator=gen)
        calls = {
            "archlab": (lambda x=x: ours(x), [*ours.mixer.parameters(), x]),
            "hf": (lambda x=x: first(case.call(hf, x)), [*hf.parameters(), x]),
        }
        row = [f"{T}"]
        for make in (forward, forward_backward):
            steps = {side: make(call, grad, params) for side, (call, params) in calls.items()}
            times = time_alternating(steps, args.warmup, args.repeats, torch.device("cpu"))
            ratio = paired_ratio(times["archlab"], times["hf"])[1]  # HF / archlab, the median of the rounds'
            row += [f"{median(times[side]) * 1e3:.0f} ms" for side in steps] + [f"{ratio:.2f}"]
        print("| " + " | ".join(row) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mixers", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} threads, ", end="")
    print(f"d_model {args.d_model}, batch {args.batch}, float32")
    for name in args.mixers:
        bench(name, args)


if __name__ == "__main__":
    main()
