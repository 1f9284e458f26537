"""``model.attention.output_gate: sigmoid`` on gated_deltanet (Qwen4-Exp's ``output_gate_type``): the layer
against transformers' ``Qwen4ExpTextGatedDeltaNet`` with a sigmoid gate and with silu (every weight randomised,
float32), and Qwen3-Next's record refusing sigmoid."""

import pytest
import torch
from helpers.mixers import randomise

from archlab import compose_model
from archlab.interop.families import FAMILIES
from archlab.nn.mixers.gated_deltanet import GatedDeltaNet

pytestmark = pytest.mark.usefixtures("single_thread")

D, H, HK, DK, DV = 32, 4, 2, 8, 6
GDN = [
    "model=nano",
    f"model.d_model={D}",
    "model.n_layer=2",
    "model.vocab_size=64",
    "model/attention=gated_deltanet",
    f"model.attention.n_head={H}",
    f"model.attention.key_heads={HK}",
    f"model.attention.key_head_dim={DK}",
    f"model.attention.v_head_dim={DV}",
    "model/norm=rmsnorm",
    "model.norm.eps=1e-6",
    "model/position=none",
]


@pytest.mark.parametrize("gate", ["sigmoid", "silu"])
def test_the_layer_is_qwen4_exps_gated_deltanet(gate):
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextGatedDeltaNet

    ours = randomise(GatedDeltaNet(compose_model([*GDN, f"model.attention.output_gate={gate}"])), seed=1).eval()
    config = transformers.Qwen4ExpTextConfig(
        hidden_size=D, linear_num_value_heads=H, linear_num_key_heads=HK, linear_key_head_dim=DK,
        linear_value_head_dim=DV, rms_norm_eps=1e-6, output_gate_type=gate, num_hidden_layers=4,
    )  # fmt: skip
    theirs = Qwen4ExpTextGatedDeltaNet(config, 0).eval()
    qkv, z, b, a = ours.in_proj.weight.split((2 * HK * DK + H * DV, H * DV, H, H))
    with torch.no_grad():
        for name, w in (("in_proj_qkv", qkv), ("in_proj_z", z), ("in_proj_b", b), ("in_proj_a", a)):
            getattr(theirs, name).weight.copy_(w)
        theirs.conv1d.weight.copy_(ours.conv_weight.unsqueeze(1))
        theirs.A_log.copy_(ours.A_log)
        theirs.dt_bias.copy_(ours.dt_bias)
        theirs.norm.weight.copy_(ours.norm_weight)
        theirs.out_proj.weight.copy_(ours.proj.weight)
        x = torch.randn(2, 9, D, generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_qwen3_next_refuses_a_sigmoid_gate():
    tiny = ["model.n_layer=4", "model.d_model=64", "model.attention.n_head=4", "model.attention.head_dim=16"]
    sigmoid = "+model.layers.kinds.deltanet.attention.output_gate=sigmoid"
    cfg = compose_model(["model=qwen3-next-80b-a3b", *tiny, sigmoid])
    problems = [p.field for p in FAMILIES["qwen3_next"].problems(cfg)]
    assert problems == ["model.layers.kinds.deltanet.attention.output_gate"]
