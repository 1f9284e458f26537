"""mla's output gate (``model.attention.gate``, Ling's ``g_proj``): each head's output times sigmoid(W·x),
one value per head or per value dim, before the output projection. Checked against a float64 forward
written here from the weights, by count, μP role, the cache, dsa beside it and the families that refuse it."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import randomise
from omegaconf import OmegaConf

from archlab import build_model
from archlab.accounting import check_build
from archlab.config import to_model_config
from archlab.errors import ConfigError
from archlab.interop.families import FAMILIES
from archlab.nn.component import Role
from archlab.nn.mixers.mla import MultiHeadLatentAttention
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

# 4 heads of nope 6 + rope 4 (v 5), a 16-dim latent, d_model 32
MLA = {"kind": "mla", "n_head": 4, "kv_lora_rank": 16, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5}


def tiny(gate: str, **attention):
    """2 layers of mla with ``gate``, no positions (the reference below rotates nothing), RMSNorm eps 1e-6."""
    base = {
        "vocab_size": 48,
        "context_length": 16,
        "n_layer": 2,
        "d_model": 32,
        "norm": {"kind": "rmsnorm", "eps": 1e-6, "bias": False},
        "position": {"kind": "none"},
        "attention": MLA | {"gate": gate} | attention,
        "mlp": {"kind": "swiglu", "bias": False},
        "head": {"tied": False},
    }
    return to_model_config(OmegaConf.merge(base, {}))


def reference(attn: MultiHeadLatentAttention, x: torch.Tensor, gated: bool = True) -> torch.Tensor:
    """The layer in float64, written out: direct queries, the latent RMS-normed (eps 1e-6), keys [nope |
    shared rope part], causal softmax at 1/sqrt(10), each head's output times sigmoid(gate(x)) (``gated``),
    proj."""
    w = {n: p.detach().double() for n, p in attn.named_parameters()}
    x = x.double()
    B, T, _ = x.shape
    H, nope, rope, v_dim, r = 4, 6, 4, 5, 16
    q = (x @ w["q_proj.weight"].T).view(B, T, H, nope + rope)
    down = x @ w["kv_down.weight"].T
    latent, k_rope = down[..., :r], down[..., r:]
    latent = latent * torch.rsqrt(latent.pow(2).mean(-1, keepdim=True) + 1e-6) * w["kv_norm.weight"]
    kv = (latent @ w["kv_up.weight"].T).view(B, T, H, nope + v_dim)
    k = torch.cat((kv[..., :nope], k_rope[:, :, None].expand(B, T, H, rope)), dim=-1)
    v = kv[..., nope:]
    scores = torch.einsum("bthd,bshd->bhts", q, k) / (nope + rope) ** 0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v)  # [B, T, H, v]
    gate = torch.sigmoid(x @ w["gate.weight"].T).view(B, T, H, -1) if gated else 1.0
    return (y * gate).reshape(B, T, H * v_dim) @ w["proj.weight"].T


@pytest.mark.parametrize("gate", ["head", "elementwise"])
def test_the_gated_layer_equals_the_reference(gate):
    cfg = tiny(gate)
    attn = MultiHeadLatentAttention(cfg)
    randomise(attn)
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = attn(x)
    expected = reference(attn, x)
    assert (expected - reference(attn, x, gated=False)).abs().max() > 0.05  # the gate moves the output
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gate, width", [("none", 0), ("head", 4), ("elementwise", 20)])
def test_the_gate_adds_d_model_times_its_width(gate, width):
    """d·H (head) or d·H·v (elementwise) over the ungated layer; the meta build agrees."""
    cfg = tiny(gate)
    assert MultiHeadLatentAttention.num_params(cfg) == MultiHeadLatentAttention.num_params(tiny("none")) + 32 * width
    check_build(cfg, build_model(cfg, device="meta"))


def test_mu_p_roles_as_the_causal_kinds_gate():
    """A gate per head reads the width into one value per head: an output; per value dim: hidden."""
    head, elementwise = (
        MultiHeadLatentAttention(tiny(g)).param_roles()["gate.weight"] for g in ("head", "elementwise")
    )
    assert (head, elementwise) == (Role.OUTPUT, Role.HIDDEN)


@pytest.mark.parametrize("kind", ["mla", "dsa"])
def test_cached_decoding_with_the_gate_equals_the_full_forward(kind):
    """Each decoding step gates its own positions (dsa: an indexer keeping 3 keys, the gate beside it)."""
    extra = {"index_n_heads": 2, "index_head_dim": 8, "index_topk": 3} if kind == "dsa" else {}
    cfg = tiny("head", kind=kind, **extra)
    model = build_model(cfg)
    randomise(model).eval()
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 12)
        steps = [model(idx[:, :5], cache)] + [model(idx[:, t : t + 1], cache) for t in range(5, 12)]
        gate = model.get_submodule("blocks.0.attn.gate")
        assert isinstance(gate, torch.nn.Linear)
        gate.weight.zero_()  # every gate of the first layer at 1/2: other logits
        assert not torch.allclose(model(idx), full)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5 * full.abs().max().item())


def test_an_unknown_gate_is_refused():
    with pytest.raises(ConfigError) as error:
        validate(tiny("channel"))
    assert error.value.field == "model.attention.gate"


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3", "kimi_linear", "minicpm3", "deepseek_v32"])
def test_the_mla_families_without_a_gate_refuse_it(family):
    """FEATURES' model.attention.gate: a family whose latent attention has no gate names the field."""
    cfg = tiny("head", kind="dsa" if family == "deepseek_v32" else "mla")
    assert "model.attention.gate" in [p.field for p in FAMILIES[family].problems(cfg)]
