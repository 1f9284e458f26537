"""QSA indexed attention (``qsa``, archlab/nn/mixers/qsa.py): a layer against transformers'
``Qwen4ExpTextAttention`` with its ``Qwen4ExpTextQSAIndexer`` (every weight randomised, float32), whole and
decoded in pieces through both caches; a model that decodes in pieces as it runs whole and reads a left-padded
row as that row alone; the count by hand; the refusals."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import decode_in_pieces, randomise

from archlab import ConfigError, build_model, compose_model
from archlab.nn.mixers.base import KVCache
from archlab.nn.mixers.qsa import QSAAttention

pytestmark = pytest.mark.usefixtures("single_thread")

D, H, KV, HD, IH, ID = 32, 4, 2, 8, 4, 8
QSA = [
    "model=nano",
    f"model.d_model={D}",
    "model.n_layer=2",
    "model.vocab_size=64",
    "model/attention=qsa",
    f"model.attention.n_head={H}",
    f"model.attention.n_kv_head={KV}",
    f"model.attention.head_dim={HD}",
    "model.attention.qkv_bias=false",
    "model.attention.out_bias=false",
    "model.attention.gate=elementwise",
    "model.attention.qk_norm=head",
    f"model.attention.index_n_heads={IH}",
    f"model.attention.index_head_dim={ID}",
    "model.attention.index_budget=4",
    "model.attention.index_ratio=2",
    "model/norm=rmsnorm",
    "model.norm.eps=1e-6",
    "model.norm.unit_offset=true",
    "model/position=rope",
    "model.position.rotary_fraction=0.5",
    "model.position.pairing=half",
]


def _theirs():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextAttention, Qwen4ExpTextRotaryEmbedding

    config = transformers.Qwen4ExpTextConfig(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=KV, head_dim=HD, num_hidden_layers=4,
        indexer_n_heads=IH, indexer_kv_heads=1, indexer_head_dim=ID, indexer_budget=4, indexer_compress_ratio=2,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    return config, Qwen4ExpTextAttention(config, 3).eval(), Qwen4ExpTextRotaryEmbedding(config)


def _pair(seed: int):
    cfg = compose_model(QSA)
    model = randomise(build_model(cfg), seed=seed).eval()
    ours = model.blocks[1].attn
    assert isinstance(ours, QSAAttention)
    config, theirs, rope = _theirs()
    q_rows, g_rows = ours.qkv.weight[: H * HD].unflatten(0, (H, HD)), ours.gate.weight.unflatten(0, (H, HD))
    with torch.no_grad():
        theirs.q_proj.weight.copy_(torch.cat((q_rows, g_rows), 1).flatten(0, 1))
        theirs.k_proj.weight.copy_(ours.qkv.weight[H * HD : (H + KV) * HD])
        theirs.v_proj.weight.copy_(ours.qkv.weight[(H + KV) * HD :])
        theirs.o_proj.weight.copy_(ours.proj.weight)
        theirs.q_norm.weight.copy_(ours.q_norm.weight)
        theirs.k_norm.weight.copy_(ours.k_norm.weight)
        theirs.indexer.index_qk_proj.weight.copy_(ours.indexer.qk.weight)
        theirs.indexer.q_layernorm.weight.copy_(ours.indexer.q_norm.weight)
        theirs.indexer.k_layernorm.weight.copy_(ours.indexer.k_norm.weight)
    return cfg, model, ours, config, theirs, rope


def _theirs_out(theirs, rope, x, start, cache, end):
    """transformers' layer on ``x`` (positions start..), its mask causal over every position up to ``end``."""
    T = x.shape[1]
    positions = torch.arange(end).view(1, 1, -1).expand(3, x.shape[0], -1)
    cos, sin = rope(x, positions)
    mask = torch.ones(T, end, dtype=torch.bool).tril(end - T)[None, None].expand(x.shape[0], 1, T, end)
    return theirs(x, (cos, sin), mask, cache)[0]


def test_a_layer_is_transformers_whole_and_in_pieces():
    """Random weights, 13 positions (blocks of 2, a budget of 4 tokens: most queries drop blocks): the output
    equals transformers' whole, and fed through both caches in pieces."""
    from transformers import DynamicCache

    cfg, model, ours, config, theirs, rope = _pair(1)
    x = torch.randn(2, 13, D, generator=torch.Generator().manual_seed(2))
    rot = model.position.rotary(torch.arange(13), x.dtype, cached=False)
    with torch.no_grad():
        whole = ours(x, rot, None, None, 1)
        torch.testing.assert_close(whole, _theirs_out(theirs, rope, x, 0, None, 13), rtol=1e-5, atol=1e-5)
        cache, hf_cache, pieces = KVCache(cfg, 2, 13), DynamicCache(config=config), []
        for start, end in [(0, 5), (5, 6), (6, 7), (7, 13)]:
            rot = model.position.rotary(torch.arange(start, end), x.dtype, cached=True)
            out = ours(x[:, start:end], rot, None, cache, 1)
            cache.length = end
            expected = _theirs_out(theirs, rope, x[:, start:end], start, hf_cache, end)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
            pieces.append(out)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-5, atol=1e-5)


def test_a_model_decodes_in_pieces_as_whole_and_pads_as_alone():
    cfg = compose_model(QSA)
    model = randomise(build_model(cfg), seed=3).eval()
    idx = torch.randint(0, 64, (2, 15), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        whole = model(idx)
        torch.testing.assert_close(decode_in_pieces(model, idx, [4, 5, 9, 15]), whole, rtol=1e-4, atol=1e-4)
        padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), idx[:1, :12]], 1)
        mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 12, dtype=torch.long)], 1)
        torch.testing.assert_close(model(padded, attention_mask=mask)[:, 3:], whole[:1, :12], rtol=1e-4, atol=1e-4)


def test_the_count_is_the_closed_form_worked_by_hand():
    """causal attention's q, k, v, gate, output and QK-norms, 32·(32 + 16 + 16 + 32) + 32·32 + 2·8 = 4,112,
    and the indexer's 32 × 5·8 and two norms of 8: 1,296; transformers' layer holds the same."""
    cfg = compose_model(QSA)
    assert QSAAttention.num_params(cfg, 1) == 4_112 + 1_296
    _, theirs, _ = _theirs()
    assert sum(p.numel() for p in theirs.parameters()) == 4_112 + 1_296


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.attention.index_budget=3"], "model.attention.index_budget"),
        (["model.attention.window=4"], "model.attention.window"),
        (["model.attention.index_ratio=0"], "model.attention.index_ratio"),
    ],
)
def test_bad_settings_name_their_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        compose_model([*QSA, *overrides])
    assert err.value.field == field
