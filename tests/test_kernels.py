"""The GPU kernels of nn/mixers/ops/kernels.py against the torch forms they replace, within bf16 tolerance: each scan
alone (outputs, final states and every input's gradient, over lengths that are and are not multiples of
the chunk, from a nonzero state), and a model holding both mixers on the GPU against the same model on
the CPU. They need a CUDA device and the kernel's package (the fla and mamba extras); without them they
are skipped; the last test checks that on the CPU the dispatch keeps the torch forms."""

from __future__ import annotations

import pytest
import torch

from archlab import build_model
from archlab.nn.mixers.gated_deltanet import chunked_delta_rule, l2_normalise
from archlab.nn.mixers.mamba2 import chunked_ssd
from archlab.nn.mixers.ops import kernels
from tests.helpers.mixers import assert_relative
from tests.helpers.parts import tiny
from tests.test_deltanet import randomise

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernels run on a CUDA device")
BF16_TOLERANCE = 1e-2  # the largest difference, relative to the largest value compared


def assert_near(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert_relative(actual, expected, BF16_TOLERANCE, what)


def gradients(scan, inputs: list[torch.Tensor], seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``scan``'s output and final state, and the gradients of a random projection of both."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out, state = scan(*leaves)
    gen = torch.Generator(device=out.device).manual_seed(seed)
    weight = torch.randn(out.shape, generator=gen, device=out.device)
    state_weight = torch.randn(state.shape, generator=gen, device=out.device)
    ((out * weight).sum() + (state * state_weight).sum()).backward()
    return [out, state], [t.grad for t in leaves if t.grad is not None]


@cuda
@pytest.mark.parametrize("T", [100, 128])
def test_the_delta_rule_kernel_matches_the_chunked_form(T):
    pytest.importorskip("fla")
    gen = torch.Generator(device="cuda").manual_seed(T)
    B, H, dk, dv = 2, 4, 32, 48
    q = l2_normalise(torch.randn(B, H, T, dk, generator=gen, device="cuda")) * dk**-0.5
    k = l2_normalise(torch.randn(B, H, T, dk, generator=gen, device="cuda"))
    v = torch.randn(B, H, T, dv, generator=gen, device="cuda")
    g = -torch.rand(B, H, T, generator=gen, device="cuda")
    beta = torch.rand(B, H, T, generator=gen, device="cuda")
    state = torch.randn(B, H, dk, dv, generator=gen, device="cuda") * 0.5
    assert kernels.delta_rule_applies(q)
    inputs = [q, k, v, g, beta, state]
    got, got_grads = gradients(kernels.delta_rule, inputs, seed=1)
    want, want_grads = gradients(
        lambda q, k, v, g, beta, s: chunked_delta_rule(q, k, v, g, beta, 64, s), inputs, seed=1
    )
    for name, a, b in zip(("output", "state"), got, want, strict=True):
        assert_near(a, b, name)
    for name, a, b in zip(("q", "k", "v", "g", "beta", "state"), got_grads, want_grads, strict=True):
        assert_near(a, b, f"the gradient of {name}")


@cuda
@pytest.mark.parametrize("T", [100, 128])
def test_the_ssd_kernel_matches_the_chunked_form(T):
    pytest.importorskip("mamba_ssm")
    gen = torch.Generator(device="cuda").manual_seed(T)
    b, H, P, G, N = 2, 4, 32, 2, 32
    x = torch.randn(b, T, H, P, generator=gen, device="cuda")
    dt = torch.rand(b, T, H, generator=gen, device="cuda") * 0.5
    A = -2 * torch.rand(H, generator=gen, device="cuda")
    B, C = (torch.randn(b, T, G, N, generator=gen, device="cuda") for _ in range(2))
    state = torch.randn(b, H, P, N, generator=gen, device="cuda") * 0.5
    assert kernels.ssd_applies(x)
    inputs = [x, dt, A, B, C, state]
    got, got_grads = gradients(lambda x, dt, A, B, C, s: kernels.ssd(x, dt, A, B, C, 64, s), inputs, seed=1)
    want, want_grads = gradients(lambda x, dt, A, B, C, s: chunked_ssd(x, dt, A, B, C, 64, s), inputs, seed=1)
    for name, a, c in zip(("output", "state"), got, want, strict=True):
        assert_near(a, c, name)
    for name, a, c in zip(("x", "dt", "A", "B", "C", "state"), got_grads, want_grads, strict=True):
        assert_near(a, c, f"the gradient of {name}")


# one Gated DeltaNet, one Mamba-2 and one attention layer, every weight random
GDN = {"kind": "gated_deltanet", "n_head": 4}
GDN |= {"key_heads": 2, "key_head_dim": 32, "v_head_dim": 32}
M2 = {"kind": "mamba2", "n_head": 4, "head_dim": 32, "state_size": 32, "groups": 2}
MIXED = {
    "d_model": 64,
    "context_length": 160,
    "n_layer": 3,
    "attention": {"qkv_bias": False, "out_bias": False},
    "layers": {
        "kinds": {"deltanet": {"attention": GDN}, "mamba": {"attention": M2}, "attention": {}},
        "pattern": ["deltanet", "mamba", "attention"],
    },
}


@cuda
def test_a_model_with_both_mixers_computes_on_the_gpu_what_it_computes_on_the_cpu(monkeypatch):
    """The same weights on both devices: the logits and every weight's gradient; on the GPU both kernels ran,
    once each."""
    pytest.importorskip("fla")
    pytest.importorskip("mamba_ssm")
    idx = torch.randint(0, 48, (2, 150), generator=torch.Generator().manual_seed(0))

    def run(model, ids):
        logits = model(ids)
        logits.logsumexp(-1).mean().backward()
        return logits.cpu(), {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}

    want, want_grads = run(randomise(build_model(tiny(**MIXED))), idx)
    called = []

    def spy(name, kernel):
        def counted(*args):
            called.append(name)
            return kernel(*args)

        return counted

    for name in ("delta_rule", "ssd"):
        monkeypatch.setattr(kernels, name, spy(name, getattr(kernels, name)))
    got, got_grads = run(randomise(build_model(tiny(**MIXED))).cuda(), idx.cuda())
    assert called == ["delta_rule", "ssd"]
    assert_near(got, want, "logits")
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        assert_near(got_grads[name], grad, f"the gradient of {name}")


def test_on_the_cpu_the_torch_forms_run_where_the_kernels_are_installed(monkeypatch):
    """The kernels are CUDA's: with both packages present (stand-ins here), a model on the CPU still runs the
    torch forms, and computes what it computes without them."""
    model = randomise(build_model(tiny(**MIXED))).eval()
    idx = torch.randint(0, model.cfg.vocab_size, (2, 70), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(idx)
        monkeypatch.setattr(kernels, "_load", lambda module: object())

        def refuse(*args):
            raise AssertionError("a GPU kernel ran on the CPU")

        monkeypatch.setattr(kernels, "delta_rule", refuse)
        monkeypatch.setattr(kernels, "ssd", refuse)
        assert torch.equal(model(idx), expected)
