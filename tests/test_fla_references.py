"""archlab's rules against flash-linear-attention's own torch references (``fla/ops/<op>/naive.py``), an
implementation written apart from transformers' and from the float64 recurrences of the other tests: Kimi
Delta Attention (``naive_recurrent_kda``, ``naive_chunk_kda``), the gated delta rule of Gated DeltaNet
(``naive_recurrent_gated_delta_rule``, ``naive_chunk_gated_delta_rule``) and simple GLA, the scalar-decay
linear attention that SSD computes for Mamba-2 and lightning attention (``naive_recurrent_simple_gla``,
``naive_chunk_simple_gla``). Outputs and final states, over a length no chunk divides, from a nonzero
state. fla is in the dev extra; its package imports triton, which a CPU machine lacks, so each reference
file is loaded alone (it needs torch and einops only)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import assert_relative

from archlab.nn.mixers.ops.delta_rule import chunked_delta_rule, recurrent_delta_rule
from archlab.nn.mixers.ops.kda_rule import chunked_kda_rule, recurrent_kda_rule
from archlab.nn.mixers.ops.ssd import chunked_ssd, recurrent_ssd

B, T, H, DK, DV = 2, 37, 3, 8, 6
CHUNK = 16
# float32 on both sides (the references compute in float32): differences measured at most 4.1e-7 of the
# largest output; a wrong decay, write or read is off by its own size
TOLERANCE = 1e-5


def reference(op: str) -> ModuleType:
    """``fla/ops/<op>/naive.py``, loaded alone."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed (it is in the dev extra)")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / op / "naive.py"
    loaded = importlib.util.spec_from_file_location(f"fla_naive_{op}", path)
    assert loaded is not None and loaded.loader is not None, f"{path} is missing: fla's layout changed"
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def assert_forms_match(reference: tuple[torch.Tensor, torch.Tensor], form: str, **ours) -> None:
    """Each of ``ours`` (a form's name: its outputs and final state, laid out as fla's) against the
    reference's outputs and state."""
    o, S = reference
    for name, (outputs, state) in ours.items():
        assert_relative(outputs, o, TOLERANCE, f"{name} outputs against {form}")
        assert_relative(state, S, TOLERANCE, f"{name} final state against {form}")


def operands(seed: int, per_channel: bool) -> dict[str, torch.Tensor]:
    """Heads-first ``[B, H, T, d]`` operands of a delta rule: unit-norm keys, queries scaled by dk^-1/2,
    log-decays in (−0.5, 0) per key channel or per head, write strengths in (0, 1), a starting state."""
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, H, T, DK, generator=g), dim=-1) * DK**-0.5
    k = F.normalize(torch.randn(B, H, T, DK, generator=g), dim=-1)
    v = torch.randn(B, H, T, DV, generator=g)
    decay = -0.5 * torch.rand(B, H, T, *((DK,) if per_channel else ()), generator=g)
    beta = torch.rand(B, H, T, generator=g)
    state = torch.randn(B, H, DK, DV, generator=g)
    return {"q": q, "k": k, "v": v, "g": decay, "beta": beta, "state": state}


def time_first(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.transpose(1, 2) for t in tensors]  # [B, H, T, ...] -> fla's [B, T, H, ...]


def heads_last(outputs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return outputs.transpose(1, 2), state  # a rule's [B, H, T, dv] outputs as fla's [B, T, H, dv]


@pytest.mark.parametrize("form", ["naive_recurrent_kda", "naive_chunk_kda"])
def test_kda_rule_is_fla_reference(form):
    x = operands(0, per_channel=True)
    extra = {}
    if form == "naive_chunk_kda":  # it takes whole chunks only: the first two
        x = {name: t[:, :, : 2 * CHUNK] if name != "state" else t for name, t in x.items()}
        extra = {"chunk_size": CHUNK}
    q, k, v, g, beta = time_first(x["q"], x["k"], x["v"], x["g"], x["beta"])
    expected = getattr(reference("kda"), form)(
        q, k, v, g, beta, scale=1.0, initial_state=x["state"], output_final_state=True, **extra
    )
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    chunked, recurrent = chunked_kda_rule(*args, CHUNK, x["state"]), recurrent_kda_rule(*args, x["state"])
    assert_forms_match(expected, form, chunked=heads_last(*chunked), recurrent=heads_last(*recurrent))


@pytest.mark.parametrize("form", ["naive_recurrent_gated_delta_rule", "naive_chunk_gated_delta_rule"])
def test_delta_rule_is_fla_reference(form):
    x = operands(1, per_channel=False)
    q, k, v, g, beta = time_first(x["q"], x["k"], x["v"], x["g"], x["beta"])
    module = reference("gated_delta_rule")
    if form == "naive_chunk_gated_delta_rule":
        expected = module.naive_chunk_gated_delta_rule(
            q, k, v, g, beta, chunk_size=CHUNK, scale=1.0, initial_state=x["state"], output_final_state=True
        )
    else:
        expected = module.naive_recurrent_gated_delta_rule(
            q, k, v, beta, g, scale=1.0, initial_state=x["state"], output_final_state=True
        )
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    chunked, recurrent = chunked_delta_rule(*args, CHUNK, x["state"]), recurrent_delta_rule(*args, x["state"])
    assert_forms_match(expected, form, chunked=heads_last(*chunked), recurrent=heads_last(*recurrent))


@pytest.mark.parametrize("form", ["naive_recurrent_simple_gla", "naive_chunk_simple_gla"])
def test_ssd_is_fla_simple_gla(form):
    """SSD with time steps dt and rates A is simple GLA with log-decays dt·A, keys B, queries C and values
    dt·x (lightning attention: dt = 1, A the heads' slopes); its state is GLA's transposed."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(B, T, H, DV, generator=g)
    dt = torch.rand(B, T, H, generator=g) + 0.1
    A = -torch.rand(H, generator=g)
    keys, queries = torch.randn(B, T, H, DK, generator=g) * 0.5, torch.randn(B, T, H, DK, generator=g) * 0.5
    state = torch.randn(B, H, DK, DV, generator=g)
    module = reference("simple_gla")
    gla = {"initial_state": state, "output_final_state": True}
    if form == "naive_chunk_simple_gla":
        gla["chunk_size"] = CHUNK
    expected = getattr(module, form)(queries, keys, x * dt[..., None], dt * A, scale=1.0, **gla)
    ssd_state = state.transpose(-1, -2)  # [B, H, P, N]
    chunked = chunked_ssd(x, dt, A, keys, queries, CHUNK, ssd_state)
    recurrent = recurrent_ssd(x, dt, A, keys, queries, ssd_state)
    assert_forms_match(
        expected,
        form,
        chunked=(chunked[0], chunked[1].transpose(-1, -2)),
        recurrent=(recurrent[0], recurrent[1].transpose(-1, -2)),
    )
