"""DeepSeek-V4's attention (``dsv4``, archlab/nn/mixers/dsv4.py), each against an independent expectation:
a layer against transformers' ``DeepseekV4Attention`` (a layer without compression) with every weight
randomised, a full and a sliding window, plain and left-padded rows; the contract suite's decoding, padding
and document checks again without blocks and with a sliding window (tests/test_mixer_contract.py runs them
on CSA layers without a window); HCA and CSA layers against transformers' and through those checks; the
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
    """A 2-layer model of dsv4 at the contract sizes, no blocks unless ``attention`` asks, interleaved RoPE of
    base 500, RMSNorm at 1e-6."""
    position = {"kind": "rope", "pairing": "interleaved", "theta": THETA}
    attention = {"window": window, "compress": "none"} | attention
    return mixer_config("dsv4", attention=attention, position=position, norm={"kind": "rmsnorm", "eps": EPS})


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
    q, kv, _ = attn.project(x, None)
    with FlopCounterMode(display=False) as scores:
        attn.attend(q, kv, None)
    matrices = DeepSeekV4Attention.num_params(cfg) - (6 + 8) - 4  # less the two norms' scales and the sinks
    assert whole.get_total_flops() - scores.get_total_flops() == 2 * 2 * T * matrices


# ---- the compressors: HCA and CSA ----

LAYER_TYPES = {"hca": "heavily_compressed_attention", "csa": "compressed_sparse_attention"}
# (compress, rate, window): blocks of 4 beside a window of 5; of 3 with no window; CSA's overlapping blocks of 2
# and 3, 2 of them per query by an indexer of 8 heads of 6 (ties at a relu's 0 unlikely, which topk breaks at will)
COMPRESSED = [("hca", 4, 5), ("hca", 3, None), ("csa", 2, 5), ("csa", 3, None)]
INDEXER = {"index_n_heads": 8, "index_head_dim": 6, "index_topk": 2}
COMPRESS_THETA = 800.0


def compressing(compress: str, rate: int, window, theta: float = THETA):
    """``dsv4``'s model with every layer compressing (``INDEXER``'s indexer where CSA), RoPE of base ``theta``."""
    return mixer_config(
        "dsv4",
        attention={"window": window, "compress": compress, "compress_rate": rate} | INDEXER,
        position={"kind": "rope", "pairing": "interleaved", "theta": theta},
        norm={"kind": "rmsnorm", "eps": EPS},
    )


def hf_compressing(compress: str, rate: int, window: int) -> tuple[Any, Any]:
    """transformers' DeepseekV4Attention of an HCA or CSA layer at the contract sizes, its weights
    randomised (its rotary embeddings, buffers of fixed frequencies, rebuilt), and the model's rotary."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Attention, DeepseekV4RotaryEmbedding

    config = DeepseekV4Config(
        vocab_size=48, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, head_dim=8,
        partial_rotary_factor=0.5, q_lora_rank=6, o_groups=2, o_lora_rank=5, sliding_window=window,
        layer_types=[LAYER_TYPES[compress]], rope_theta=THETA, compress_rope_theta=COMPRESS_THETA,
        rms_norm_eps=EPS, compress_rates={name: rate for name in LAYER_TYPES.values()}, **INDEXER,
    )  # fmt: skip
    config._attn_implementation = "eager"
    attention = randomise(DeepseekV4Attention(config, 0), seed=1).eval()
    for module in list(attention.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, DeepseekV4RotaryEmbedding):
                setattr(module, name, DeepseekV4RotaryEmbedding(config))
    return attention, DeepseekV4RotaryEmbedding(config)


def copied_compressing(attention) -> dict:
    """transformers' weights of a compressing layer in archlab's, by name: the compressor's as they are, its
    indexer's one level up (q_b_proj as q_up, the scorer's weights_proj as head_weights)."""
    own = {n: t for n, t in attention.state_dict().items() if not n.startswith("compressor.")}
    state = copied(type("Own", (), {"state_dict": lambda self: own})())
    for name, tensor in attention.state_dict().items():
        if name.startswith("compressor.indexer."):
            rest = name.removeprefix("compressor.indexer.").replace("q_b_proj", "q_up")
            state["indexer." + rest.replace("scorer.weights_proj", "head_weights")] = tensor
        elif name.startswith("compressor."):
            state[name] = tensor
    return state


@pytest.mark.parametrize("compress,rate,window", COMPRESSED)
def test_a_compressing_layer_equals_transformers_deepseek_v4_attention(compress, rate, window):
    """HCA and CSA layers over 12 positions, the window and the pooled blocks in one softmax with the sinks:
    archlab's layer with transformers' weights gives its output in float32 within 1e-5 of its largest."""
    hf, rotary_emb = hf_compressing(compress, rate, window or T)
    model = build_model(compressing(compress, rate, window, COMPRESS_THETA)).eval()
    attn = model.blocks[0].attn
    attn.load_state_dict(copied_compressing(hf))
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(2))
    positions = torch.arange(T)[None].expand(2, T)
    i = torch.arange(T)
    distance = i[:, None] - i[None, :]
    visible = ((distance >= 0) & (distance < (window or T)))[None, None].expand(2, 1, T, T)
    bias = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
    with torch.no_grad():
        expected, _ = hf(x, {"compress": rotary_emb(x, position_ids=positions, layer_type="compress")}, positions, bias)
        got = attn(x, model.position.rotary(torch.arange(T), torch.float32), visible)
    assert expected.abs().max() > 1
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("compress,rate,window", COMPRESSED)
@pytest.mark.parametrize("check", [check_cached_decoding, check_padded_batch, check_packed_documents])
def test_the_contract_checks_hold_while_compressing(check, compress, rate, window):
    """Cached decoding (a prefill of 7 or 3, a chunk of 6, single tokens: blocks ending in each, the cache
    holding the projections a block still needs), a left-padded batch (each row's blocks at its own
    positions, as alone) and packed documents (each document's blocks its own), as the contract suite
    checks them."""
    check(randomise(build_model(compressing(compress, rate, window), dtype=torch.float64), seed=3).eval())


@pytest.mark.parametrize("compress,rate,window", COMPRESSED)
def test_packed_documents_keep_their_blocks_whether_or_not_positions_restart(compress, rate, window):
    """Rows packing documents of 5 and 7 tokens, positions counted on across them (``reset_positions`` off):
    the second document's logits do not move when the first's tokens change, and the first's equal its run
    alone (blocks pooled from, and seen by, one document only)."""
    model = randomise(build_model(compressing(compress, rate, window), dtype=torch.float64), seed=12).eval()
    g = torch.Generator().manual_seed(13)
    first, other, second = (torch.randint(0, 48, (1, n), generator=g) for n in (5, 5, 7))
    documents = torch.tensor([[0] * 5 + [1] * 7])
    with torch.no_grad():
        packed = model(torch.cat((first, second), dim=1), document_ids=documents)
        changed = model(torch.cat((other, second), dim=1), document_ids=documents)
        alone = model(first)
    torch.testing.assert_close(changed[:, 5:], packed[:, 5:], rtol=1e-12, atol=1e-12)
    assert (changed[:, :5] - packed[:, :5]).abs().max() > 1e-3
    torch.testing.assert_close(packed[:, :5], alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("compress,rate,window", COMPRESSED)
def test_compressing_counts_and_cache_equal_the_built_model(compress, rate, window):
    """The closed-form count equals the built and the meta model's; after 3 and 12 tokens (no window) the
    cache holds what ``kv_cache_bytes`` counts."""
    from archlab.accounting import count, kv_cache_bytes

    cfg = compressing(compress, rate, window)
    for device in ("meta", "cpu"):
        model = build_model(cfg, device=device)
        assert sum(p.numel() for p in model.parameters()) == count(cfg)["total"]
    cfg = compressing(compress, rate, None)
    model = build_model(cfg, dtype=torch.float64).eval()
    for length in (3, T):
        cache = model.new_cache(1, length)
        with torch.no_grad():
            model(torch.zeros(1, length, dtype=torch.long), cache)
        held = [t for t in (*cache.k, *cache.v, *cache.conv_state, *cache.recurrent_state) if t is not None]
        assert sum(t.numel() * t.element_size() for t in held) == kv_cache_bytes(cfg, length, 8), length


@pytest.mark.parametrize("compress,rate,window", COMPRESSED[::2], ids=["hca", "csa"])
def test_compressing_gradients_are_the_losss_derivatives(compress, rate, window):
    """In float64 the cross-entropy's gradient of each parameter of a compressing layer (the pooling, its
    position biases, the rotated blocks) is its derivative: a central difference along a random direction
    (the indexer's: none either way, its choice moves nothing at that step)."""
    model = randomise(build_model(compressing(compress, rate, window), dtype=torch.float64), seed=9).eval()
    idx = torch.randint(0, 48, (2, T + 1), generator=torch.Generator().manual_seed(10))

    def loss() -> torch.Tensor:
        logits = model(idx[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())

    loss().backward()
    generator, eps = torch.Generator().manual_seed(11), 1e-6
    for name, p in model.blocks[0].attn.named_parameters():
        direction = torch.randn(p.shape, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            p.add_(eps * direction)
            up = loss().item()
            p.sub_(2 * eps * direction)
            down = loss().item()
            p.add_(eps * direction)
        got = 0.0 if p.grad is None else (p.grad * direction).sum().item()
        assert got == pytest.approx((up - down) / (2 * eps), rel=1e-6, abs=1e-9), name


def test_the_blocks_move_the_output():
    """A compressing layer's blocks act: the same weights without them (compress none) give other logits, and
    so does an indexer keeping all 6 blocks instead of 2."""
    model = randomise(build_model(compressing("csa", 2, 5), dtype=torch.float64), seed=4).eval()
    state = model.state_dict()
    plain = build_model(dsv4(window=5), dtype=torch.float64).eval()
    plain.load_state_dict({k: v for k, v in state.items() if ".compressor." not in k and ".indexer." not in k})
    every = build_model(
        dsv4(window=5, compress="csa", compress_rate=2, **(INDEXER | {"index_topk": 6})), dtype=torch.float64
    ).eval()
    every.load_state_dict(state)
    idx = torch.randint(0, 48, (2, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = model(idx)
        assert (plain(idx) - logits).abs().max() > 1e-3
        assert (every(idx) - logits).abs().max() > 1e-3


def test_the_indexer_learns_from_its_own_loss_alone():
    """In training a CSA layer keeps index_loss_weight · KL (the attention's probabilities over the blocks
    chosen, heads averaged, against the softmax of the indexer's scores over them) as an auxiliary loss, written
    here query by query; the cross-entropy gives the indexer no gradient, its loss gives it one and nothing else
    any; and with it every parameter of the model has a gradient."""
    cfg = compressing("csa", 2, 5)
    model = randomise(build_model(cfg, dtype=torch.float64), seed=6).train()
    idx = torch.randint(0, 48, (2, T + 1), generator=torch.Generator().manual_seed(7))
    logits = model(idx[:, :-1])
    weight, kl = model.auxiliary_losses()["index_kl"]
    assert weight == 1.0
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
    indexer = [n for n, _ in model.named_parameters() if ".indexer." in n]
    grads = torch.autograd.grad(ce, list(model.parameters()), allow_unused=True, retain_graph=True)
    assert all(g is None or g.abs().max() == 0 for (n, _), g in zip(model.named_parameters(), grads) if n in indexer)
    grads = torch.autograd.grad(kl, list(model.parameters()), allow_unused=True, retain_graph=True)
    assert {n for (n, _), g in zip(model.named_parameters(), grads) if g is not None and g.abs().max() > 0} == set(
        indexer
    )
    (ce + weight * kl).backward()
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in model.parameters())
    attn = model.blocks[0].attn
    x = torch.randn(2, T, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    rotary = model.position.rotary(torch.arange(T), torch.float64)
    attn(x, rotary)
    q, _, source = attn.project(x, rotary)
    blocks, chosen, scores = attn.blocks(x, source, rotary, None, 0)
    by_hand = []
    for b in range(2):
        for t in range(T):
            picked = torch.nonzero(chosen[b, t]).flatten()
            if len(picked):
                p = ((q[b, :, t] @ blocks[b, picked].T) * attn.scale).softmax(-1).mean(0)
                by_hand.append((p * (p.log() - scores[b, t, picked].log_softmax(0))).sum())
    assert 0 < len(by_hand) < 2 * T  # the first queries see no block
    torch.testing.assert_close(attn.aux_losses["index_kl"][1], torch.stack(by_hand).mean(), rtol=1e-10, atol=0)


# ---- closed forms ----

FLASH = {"n_head": 64, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8}
FLASH |= {"o_lora_rank": 1024, "window": 128, "compress": "none", "index_n_heads": 64, "index_head_dim": 128}
FLASH |= {"index_topk": 512}


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


def test_compressing_layer_counts_are_transformers_at_deepseek_v4_flash_sizes():
    """HCA (blocks of 128): the sliding layer's and a compressor of 512, 2·4096·512 + 128·512 + 512; CSA
    (blocks of 4): a compressor of 2·512, 2·4096·1024 + 4·1024 + 512, and the indexer of 64 heads of 128,
    2·4096·256 + 4·256 + 128 + 1024·64·128 + 4096·64: transformers' layers' numel (meta)."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Attention

    sliding = 106_956_352
    hca = sliding + 2 * 4096 * 512 + 128 * 512 + 512
    indexer = 2 * 4096 * 256 + 4 * 256 + 128 + 1024 * 64 * 128 + 4096 * 64
    csa = sliding + 2 * 4096 * 1024 + 4 * 1024 + 512 + indexer
    assert (hca, csa) == (111_216_704, 126_098_624)
    config = DeepseekV4Config(num_hidden_layers=2, layer_types=list(LAYER_TYPES.values()))
    for layer, (compress, rate, expected) in enumerate([("hca", 128, hca), ("csa", 4, csa)]):
        cfg = mixer_config("dsv4", d_model=4096, attention=FLASH | {"compress": compress, "compress_rate": rate})
        assert DeepSeekV4Attention.num_params(cfg) == expected
        with torch.device("meta"):
            hf = DeepseekV4Attention(config, layer)
        assert sum(p.numel() for p in hf.parameters()) == expected


def test_cache_and_extra_flops_by_hand():
    """The cache: the one head of 512 over min(window 128, length) positions; the scores: 12·64·512 per key
    seen (at most 128)."""
    cfg = mixer_config("dsv4", d_model=4096, attention=FLASH)
    assert DeepSeekV4Attention.kv_cache_values(cfg, 100, 0) == 512 * 100
    assert DeepSeekV4Attention.kv_cache_values(cfg, 4096, 0) == 512 * 128
    assert DeepSeekV4Attention.extra_flops(cfg, 4096, 0) == 12 * 64 * 512 * 128
    hca = mixer_config("dsv4", d_model=4096, attention=FLASH | {"compress": "hca", "compress_rate": 128})
    # the window, 32 blocks of 512, and the 127 positions' keys and gates the next block needs
    assert DeepSeekV4Attention.kv_cache_values(hca, 4096, 0) == 512 * 128 + 512 * 32 + 2 * 512 * 127
    assert DeepSeekV4Attention.extra_flops(hca, 4096, 0) == 12 * 64 * 512 * (128 + 32)
    csa = mixer_config("dsv4", d_model=4096, attention=FLASH | {"compress": "csa", "compress_rate": 4})
    # 1024 blocks of 512 + 128 (the indexer's key); 7 positions' two halves of keys and gates, both compressors
    assert DeepSeekV4Attention.kv_cache_values(csa, 4096, 0) == 512 * 128 + 640 * 1024 + 4 * 640 * 7
    # 512 of the 1024 blocks attended to; the indexer scores all 1024 with 64 heads of 128, three times with its
    # loss (its backward), which recomputes the 512 chosen blocks' scores for its target
    expected = 12 * 64 * 512 * (128 + 512) + 6 * 64 * 129 * 1024 + 2 * 64 * 512 * 512
    assert DeepSeekV4Attention.extra_flops(csa, 4096, 0) == expected
    untrained = mixer_config(
        "dsv4", d_model=4096, attention=FLASH | {"compress": "csa", "compress_rate": 4, "index_loss_weight": 0.0}
    )
    assert DeepSeekV4Attention.extra_flops(untrained, 4096, 0) == 12 * 64 * 512 * 640 + 2 * 64 * 129 * 1024


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
        ({"compress": "hca", "compress_rate": 1}, "model.attention.compress_rate"),  # a block of one position
        ({"compress": "csa", "index_head_dim": 3}, "model.attention.index_head_dim"),  # fewer than the 4 rotated
        ({"compress": "csa", "index_topk": 0}, "model.attention.index_topk"),
        ({"compress": "csa", "index_n_heads": 0}, "model.attention.index_n_heads"),
        ({"compress": "lsa"}, "model.attention.compress"),
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


def test_compressing_takes_rope():
    """Blocks are rotated at their first position: a compressing layer without RoPE is refused."""
    with pytest.raises(ConfigError) as error:
        validate(mixer_config("dsv4", attention={"compress": "hca"}, position={"kind": "none"}))
    assert error.value.field == "model.position.kind"


def test_describe_names_the_parts():
    assert DeepSeekV4Attention.describe(dsv4(window=5)) == (
        "dsv4 4h x 8 (4 rotated) over 1 shared kv head, q_lora 6, 2 output groups of 5, sinks, window 5"
    )
    assert DeepSeekV4Attention.describe(compressing("csa", 2, None)).endswith(
        "sinks, blocks of 2 (csa: indexer 8h x 6, top 2)"
    )
