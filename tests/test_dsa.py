"""DeepSeek sparse attention (``dsa``, archlab/nn/mixers/dsa.py), each against an independent expectation:
a layer against a float64 reference written here query by query (the indexer's scores, its top-k among the
causal keys, attention over those alone; the indexer's pairs halves or interleaved), mla's output where
index_topk covers the context, the indexer's loss by hand and by central differences, its FLOPs by PyTorch's
counter, DeepSeek-V3.2's per-layer count and cache by hand, and the refusals. The contract suite
(tests/test_mixer_contract.py) checks decoding, padding, documents, gradients, counts and roles."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.mixers import BASE, TINY, decode_in_pieces, mixer_config, randomise
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from archlab import build_model
from archlab.config import to_model_config
from archlab.config.layers import layer_configs
from archlab.errors import ConfigError
from archlab.nn.mixers.dsa import DeepSeekSparseAttention
from archlab.nn.mixers.mla import MultiHeadLatentAttention
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

TOPK = 5


def dsa(position=None, **attention):
    """A 2-layer model of dsa at the contract suite's tiny sizes (4 indexer heads of 8, top 5), RoPE."""
    return mixer_config("dsa", attention=attention, position=position or {"kind": "rope"})


def rotate(x: torch.Tensor, pos: int, pairing: str, theta: float = 10000.0) -> torch.Tensor:
    """``x`` ``[r]`` rotated at position ``pos``: pair i turns by pos·theta^(-2i/r); its dims (i, i + r/2)
    (half) or (2i, 2i + 1) (interleaved)."""
    r, y = x.shape[0], x.clone()
    for i in range(r // 2):
        a, b = (i, i + r // 2) if pairing == "half" else (2 * i, 2 * i + 1)
        angle = pos * theta ** (-2 * i / r)
        c, s = math.cos(angle), math.sin(angle)
        y[a], y[b] = x[a] * c - x[b] * s, x[b] * c + x[a] * s
    return y


def reference(attn, x: torch.Tensor, model_pairing: str, index_pairing: str, eps: float) -> torch.Tensor:
    """The layer's output for ``x`` ``[T, d]`` (one row), query by query in float64, from its weights (heads
    of nope 6 + rope 6, v 5, a latent of 16; 4 indexer heads of 8)."""
    W = {n: p.detach() for n, p in attn.named_parameters()}
    H, nope, rope, v_dim, r = 4, 6, 6, 5, 16
    h, D = 4, 8

    def rms(t, w):
        return t / torch.sqrt(t.pow(2).mean() + eps) * w

    def layer_norm(t, w, b):
        return (t - t.mean()) / torch.sqrt(t.var(unbiased=False) + 1e-6) * w + b

    T = x.shape[0]
    keys, index_keys = [], []
    for s in range(T):
        down = W["kv_down.weight"] @ x[s]
        latent = rms(down[:r], W["kv_norm.weight"])
        k_rope = rotate(down[r:], s, model_pairing)
        kv = (W["kv_up.weight"] @ latent).view(H, nope + v_dim)
        keys.append([(torch.cat((kv[i, :nope], k_rope)), kv[i, nope:]) for i in range(H)])
        ik = layer_norm(W["indexer.k_proj.weight"] @ x[s], W["indexer.k_norm.weight"], W["indexer.k_norm.bias"])
        index_keys.append(torch.cat((rotate(ik[:rope], s, index_pairing), ik[rope:])))
    out = []
    for t in range(T):
        latent = rms(W["q_down.weight"] @ x[t], W["q_norm.weight"])
        q = (W["q_up.weight"] @ latent).view(H, nope + rope)
        iq = (W["indexer.q_up.weight"] @ latent).view(h, D)
        w = W["indexer.head_weights.weight"] @ x[t]
        score = {}
        for s in range(t + 1):
            score[s] = sum(
                w[j] / math.sqrt(h) * max(0.0, (torch.cat((rotate(iq[j, :rope], t, index_pairing), iq[j, rope:])) @ index_keys[s]).item() / math.sqrt(D))
                for j in range(h)
            )  # fmt: skip
        chosen = sorted(score, key=lambda s: (-score[s], s))[:TOPK]
        heads = []
        for i in range(H):
            qi = torch.cat((q[i, :nope], rotate(q[i, nope:], t, model_pairing)))
            logits = torch.stack([qi @ keys[s][i][0] / math.sqrt(nope + rope) for s in chosen])
            heads.append(sum(p * keys[s][i][1] for p, s in zip(logits.softmax(0), chosen)))
        out.append(W["proj.weight"] @ torch.cat(heads))
    return torch.stack(out)


PAIRINGS = [("half", "model"), ("interleaved", "model"), ("interleaved", "half"), ("half", "interleaved")]


@pytest.mark.parametrize("model_pairing,index_pairing", PAIRINGS)
def test_a_layer_equals_the_reference_query_by_query(model_pairing, index_pairing):
    """Over 12 positions the later queries see more than 5 keys: each attends to its indexer's 5 best. 6
    rotated dims (at 4 the two regroupings of the pairs are the same permutation)."""
    cfg = dsa(qk_rope_head_dim=6, index_pairing=index_pairing, position={"kind": "rope", "pairing": model_pairing})
    model = randomise(build_model(cfg, dtype=torch.float64), seed=1).eval()
    attn = model.blocks[0].attn
    x = torch.randn(2, 12, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    rotary = model.position.rotary(torch.arange(12), torch.float64)
    with torch.no_grad():
        got = attn(x, rotary)
    own = model_pairing if index_pairing == "model" else index_pairing
    for row in range(2):
        expected = reference(attn, x[row], model_pairing, own, cfg.norm.eps)
        # RoPE's angles are float32 (archlab's as transformers'): 1e-7 apart from the reference's; a key chosen
        # otherwise moves the output by its own size
        torch.testing.assert_close(got[row], expected, rtol=1e-6, atol=1e-6)


def test_ties_go_to_the_earlier_key_whatever_the_keys_after_them():
    """Keys 0, 1 and 3 tie at 0 below key 2: the top 2 are keys 2 and 0, whether the row holds 4 keys or 6
    (a cached step's row is shorter than the full forward's)."""
    indexer = build_model(dsa(index_topk=2)).blocks[0].attn.indexer
    for row in ([0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0, 3.0]):
        scores = torch.tensor([[row]])
        visible = torch.tensor([[[True] * 4 + [False] * (len(row) - 4)]])
        chosen = indexer.select(scores, visible) & visible
        assert torch.nonzero(chosen[0, 0]).flatten().tolist() == [0, 2]


def test_the_choice_moves_the_output():
    """The same weights with the indexer's pairs the other way choose other keys: other outputs."""
    cfg, other = dsa(), dsa(index_pairing="interleaved")
    model = randomise(build_model(cfg, dtype=torch.float64), seed=1).eval()
    changed = build_model(other, dtype=torch.float64).eval()
    changed.load_state_dict(model.state_dict())
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (model(idx) - changed(idx)).abs().max() > 1e-3


def test_index_topk_covering_the_context_is_mla_exactly():
    """index_topk 12 (= the context): the logits of mla with the same weights, bit for bit; in training too
    (the indexer's loss on, its mask every key seen), to rounding."""
    cfg = dsa(index_topk=12)
    model = randomise(build_model(cfg, dtype=torch.float64), seed=4)
    index = ("index_n_heads", "index_head_dim", "index_topk")
    same = {k: v for k, v in TINY["dsa"].items() if k not in index}  # mla's own line has options dsa's has not
    mla = build_model(
        to_model_config(OmegaConf.merge(BASE, {"attention": {"kind": "mla", **same}})), dtype=torch.float64
    )
    mla.load_state_dict({k: v for k, v in model.state_dict().items() if ".indexer." not in k})
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(model.eval()(idx), mla.eval()(idx))
        torch.testing.assert_close(model.train()(idx), mla.train()(idx), rtol=1e-12, atol=1e-12)
        assert set(model.auxiliary_losses()) == {"index_kl"}


def kl_by_hand(attn, x, rotary) -> torch.Tensor:
    """The indexer's loss from the layer's own parts: per query, the attention's probabilities over its
    chosen keys averaged over heads (p), against the softmax of its scores over the same keys."""
    T = x.shape[1]
    q, source = attn.queries(x, rotary)
    latent, k_rope = attn.latents(x, rotary)
    k, _ = attn.keys_values(latent, k_rope)
    scores = attn.indexer.scores(x, source, attn.indexer.keys(x, rotary), rotary)
    total = torch.zeros((), dtype=x.dtype)
    for b in range(x.shape[0]):
        for t in range(T):
            ranked = sorted(range(t + 1), key=lambda s: (-scores[b, t, s].item(), s))[:TOPK]
            chosen = torch.tensor(ranked)
            p = ((q[b, :, t, None] @ k[b, :, chosen].transpose(-1, -2))[:, 0] * attn.scale).softmax(-1).mean(0)
            log_q = scores[b, t, chosen].log_softmax(0)
            total = total + (p * (p.log() - log_q)).sum()
    return total / (x.shape[0] * T)


def test_the_indexer_loss_by_hand_and_by_central_differences():
    """In training the layer keeps index_loss_weight · KL as an auxiliary loss, the KL as written by hand; its
    gradient reaches the indexer alone (the layer's other parameters get none from it), and along each
    indexer parameter it is the loss's derivative (a central difference)."""
    cfg = dsa(index_loss_weight=0.5)
    model = randomise(build_model(cfg, dtype=torch.float64), seed=6).train()
    attn = model.blocks[0].attn
    x = torch.randn(2, 12, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    rotary = model.position.rotary(torch.arange(12), torch.float64)

    def loss() -> torch.Tensor:
        attn(x, rotary)
        weight, kl = attn.aux_losses["index_kl"]
        assert weight == 0.5
        return kl

    kl = loss()
    with torch.no_grad():
        torch.testing.assert_close(kl, kl_by_hand(attn, x, rotary), rtol=1e-10, atol=0)
    kl.backward()
    grads = {n: p.grad for n, p in attn.named_parameters()}
    assert all(g is None for n, g in grads.items() if not n.startswith("indexer."))
    generator, eps = torch.Generator().manual_seed(8), 1e-6
    for name, p in attn.indexer.named_parameters():
        direction = torch.randn(p.shape, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            p.add_(eps * direction)
            up = loss().item()
            p.sub_(2 * eps * direction)
            down = loss().item()
            p.add_(eps * direction)
        assert (grads[f"indexer.{name}"] * direction).sum().item() == pytest.approx((up - down) / (2 * eps), rel=1e-6)


def test_training_the_indexer_alone_lowers_its_loss():
    """40 Adam steps on the indexer's loss alone bring its choice closer to the attention's: the KL falls
    below half its start (DeepSeek's dense warm-up: index_topk covering the context)."""
    cfg = dsa(index_topk=12)
    model = randomise(build_model(cfg), seed=9).train()
    attn = model.blocks[0].attn
    x = torch.randn(4, 12, 32, generator=torch.Generator().manual_seed(10))
    rotary = model.position.rotary(torch.arange(12), torch.float32)
    optimizer = torch.optim.Adam(attn.indexer.parameters(), lr=3e-2)
    losses = []
    for _ in range(40):
        attn(x, rotary)
        kl = attn.aux_losses["index_kl"][1]
        optimizer.zero_grad()
        kl.backward()
        optimizer.step()
        losses.append(kl.item())
    assert losses[-1] < 0.5 * losses[0], losses[::10]


def test_no_indexer_loss_in_eval_or_at_weight_zero():
    model = randomise(build_model(dsa(index_loss_weight=0.0)), seed=11).train()
    model(torch.zeros(1, 12, dtype=torch.long))
    assert model.auxiliary_losses() == {}
    model = randomise(build_model(dsa()), seed=11).eval()
    model(torch.zeros(1, 12, dtype=torch.long))
    assert model.auxiliary_losses() == {}


# ---- closed forms ----


def deepseek_v32(**attention):
    """DeepSeek-V3.2's attention layer: d 7168, 128 heads of 128 + 64 (v 128), q rank 1536, kv rank 512,
    an indexer of 64 heads of 128 keeping 2048 keys."""
    sizes = {"kind": "dsa", "n_head": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128}
    sizes |= {"qk_rope_head_dim": 64, "v_head_dim": 128, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048}
    return mixer_config("dsa", d_model=7168, attention=sizes | attention)


def test_per_layer_count_and_cache_are_deepseek_v32s():
    """mla's 187,107,328 (tests/test_mla.py) and the indexer's 1536·64·128 + 7168·128 + 2·128 + 7168·64 =
    13,959,424; the cache 512 + 64 + 128 = 704 values per position."""
    indexer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert indexer == 13_959_424
    cfg = deepseek_v32()
    assert DeepSeekSparseAttention.num_params(cfg) == 187_107_328 + indexer
    assert DeepSeekSparseAttention.kv_cache_values(cfg, 1000, 0) == 704 * 1000
    direct = deepseek_v32(q_lora_rank=None)  # the indexer's queries from x
    assert DeepSeekSparseAttention.num_params(direct) - MultiHeadLatentAttention.num_params(direct) == (
        7168 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    )


def test_extra_flops_by_hand():
    """At 4096 positions a query of DeepSeek-V3.2 attends to 2048 keys: 6·128·(192 + 128)·2048 for mla's part;
    the indexer's scores 6·64·129·4096 (forward and its loss's backward) and the target's 2·128·192·2048."""
    expected = 6 * 128 * 320 * 2048 + 6 * 64 * 129 * 4096 + 2 * 128 * 192 * 2048
    assert DeepSeekSparseAttention.extra_flops(deepseek_v32(), 4096, 0) == expected
    untrained = 6 * 128 * 320 * 1000 + 2 * 64 * 129 * 1000  # 1000 positions: every key; the loss off
    assert DeepSeekSparseAttention.extra_flops(deepseek_v32(index_loss_weight=0.0), 1000, 0) == untrained


def test_the_indexers_score_flops_match_the_flop_counter():
    """The indexer's scores and their weighted sum: 2·h·(D + 1) FLOPs per query and key (PyTorch's counter)."""
    cfg = dsa()
    attn = build_model(cfg).blocks[0].attn
    x, source, keys = torch.randn(2, 12, 32), torch.randn(2, 12, 8), torch.randn(2, 1, 12, 8)
    with FlopCounterMode(display=False) as counter:
        attn.indexer.scores(x, source, keys, None)
    projections = 2 * 2 * 12 * (8 * 32 + 32 * 4)  # q_up and head_weights (the keys are given)
    assert counter.get_total_flops() - projections == 2 * 12 * 12 * 2 * 4 * (8 + 1)


# ---- refusals ----


@pytest.mark.parametrize(
    "attention,field",
    [
        ({"index_head_dim": 3}, "model.attention.index_head_dim"),  # fewer dims than the 4 it rotates
        ({"index_topk": 0}, "model.attention.index_topk"),
        ({"index_n_heads": 0}, "model.attention.index_n_heads"),
        ({"index_loss_weight": -1.0}, "model.attention.index_loss_weight"),
        ({"index_pairing": "both"}, "model.attention.index_pairing"),
        ({"kv_lora_rank": 0}, "model.attention.kv_lora_rank"),  # mla's own checks
    ],
)
def test_each_refused_setting_names_its_field(attention, field):
    with pytest.raises(ConfigError) as error:
        validate(dsa(**attention))
    assert error.value.field == field


def test_describe_names_the_indexer():
    assert DeepSeekSparseAttention.describe(dsa()).endswith("indexer 4h x 8, top 5 keys")


HY = {"index_rope_at": "last", "index_norm_eps": 1e-5, "latent_norm_eps": 1e-6, "gate": "elementwise", "sinks": True}


def hy_pair(dtype=torch.float32):
    """A full dsa layer, then an ``index_shared`` one, with HY V4's options: the indexer's rotated dims last,
    its norm at 1e-5, sinks and an elementwise gate; mla's pairs halves."""
    from helpers.mixers import layered_config

    kinds = {"full": {}, "shared": {"attention": {"index_shared": True}}}
    attention = {"kind": "dsa", "n_head": 4, **TINY_DSA, **HY}
    cfg = layered_config(kinds, ["full", "shared"], attention=attention, position={"kind": "rope", "pairing": "half"})
    return cfg, randomise(build_model(cfg, dtype=dtype), seed=21).eval()


TINY_DSA = {"q_lora_rank": 8, "kv_lora_rank": 16, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5}
TINY_DSA |= {"index_n_heads": 4, "index_head_dim": 8, "index_topk": 5}


def test_a_full_and_a_shared_layer_are_hy_v4s_attention():
    """Two layers against transformers' ``HYV4Attention`` (``indexer_types`` full, shared), eager, float32,
    every weight random: the shared layer keeps the full layer's top 5 of 12 keys (given to it as
    ``prev_topk_indices``), each query's output within 1e-5."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.hy_v4.modeling_hy_v4 import HYV4Attention, HYV4RotaryEmbedding

    cfg, model = hy_pair()
    hf_cfg = transformers.HYV4Config(
        hidden_size=32, num_attention_heads=4, q_lora_rank=8, kv_lora_rank=16, qk_nope_head_dim=6,
        qk_rope_head_dim=4, v_head_dim=5, index_n_heads=4, index_head_dim=8, index_topk=5, num_hidden_layers=2,
        indexer_types=["full", "shared"], rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    hf_cfg._attn_implementation = "eager"
    names = {"q_down": "q_a_proj", "q_norm": "q_a_layernorm", "q_up": "q_b_proj", "kv_down": "kv_a_proj_with_mqa"}
    names |= {"kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj", "proj": "o_proj", "gate": "gate_proj"}
    names |= {"indexer.q_up": "indexer.wq_b", "indexer.k_proj": "indexer.wk", "indexer.k_norm": "indexer.k_norm"}
    names |= {"indexer.head_weights": "indexer.weights_proj"}
    theirs = [HYV4Attention(hf_cfg, i).eval() for i in range(2)]
    assert theirs[1].indexer is None and model.blocks[1].attn.indexer is None
    with torch.no_grad():
        for ours, hf in zip((b.attn for b in model.blocks), theirs):
            state = ours.state_dict()
            mapped = {}
            for key, value in state.items():
                stem, leaf = key.rsplit(".", 1) if "." in key else ("", key)
                mapped[f"{names[stem]}.{leaf}" if stem else leaf] = value
            hf.load_state_dict(mapped, strict=True)
    T = 12
    x = torch.randn(2, 2, T, 32, generator=torch.Generator().manual_seed(22))
    rotary = model.position.rotary(torch.arange(T), torch.float32)
    position_ids = torch.arange(T)[None]
    cos_sin = HYV4RotaryEmbedding(hf_cfg)(x[0], position_ids)
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None].expand(2, 1, T, T)
    with torch.no_grad():
        full, _, topk = theirs[0](x[0], cos_sin, mask, position_ids=position_ids)
        shared, _, same = theirs[1](x[1], cos_sin, mask, position_ids=position_ids, prev_topk_indices=topk)
        ours_full = model.blocks[0].attn(x[0], rotary)
        ours_shared = model.blocks[1].attn(x[1], rotary)
    assert same is topk
    torch.testing.assert_close(ours_full, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_shared, shared, rtol=1e-5, atol=1e-5)
    # the choice matters: the shared layer over every key it sees is another output
    model.blocks[1].attn.choice_source.chosen = None
    with torch.no_grad():
        assert (model.blocks[1].attn(x[1], rotary) - shared).abs().max() > 1e-3


def test_a_shared_layer_decodes_in_pieces_as_it_runs_whole():
    """The shared layer reads its source's choice of each step's keys: prefill, single tokens and a chunk
    through the cache give the whole forward's logits, left-padded rows too."""
    _, model = hy_pair(torch.float64)
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(23))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    with torch.no_grad():
        whole = model(idx)
        padded = model(idx, None, mask)
    torch.testing.assert_close(decode_in_pieces(model, idx, [6, 7, 8, 12]), whole, rtol=1e-6, atol=1e-6)
    got = decode_in_pieces(model, idx, [6, 7, 12], mask)
    torch.testing.assert_close(got[:, 3:], padded[:, 3:], rtol=1e-6, atol=1e-6)


def test_a_shared_layers_count_cache_and_flops_are_mlas():
    """mla's 3,228 (queries 32·8 + 8 + 8·40, latent 32·20 + 16 + 16·44, output 20·32, gate 32·20, sinks 4):
    the shared layer's alone, the full one's plus its indexer's 656 (8·32 + 32·8 + 16 + 32·4); caches of 20
    and 28 values per position; the shared layer's FLOPs mla's over the 5 keys chosen, no indexer's."""
    from archlab.nn.mixers.mla import MultiHeadLatentAttention

    cfg, model = hy_pair()
    queries, latent, out, gate, sinks = 32 * 8 + 8 + 8 * 4 * 10, 32 * 20 + 16 + 16 * 4 * 11, 20 * 32, 32 * 20, 4
    mla = queries + latent + out + gate + sinks
    assert mla == 3_228
    assert MultiHeadLatentAttention.num_params(cfg) == mla
    full, shared = (sum(p.numel() for p in b.attn.parameters()) for b in model.blocks)
    assert (full, shared) == (mla + 8 * 32 + 32 * 8 + 16 + 32 * 4, mla)
    layers = layer_configs(cfg)
    assert [DeepSeekSparseAttention.num_params(c, i) for i, c in enumerate(layers)] == [full, shared]
    assert [DeepSeekSparseAttention.kv_cache_values(c, 10, i) for i, c in enumerate(layers)] == [280, 200]
    flops = [DeepSeekSparseAttention.extra_flops(c, 10, i) for i, c in enumerate(layers)]
    assert flops[1] == 6 * 4 * (10 + 5) * 5 and flops[0] - flops[1] == 2 * 4 * 9 * 10 + 4 * 4 * 9 * 10 + 2 * 4 * 10 * 5


SHARED_KINDS = {"shared": {"attention": {"index_shared": True}}, "full": {}}


@pytest.mark.parametrize(
    "pattern, overrides, field",
    [
        (["shared", "full"], {}, "model.layers.kinds.shared.attention.index_shared"),
        (["full", "shared"], {"layers": {"loop": {"passes": 2}}}, "model.layers.loop.passes"),
        (["full", "shared"], {"head": {"mtp": {"depth": 1, "layer": "shared"}}}, "model.head.mtp.layer"),
    ],
)
def test_a_shared_layer_without_its_source_is_refused(pattern, overrides, field):
    """No earlier indexer; looped layers (a later pass would read a choice of another pass); a multi-token
    prediction module of a shared kind (whose block no indexer precedes)."""
    from helpers.mixers import layered_config

    attention = {"kind": "dsa", "n_head": 4, **TINY_DSA}
    cfg = layered_config(SHARED_KINDS, pattern, attention=attention, **overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.field == field
