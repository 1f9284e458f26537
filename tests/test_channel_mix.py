"""RWKV's channel-mix, the MLP kind ``rwkv_channel_mix`` (archlab/nn/channel_mix.py): one layer against
transformers' ``RwkvFeedForward`` with every weight randomised (a prompt, then token by token from the state
each keeps); a whole RWKV model (rwkv4 time-mix and channel-mix) through the mixer contract's checks of cached
decoding, left-padded batches and packed documents, which reach the channel-mix's token shift through the
cache's ``shift`` and the mixer's mask; its count and cache by hand; the refusals."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import BASE, randomise, tiny_attention
from omegaconf import OmegaConf
from test_mixer_contract import check_cached_decoding, check_packed_documents, check_padded_batch, model_of

from archlab import ConfigError, build_model, count_params
from archlab.accounting import kv_cache_bytes
from archlab.config import to_model_config
from archlab.nn.channel_mix import ChannelMix
from archlab.nn.mixers.rwkv4 import RWKV4
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

D, F, T = 32, 40, 9  # width of the model, of the channel-mix's key, length


def rwkv_config(**overrides):
    """BASE's tiny model with RWKV's parts: rwkv4 at TINY's sizes, the channel-mix of F, LayerNorms, an
    embedding norm, no positions."""
    base = {k: v for k, v in BASE.items() if k != "mlp"}
    rwkv = {"attention": tiny_attention("rwkv4"), "mlp": {"kind": "rwkv_channel_mix", "d_ff": F}}
    rwkv |= {"norm": {"kind": "layernorm"}, "position": {"kind": "none"}, "embedding_norm": True}
    return to_model_config(OmegaConf.merge(base, rwkv, overrides))


def test_a_layer_equals_transformers_rwkv_feed_forward():
    transformers = pytest.importorskip("transformers")
    from transformers.models.rwkv.modeling_rwkv import RwkvFeedForward

    m = randomise(ChannelMix(rwkv_config()).double(), seed=1)
    hf = RwkvFeedForward(transformers.RwkvConfig(hidden_size=D, intermediate_size=F, num_hidden_layers=1)).double()
    with torch.no_grad():
        for name in ("time_mix_key", "time_mix_receptance"):
            getattr(hf, name).copy_(getattr(m, name)[None, None])
        for name in ("key", "receptance", "value"):
            getattr(hf, name).weight.copy_(getattr(m, name).weight)
        x = torch.randn(1, T + 3, D, dtype=torch.float64)
        state = [torch.zeros(1, D, 1, dtype=torch.float64)]
        want, state = hf(x[:, :T], state=state)
        cache = build_model(rwkv_config(n_layer=1), dtype=torch.float64).new_cache(1, T + 3)
        torch.testing.assert_close(m(x[:, :T], None, cache), want, rtol=0, atol=1e-12)
        for t in range(T, T + 3):
            want, state = hf(x[:, t : t + 1], state=state)
            torch.testing.assert_close(m(x[:, t : t + 1], None, cache), want, rtol=0, atol=1e-12)


def test_an_rwkv_model_decodes_through_its_cache_as_its_full_forward():
    check_cached_decoding(model_of(rwkv_config()))


def test_an_rwkv_model_computes_a_left_padded_prompt_as_alone():
    check_padded_batch(model_of(rwkv_config()))


def test_an_rwkv_model_computes_packed_documents_as_alone():
    check_packed_documents(model_of(rwkv_config()))


def test_count_and_cache_by_hand():
    """d = 32, f = 40: two mixes 2·32, key and value 2·32·40, receptance 32² = 3648 a layer; the cache adds
    the last input, 32 values a layer, to the time-mix's 32 + 3·24."""
    cfg = rwkv_config()
    assert ChannelMix.num_params(cfg) == 64 + 2560 + 1024 == 3648
    assert sum(p.numel() for p in ChannelMix(cfg).parameters()) == 3648
    assert count_params(cfg)["mlp"] == 2 * 3648
    assert (
        kv_cache_bytes(cfg, 4096, bytes_per_value=4)
        == 2 * (32 + RWKV4.kv_cache_values(cfg, 4096, 0)) * 4
        == 2 * 136 * 4
    )


def test_refused_beside_a_mixer_that_is_not_recurrent():
    """Beside causal attention it would get the attention mask, not the padding and document starts it reads."""
    with pytest.raises(ConfigError, match="model.mlp.kind"):
        cfg = rwkv_config()
        cfg.attention = to_model_config({"attention": {"kind": "causal", "n_head": 4}}).attention
        validate(cfg)


def test_a_bad_width_is_refused():
    with pytest.raises(ConfigError, match="model.mlp.d_ff"):
        validate(rwkv_config(mlp={"d_ff": 0}))
