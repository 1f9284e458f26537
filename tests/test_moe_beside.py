"""A mixture of experts beside a dense MLP (``model.mlp.beside``, Gemma 4's ``enable_moe_block``) and Gemma's
router (``routing.router_norm``, ``routing.expert_scale``): the sublayer against its formula recomputed token by
token from the weights; decoding in pieces as whole; the count by hand; the refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import decode_in_pieces, randomise

from archlab import ConfigError, build_model, compose_model, count_params

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = ["model=nano", "model.d_model=32", "model.n_layer=2", "model.attention.n_head=4", "model.vocab_size=64"]
TINY += ["model/norm=rmsnorm", "model.norm.eps=1e-6", "model/block=sandwich"]
MOE = [
    "model/mlp=moe",
    "model.mlp.expert=geglu",
    "model.mlp.approximate=tanh",
    "model.mlp.d_ff=48",
    "model.mlp.bias=false",
]
MOE += ["model.mlp.expert_d_ff=16", "model.mlp.routing.n_experts=4", "model.mlp.routing.top_k=2"]
BESIDE = [*TINY, *MOE, "model.mlp.beside=true", "model.mlp.routing.router_norm=true"]
BESIDE += ["model.mlp.routing.expert_scale=true"]


def _rms(x, w=None):
    y = x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()
    return y if w is None else y * w


def _geglu(x, gate_up, down):
    g, u = (x @ gate_up.T).chunk(2, dim=-1)
    return (F.gelu(g, approximate="tanh") * u) @ down.T


def test_the_experts_beside_the_mlp_are_the_formula():
    """norm₁(mlp(h)) + norm₃(Σ_k w_k·expert_k(norm₂(x))) for each token: h the block's normed input, x its stream,
    w from softmax(router(RMS(x)·s·d^-1/2)), top 2 renormalised, times each chosen expert's own scale."""
    model = randomise(build_model(compose_model(BESIDE)), seed=3).eval()
    moe = model.blocks[0].mlp
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(4))
    h = model.blocks[0].mlp_norm(x)
    with torch.no_grad():
        out = moe(h, x)
        dense = _rms(_geglu(h, moe.dense.gate_up.weight, moe.dense.down.weight), moe.dense_norm.weight)
        probs = (_rms(x, moe.router_scale) * 32**-0.5 @ moe.router.weight.T).softmax(-1)
        top, index = probs.topk(2, dim=-1)
        weights = top / top.sum(-1, keepdim=True) * moe.expert_scale[index]
        inner = _rms(x, moe.experts_norm.weight)
        routed = torch.zeros_like(x)
        for b in range(2):
            for t in range(5):
                for k in range(2):
                    e = index[b, t, k]
                    y = _geglu(inner[b, t], moe.experts.gate_up[e], moe.experts.down[e])
                    routed[b, t] += weights[b, t, k] * y
        expected = dense + _rms(routed, moe.experts_out_norm.weight)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_hash_routed_experts_beside_the_mlp_take_the_table_s_experts():
    """With ``selection: hash`` the experts beside the MLP are the table's rows of the tokens (the decoder
    hands the MoE the ids, as it does without ``beside``)."""
    model = build_model(compose_model([*BESIDE, "model.mlp.routing.selection=hash"])).eval()
    idx = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    seen = {}
    moe = model.blocks[0].mlp
    route = moe.route

    def spy(x, ids=None):
        out = route(x, ids)
        seen["indices"] = out[2]
        return out

    moe.route = spy
    with torch.no_grad():
        model(idx)
    assert torch.equal(seen["indices"], moe.token_experts[idx.reshape(-1)])


def test_decoding_in_pieces_is_the_whole():
    model = randomise(build_model(compose_model(BESIDE)), seed=6).eval()
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        whole = model(idx)
    torch.testing.assert_close(decode_in_pieces(model, idx, [7, 8, 12]), whole, rtol=1e-5, atol=1e-5)


def test_the_count_is_the_closed_form_worked_by_hand():
    """d = 32, E = 4: beside, per layer the dense GeGLU 3·32·48 = 4608 and three norms of 32; the router's scale
    32 and the experts' scales 4; active: the router and top 2 of 4 experts (3·32·16 each) as before."""
    plain = count_params(compose_model([*TINY, *MOE]))
    beside = count_params(compose_model(BESIDE))
    assert beside["mlp"] - plain["mlp"] == 2 * (4608 + 3 * 32 + 32 + 4)
    assert beside["active"] - plain["active"] == 2 * (4608 + 3 * 32 + 32 + 4)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ([*BESIDE, "model/block=post"], "model.mlp.beside"),
        ([*BESIDE, "model/stream=mhc"], "model.mlp.beside"),
        ([*BESIDE, "model.mlp.n_shared_experts=1"], "model.mlp.n_shared_experts"),
        ([*BESIDE, "model.mlp.out_norm=true"], "model.mlp.out_norm"),
    ],
)
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        compose_model(overrides)
    assert err.value.field == field
