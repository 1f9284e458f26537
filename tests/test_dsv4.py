"""DeepSeek-V4's attention (``dsv4``, archlab/nn/mixers/dsv4.py), each against an independent expectation:
a layer against transformers' ``DeepseekV4Attention`` (a layer without compression) with every weight
randomised, a full and a sliding window, plain and left-padded rows; the contract suite's decoding, padding
and document checks again with a sliding window (tests/test_mixer_contract.py runs them without one); the
grouped projection's FLOPs by PyTorch's counter; the per-layer count against transformers' module at
DeepSeek-V4-Flash's sizes and by hand; the cache by hand; and the refusals."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers.mixers import mixer_config, randomise
from test_mixer_contract import check_cached_decoding, check_packed_documents, check_padded_batch
from torch.utils.flop_counter import FlopCounterMode

from archlab import build_model
from archlab.errors import ConfigError
from archlab.nn.mixers.dsv4 import DeepSeekV4Attention
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

# the contract suite's sizes: d 32, 4 heads of 8 (the trailing 4 rotated), q rank 6, 2 output groups of 5
SIZES = {"n_head": 4, "head_dim": 8, "qk_rope_head_dim": 4, "q_lora_rank": 6, "o_groups": 2, "o_lora_rank": 5}
EPS, THETA, T = 1e-6, 500.0, 12


def dsv4(window=None, **attention):
    """A 2-layer model of dsv4 at the contract sizes, interleaved RoPE of base 500, RMSNorm at 1e-6."""
    position = {"kind": "rope", "pairing": "interleaved", "theta": THETA}
    return mixer_config(
        "dsv4", attention={"window": window} | attention, position=position, norm={"kind": "rmsnorm", "eps": EPS}
    )


def hf_attention(window: int) -> tuple[Any, Any]:
    """transformers' DeepseekV4Attention of a sliding layer at the same sizes (window ``window``), its
    weights randomised, and its rotary embedding."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Attention, DeepseekV4RotaryEmbedding

    config = DeepseekV4Config(
        vocab_size=48, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, head_dim=8,
        partial_rotary_factor=0.5, q_lora_rank=6, o_groups=2, o_lora_rank=5, sliding_window=window,
        layer_types=["sliding_attention"], rope_theta=THETA, rms_norm_eps=EPS,
    )  # fmt: skip
    config._attn_implementation = "eager"
    attention = randomise(DeepseekV4Attention(config, 0), seed=1).eval()
    return attention, DeepseekV4RotaryEmbedding(config)


def copied(attention) -> DeepSeekV4Attention:
    """transformers' weights in archlab's layer, by name."""
    names = {"q_a_proj": "q_down", "q_a_norm": "q_norm", "q_b_proj": "q_up", "kv_proj": "kv_proj"}
    names |= {"kv_norm": "kv_norm", "o_a_proj": "o_a", "o_b_proj": "o_b", "sinks": "sinks"}
    state = {}
    for name, tensor in attention.state_dict().items():
        head, _, rest = name.partition(".")
        state[".".join(filter(None, (names[head], rest)))] = tensor
    return state


@pytest.mark.parametrize("window", [T, 5], ids=["every-key", "window-5"])
@pytest.mark.parametrize("padded", [False, True], ids=["plain", "left-padded"])
def test_a_layer_equals_transformers_deepseek_v4_attention(window, padded):
    """Two rows of 12 (the second left-padded by 4 where ``padded``): archlab's layer with transformers'
    weights gives its output in float32 within 1e-5 of its largest at every position that is a token, its
    rotary at each row's positions (numbered from the row's first token) and the mask hiding the padding
    (transformers rotates and norms in float32 whatever the dtype: float64 would gain nothing)."""
    hf, rotary_emb = hf_attention(window)
    model = build_model(dsv4(window=None if window == T else window)).eval()
    attn = model.blocks[0].attn
    attn.load_state_dict(copied(hf))
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(2))
    present = torch.ones(2, T, dtype=torch.bool)
    if padded:
        present[1, :4] = False
    positions = (present.long().cumsum(-1) - 1).clamp(min=0)
    i = torch.arange(T)
    distance = i[:, None] - i[None, :]
    visible = (distance >= 0) & (distance < window) & present[:, None, :]
    visible = (visible | torch.eye(T, dtype=torch.bool))[:, None]  # [B, 1, T, T]; a pad sees itself
    bias = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
    with torch.no_grad():
        cos_sin = rotary_emb(x, position_ids=positions, layer_type="main")
        expected, _ = hf(x, {"main": cos_sin}, positions, bias)
        rotary = model.position.rotary(positions, torch.float32)
        got = attn(x, rotary, visible)
    assert expected.abs().max() > 1
    torch.testing.assert_close(got[present], expected[present], rtol=0, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("check", [check_cached_decoding, check_padded_batch, check_packed_documents])
def test_the_contract_checks_hold_with_a_sliding_window(check):
    """Window 5 over 12 positions: cached decoding (the cache keeping 4), a left-padded batch and packed
    documents as the contract suite checks them."""
    check(randomise(build_model(dsv4(window=5), dtype=torch.float64), seed=3).eval())


def test_the_sinks_and_the_turning_back_move_the_output():
    """Each part acts: sinks at 0 instead of the drawn ones, or the output left unturned, move the logits."""
    model = randomise(build_model(dsv4(window=5), dtype=torch.float64), seed=4).eval()
    idx = torch.randint(0, 48, (2, T), generator=torch.Generator().manual_seed(5))
    attn, rotary = model.blocks[0].attn, model.position.rotary(torch.arange(T), torch.float64)
    y = torch.randn(2, T, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert (attn.output(y, rotary) - attn.output(y, None)).abs().max() > 1e-3
        full = model(idx)
        for block in model.blocks:
            block.attn.sinks.zero_()
        assert (model(idx) - full).abs().max() > 1e-3


def test_the_grouped_projection_costs_what_its_weights_count():
    """PyTorch's counter over the layer less its attention: 2 FLOPs per weight and token, every matrix
    counted by ``num_params`` (the grouped block-diagonal product as its H·hd·o_r weights, not o_groups
    times more), the norms and sinks apart."""
    cfg = dsv4()
    attn = build_model(cfg).blocks[0].attn
    x = torch.randn(2, T, 32)
    with FlopCounterMode(display=False) as whole:
        attn(x)
    q, kv = attn.project(x, None)
    with FlopCounterMode(display=False) as scores:
        attn.attend(q, kv, None)
    matrices = DeepSeekV4Attention.num_params(cfg) - (6 + 8) - 4  # less the two norms' scales and the sinks
    assert whole.get_total_flops() - scores.get_total_flops() == 2 * 2 * T * matrices


# ---- closed forms ----

FLASH = {"n_head": 64, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8}
FLASH |= {"o_lora_rank": 1024, "window": 128}


def test_per_layer_count_is_transformers_at_deepseek_v4_flash_sizes():
    """d 4096, 64 heads of 512, q rank 1024, 8 groups of 1024: 4096·1024 + 1024 + 1024·64·512 + 4096·512 +
    512 + 64·512·1024 + 8·1024·4096 + 64 = 106,956,352, transformers' sliding layer's numel (meta)."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Attention

    by_hand = 4096 * 1024 + 1024 + 1024 * 64 * 512 + 4096 * 512 + 512 + 64 * 512 * 1024 + 8 * 1024 * 4096 + 64
    assert by_hand == 106_956_352
    cfg = mixer_config("dsv4", d_model=4096, attention=FLASH)
    assert DeepSeekV4Attention.num_params(cfg) == by_hand
    config = DeepseekV4Config(num_hidden_layers=1, layer_types=["sliding_attention"])
    with torch.device("meta"):
        hf = DeepseekV4Attention(config, 0)
    assert sum(p.numel() for p in hf.parameters()) == by_hand


def test_cache_and_extra_flops_by_hand():
    """The cache: the one head of 512 over min(window 128, length) positions; the scores: 12·64·512 per key
    seen (at most 128)."""
    cfg = mixer_config("dsv4", d_model=4096, attention=FLASH)
    assert DeepSeekV4Attention.kv_cache_values(cfg, 100, 0) == 512 * 100
    assert DeepSeekV4Attention.kv_cache_values(cfg, 4096, 0) == 512 * 128
    assert DeepSeekV4Attention.extra_flops(cfg, 4096, 0) == 12 * 64 * 512 * 128


def test_a_sliding_cache_keeps_the_window_less_one():
    """After 12 tokens a window-5 layer keeps 4 positions of one 8-dim head, and nothing beside them."""
    model = build_model(dsv4(window=5), dtype=torch.float64).eval()
    cache = model.new_cache(1, T)
    with torch.no_grad():
        model(torch.zeros(1, T, dtype=torch.long), cache)
    assert [tuple(k.shape) for k in cache.k] == [(1, 1, 4, 8)] * 2
    assert all(v.numel() == 0 for v in cache.v)


# ---- refusals ----


@pytest.mark.parametrize(
    "attention,field",
    [
        ({"qk_rope_head_dim": 3}, "model.attention.qk_rope_head_dim"),  # RoPE turns pairs
        ({"qk_rope_head_dim": 10}, "model.attention.qk_rope_head_dim"),  # more than the head's 8
        ({"o_groups": 3}, "model.attention.o_groups"),  # 32 output dims in 3 groups
        ({"q_lora_rank": 0}, "model.attention.q_lora_rank"),
        ({"o_lora_rank": 0}, "model.attention.o_lora_rank"),
        ({"window": 0}, "model.attention.window"),
        ({"dropout": 1.5}, "model.attention.dropout"),
    ],
)
def test_each_refused_setting_names_its_field(attention, field):
    with pytest.raises(ConfigError) as error:
        validate(dsv4(**attention))
    assert error.value.field == field


def test_rope_cannot_narrow_the_rotated_part():
    with pytest.raises(ConfigError) as error:
        validate(mixer_config("dsv4", position={"kind": "rope", "rotary_dim": 2}))
    assert error.value.field == "model.position.rotary_dim"


def test_describe_names_the_parts():
    assert DeepSeekV4Attention.describe(dsv4(window=5)) == (
        "dsv4 4h x 8 (4 rotated) over 1 shared kv head, q_lora 6, 2 output groups of 5, sinks, window 5"
    )
