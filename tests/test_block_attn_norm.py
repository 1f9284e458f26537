"""``model.block.attn_norm: false`` (archlab/nn/block.py's pre wiring): attention reads the stream unnormed and
no norm is built; by layer kind, the first layer alone (ModernBERT's decoder). Held to transformers'
``ModernBertDecoderLayer`` 0 and 1 around archlab's own sublayers, its count, its refusals."""

import pytest
import torch
from helpers.hf import check_routed_family_refuses, layout
from helpers.parts import build, plain
from torch import nn

from archlab import ConfigError, count_params
from archlab.nn.validation import ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")

# layer 0 of kind bare (no attention norm), layer 1 the model's own
FIRST_BARE = {"kinds": {"bare": {"block": {"attn_norm": False}}}, "first": ["bare"]}
LAYERNORM = {"kind": "layernorm", "eps": 1e-5, "bias": False}


class _Attention(nn.Module):
    """archlab's attention of a block in the place of ``ModernBertDecoderAttention`` (its (output, weights))."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, hidden_states, **_):
        return self.block.attn(hidden_states, None, None, None, self.block.layer), None


def test_the_first_layer_is_modernberts_and_the_second_keeps_its_norm():
    """Layer 0 (kind bare) equals transformers' ModernBertDecoderLayer 0, whose attn_norm is an Identity, and
    layer 1 its layer 1 with the norm, each wrapped around archlab's attention and MLP, norms copied."""
    from transformers.models.modernbert_decoder.configuration_modernbert_decoder import ModernBertDecoderConfig
    from transformers.models.modernbert_decoder.modeling_modernbert_decoder import ModernBertDecoderLayer

    cfg = plain(layers=FIRST_BARE, norm=LAYERNORM, mlp={"kind": "geglu", "bias": False})
    model = build(cfg).float()
    hf_cfg = ModernBertDecoderConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    assert model.blocks[0].attn_norm is None and model.blocks[1].attn_norm is not None
    x = torch.randn(2, 5, 32) * 2
    for layer, block in enumerate(model.blocks):
        hf = ModernBertDecoderLayer(hf_cfg, layer)
        assert isinstance(hf.attn_norm, nn.Identity) == (layer == 0)
        hf.attn, hf.mlp = _Attention(block), block.mlp
        with torch.no_grad():
            hf.mlp_norm.load_state_dict(block.mlp_norm.state_dict())
            if layer:
                hf.attn_norm.load_state_dict(block.attn_norm.state_dict())
            torch.testing.assert_close(block(x), hf(x, position_embeddings=None))


def test_the_count_leaves_out_one_norm():
    """One norm fewer than the model whose every layer has its attention norm; nothing ignored."""
    cfg = plain(layers=FIRST_BARE, norm=LAYERNORM)
    assert count_params(cfg)["norms"] == count_params(plain(norm=LAYERNORM))["norms"] - 32
    assert ignored(cfg) == []


@pytest.mark.parametrize("kind", ["post", "sandwich", "parallel", "normed_skip"])
def test_other_wirings_refuse_it(kind):
    with pytest.raises(ConfigError) as error:
        validate(plain(block={"kind": kind, "attn_norm": False}))
    assert error.value.field == "model.block.attn_norm"


def test_families_refuse_it():
    check_routed_family_refuses("gpt_neox", layout("model.block.attn_norm=false"), "model.block.attn_norm")
