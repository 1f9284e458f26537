"""Layers that differ (``model.layers``): which kind each layer gets, the counts, FLOPs and KV-cache bytes
summed over the layers' own configs against hand-written formulas, a layer without positions computing
exactly what a whole model without positions computes, cached decoding equal to the full forward, the
refusals, and what is reported as ignored."""

from __future__ import annotations

import json

import pytest
import torch

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.accounting import kv_cache_bytes
from archlab.build import CONF_DIR, compose
from archlab.config import left_out, to_model_config
from archlab.config.layers import layer_configs, layer_kind
from archlab.generate import generate
from archlab.nn.moe import expert_width
from archlab.nn.validation import ignored, without_ignored

pytestmark = pytest.mark.usefixtures("single_thread")

V, T, D, H = 64, 16, 32, 4
TINY = [f"model.vocab_size={V}", f"model.context_length={T}", "model.n_layer=4", f"model.d_model={D}"]
TINY += [f"model.attention.n_head={H}", "model/position=rope", "model/norm=rmsnorm", "model/mlp=swiglu"]
TINY += ["model.mlp.d_ff=48", "model.attention.qkv_bias=false", "model.attention.out_bias=false"]
TINY += ["model.mlp.bias=false"]
# three sliding-window layers with RoPE, then one global layer without positions (Llama 4, Cohere2, SmolLM3)
IROPE = ["model.layers.kinds={local: {attention: {window: 3}}, global: {position: {kind: none}}}"]
IROPE += ["model.layers.pattern=[local,local,local,global]"]


def test_first_then_the_pattern_cycled():
    cfg = compose_model([*TINY, "model.n_layer=7", "model.layers.kinds={a: {}, b: {}, c: {}}"])
    cfg.layers.first, cfg.layers.pattern = ["c"], ["a", "b"]
    assert [layer_kind(cfg, i) for i in range(7)] == ["c", "a", "b", "a", "b", "a", "b"]
    cfg.layers.pattern = []
    assert [layer_kind(cfg, i) for i in range(3)] == ["c", None, None]


def test_counts_flops_and_cache_sum_the_layers_own_configs():
    """MoE every other layer, a window on the dense ones: each sum written out by hand."""
    moe = "{mlp: {kind: moe, expert: swiglu, routing: {n_experts: 4, top_k: 2}, expert_d_ff: 16}}"
    cfg = compose_model([*TINY, f"model.layers.kinds={{dense: {{attention: {{window: 5}}}}, sparse: {moe}}}"])
    cfg.layers.pattern = ["dense", "sparse"]
    attention = 4 * D * D  # q, k, v, o without biases
    dense_mlp, expert = 3 * D * 48, 3 * D * 16
    router = D * 4
    norms = 2 * D
    embedding = V * D
    total = embedding + 4 * (attention + norms) + 2 * dense_mlp + 2 * (router + 4 * expert) + D
    counts = count_params(cfg)
    assert counts["total"] == total == sum(p.numel() for p in build_model(cfg).parameters())
    assert counts["active"] == total - 2 * 2 * expert  # two of four experts idle in each MoE layer
    hd = D // H
    # 12·H·hd per key seen: a window of 5 on layers 0 and 2, all T on layers 1 and 3
    scores = 12 * H * hd * (5 + T + 5 + T)
    assert counts["flops_per_token"] == 6 * counts["active_non_embedding"] + scores
    assert kv_cache_bytes(cfg) == 4 * 2 * H * hd * (5 + T + 5 + T)  # float32 keys and values kept per layer


def test_a_layer_without_positions_computes_what_a_model_without_positions_computes():
    """Blocks of the layout, run one by one, equal the same blocks taken from a RoPE model (local layers)
    and a position-free model (the global one), all with the same weights."""
    layout = build_model(compose_model([*TINY, *IROPE])).eval()
    rope = build_model(compose_model([*TINY, "model.attention.window=3"])).eval()
    nope = build_model(compose_model([*TINY, "model/position=none"])).eval()
    with torch.no_grad():
        for p in layout.parameters():
            p.uniform_(-0.5, 0.5)
        for other in (rope, nope):
            other.load_state_dict(layout.state_dict())
        idx = torch.randint(0, V, (2, T))
        x = layout.tok_emb(idx)
        pos = torch.arange(T)
        for i, source in enumerate((rope, rope, rope, nope)):
            rotary = source.position.rotary(pos, x.dtype)
            mask = source.mask(source.position, 0, T, 0, source.blocks[i].attn.window, x.dtype, x.device)
            x = source.blocks[i](x, rotary, mask, None)
        expected = layout.head(layout.final_norm(x))
        torch.testing.assert_close(layout(idx), expected, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(layout(idx), rope(idx), atol=1e-3)  # the global layer's positions matter


def test_a_layer_kind_s_block_is_that_layer_s_wiring():
    """A kind setting ``block`` (OLMo Hybrid's post-norm attention layers beside pre-norm ones): its layers
    are the blocks of a whole model of that block, the others the model's; the count sums each layer's norms
    (both wirings hold two), the final norm is the model's; and a family whose layers share one block (LLaMA)
    refuses the kind's block naming it."""
    post = ["model.layers.kinds={pre: {}, post: {block: {kind: post_sublayer}}}", "model.layers.pattern=[pre,post]"]
    layout = build_model(compose_model([*TINY, *post])).eval()
    pre = build_model(compose_model(TINY)).eval()
    sub = build_model(compose_model([*TINY, "model/block=post_sublayer"])).eval()
    assert [type(b).__name__ for b in layout.blocks] == [type(b).__name__ for b in (pre.blocks[0], sub.blocks[1])] * 2
    assert (
        count_params(layout.cfg)["total"]
        == count_params(pre.cfg)["total"]
        == sum(p.numel() for p in layout.parameters())
    )
    with torch.no_grad():
        for p in layout.parameters():
            p.uniform_(-0.5, 0.5)
        for other in (pre, sub):  # each holds the layout's tensors of its own wiring's layers
            own = other.state_dict()
            other.load_state_dict({k: v for k, v in layout.state_dict().items() if k in own}, strict=False)
        idx = torch.randint(0, V, (2, T))
        x = layout.tok_emb(idx)
        rotary = pre.position.rotary(torch.arange(T), x.dtype)
        mask = pre.mask(pre.position, 0, T, 0, None, x.dtype, x.device)
        for i, source in enumerate((pre, sub, pre, sub)):
            x = source.blocks[i](x, rotary, mask, None)
        torch.testing.assert_close(layout(idx), layout.head(layout.final_norm(x)), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(layout(idx), pre(idx), atol=1e-3)  # the post-norm layers' wiring matters
    from archlab.interop.hf import FAMILIES

    problems = FAMILIES["llama"].problems(layout.cfg)
    assert "model.layers.kinds.post.block.kind" in {p.field for p in problems}


def test_cached_decoding_equals_the_full_forward():
    model = build_model(compose_model([*TINY, *IROPE, "+model.layers.kinds.local.attention.n_kv_head=2"])).eval()
    prompt = torch.randint(0, V, (2, 5))
    out = generate(model, prompt, max_new_tokens=9)  # KV cache: windows of 3 on the local layers
    with torch.no_grad():
        ids = prompt
        for _ in range(9):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["model.layers.kinds={a: {}}", "model.layers.pattern=[a,b]"], "model.layers.pattern"),
        (["model.layers.first=[a]"], "model.layers.first"),
        (["model.layers.kinds={a: {d_model: 64}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.d_model"),
        (["model.layers.kinds={a: {attention: {windw: 3}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.attention.windw"),
        (["model.layers.kinds={a: {attention: {window: -1}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.attention.window"),
        (["model.layers.kinds={a: {position: {kind: none}}}", "model.layers.pattern=[a]", "model/position=learned"], "model.layers.kinds.a.position"),
        (["model.layers.kinds={a: {}}", "model.layers.first=[a,a,a,a,a]"], "model.layers.first"),
    ],
)  # fmt: skip
def test_a_layout_that_cannot_work_is_refused_naming_its_field(overrides, field):
    with pytest.raises(ConfigError) as refused:
        compose_model([*TINY, *overrides])
    assert refused.value.field == field


def test_what_a_layout_ignores_is_named():
    overrides = [*TINY, *IROPE, "+model.layers.kinds.global.attention.kv_lora_rank=8"]
    cfg = compose_model(overrides)
    cfg.layers.kinds["spare"] = {"mlp": {"d_ff": 64}}
    # an mla field on a causal layer is no field of its mixer: left out of the model as it is composed
    assert left_out(compose("check", overrides)) == [
        "model.layers.kinds.global.attention.kv_lora_rank=8 is left out: mixer causal has no such field",
        "model.mlp.approximate='tanh' is left out: MLP swiglu has no such field",  # the preset's GELU's
    ]
    assert "kv_lora_rank" not in cfg.layers.kinds["global"]["attention"]
    assert [(i.field, i.why) for i in ignored(cfg)] == [("model.layers.kinds.spare", "no layer is given it")]
    assert ignored(without_ignored(cfg)) == [] and without_ignored(cfg).layers.kinds == {
        "local": {"attention": {"window": 3}},
        "global": {"position": {"kind": "none"}, "attention": {}},
    }
    # a field of the model's MLP that only its layers' parts read (d_ff, which a MoE kind of swiglu experts
    # shares with the model's swiglu: its experts' width) is no ignored field
    kinds = "model.layers.kinds={s: {mlp: {kind: moe, routing: {n_experts: 4}}}}"
    moe = compose_model([*TINY, "model/mlp=swiglu", "model.mlp.d_ff=40", kinds])
    moe.layers.pattern = ["s"]
    assert ignored(moe) == []
    assert [(c.mlp.routing.n_experts, expert_width(c)) for c in layer_configs(moe)] == [(4, 40)] * 4


def test_check_gives_each_layer_kind_its_layers_and_counts(capsys):
    from archlab.build import compose
    from archlab.cli.check import run

    overrides = [*TINY, *IROPE, "+model.layers.kinds.global.mlp.d_ff=24", "format=json"]
    assert run(compose("check", overrides), overrides) == 0
    result = json.loads(capsys.readouterr().out)
    kinds = result["layer_kinds"]
    assert [kinds["local"]["layers"], kinds["global"]["layers"]] == [[0, 1, 2], [3]]
    assert [kinds["local"]["mlp"], kinds["global"]["mlp"]] == [3 * D * 48, 3 * D * 24]
    assert kinds["local"]["attention"] == kinds["global"]["attention"] == 4 * D * D
    assert result["hf_export"]["exports_to"] is None  # no family holds it as it is
    # the nearest keeps the global layer's own MLP width (Gemma 3n's, a width per layer): its changes are the model's
    assert result["hf_export"]["nearest"] == "Gemma3nForCausalLM"
    blocking = [b["field"] for b in result["hf_export"]["blocking"]]
    assert blocking and not any(field.startswith("model.layers.") for field in blocking), blocking


@pytest.mark.parametrize("layout", sorted(p.stem for p in (CONF_DIR / "model" / "layers").glob("*.yaml")))
def test_every_shipped_layout_composes_and_counts_what_it_builds(layout):
    cfg = compose_model([*TINY, "model.n_layer=6", f"model/layers={layout}"])
    built = build_model(cfg, device="meta")
    assert count_params(cfg)["total"] == sum(p.numel() for p in built.parameters())
    kinds = {layer_kind(cfg, i) for i in range(6)}
    assert (kinds == {None}) == (layout == "none")


def test_a_layout_trains():
    """A short fit of the 3:1 local/global layout on one repeated batch: the loss falls, every weight moves."""
    torch.manual_seed(0)
    model = build_model(compose_model([*TINY, *IROPE])).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    idx = torch.randint(0, V, (4, T + 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_build_validates_once_and_merges_each_layer_kind_once(monkeypatch):
    """``build_model`` validates the model once (each layer kind's checks once, within it) and merges each
    kind's fields once, though it both counts and builds: counted by spying on the first check every
    validation makes (``model.vocab_size``) and on the merge (``kind_config``)."""
    import archlab.checks
    import archlab.config.layers

    cfg = compose_model(TINY + IROPE)  # two kinds: local and global
    validations, merges = [], []
    positive, kind_config = archlab.checks.positive, archlab.config.layers.kind_config

    def spy_positive(field, *args, **kwargs):
        validations.append(field == "model.vocab_size")
        return positive(field, *args, **kwargs)

    def spy_kind_config(model, name):
        merges.append(name)
        return kind_config(model, name)

    monkeypatch.setattr(archlab.checks, "positive", spy_positive)
    monkeypatch.setattr(archlab.config.layers, "kind_config", spy_kind_config)
    build_model(cfg, device="meta")
    assert sum(validations) == 1 + 2  # the model, then each of its two kinds' configs
    assert sorted(merges) == ["global", "local"]


def test_mup_gives_each_layer_kind_its_own_mixers_temperature():
    """param=mup scales the score multiplier of softmax layers by sqrt(base head_dim / head_dim) and leaves a
    recurrent layer kind without one: a Gated DeltaNet hybrid at twice the proxy's width builds (it was
    refused: the deltanet kind inherited the model's new scale), its attention layers at the hand-worked
    temperature, its deltanet layers at none; a causal kind of another head size gets its own."""
    from archlab.training.parametrization import parametrize

    hybrid = ["model=nano", "model.vocab_size=32", "model.context_length=16", "model/layers=deltanet_3_1"]
    hybrid += ["model.n_layer=4", "model.d_model=128", "model.attention.n_head=4"]
    hybrid += ["+model.layers.kinds.deltanet.attention.key_head_dim=16"]
    hybrid += ["+model.layers.kinds.deltanet.attention.v_head_dim=16"]
    hybrid += ["+model.layers.kinds.wide={attention: {head_dim: 64}}", "model.layers.pattern=[deltanet,attention,wide]"]
    param = {"kind": "mup", "base_d_model": 64, "base_n_layer": None, "base_head_dim": 16}
    scaled = parametrize(compose_model(hybrid), param)
    model = build_model(scaled, device="meta")
    # head_dim 128 / 4 = 32 against the proxy's 16: (1/sqrt(32))·sqrt(16/32) = 1/8; the wide kind's 64 against
    # 16: (1/sqrt(64))·sqrt(16/64) = 1/16
    scales = [getattr(block.attn, "scale", None) for block in model.blocks]
    assert [c.attention.kind for c in layer_configs(scaled)] == ["gated_deltanet", "causal", "causal", "gated_deltanet"]
    assert [getattr(c.attention, "scale", None) for c in layer_configs(scaled)] == [None, 1 / 8, 1 / 16, None]
    assert scales[1:3] == [pytest.approx(1 / 8), pytest.approx(1 / 16)]


# a recurrent mixer whose "head" is one dim wide (mamba2's state_size, gated_deltanet's key_head_dim), without
# biases, and its parameters by hand: mamba2's in-projection d·(I + C + H) for inner I = 1 and conv channels
# C = I + 2·groups·state_size = 3, its convolution C·K, dt_bias, A_log and D, norm I, out I·d; gated_deltanet's
# in-projection d·(2·dk + 2·dv + 2) (q, k, v, z, b, a), convolution (2·dk + dv)·K, A_log and dt_bias, norm dv,
# out dv·d
ONE_WIDE = {
    "mamba2": ({"head_dim": 1, "state_size": 1, "conv_bias": False, "qkv_bias": False, "out_bias": False}, 22),
    "gated_deltanet": ({"key_head_dim": 1, "v_head_dim": 1}, 2 * (2 + 2 + 2) + 3 * 2 + 2 + 1 + 2),
}


def _recurrent_hybrid(mixer: str, position: dict, other: dict) -> dict:
    """d_model 2, one head of 2, RoPE, two layers: kind ``a`` with the one-wide ``mixer`` (conv 2), then kind
    ``b``, causal with the ``other`` attention fields; no MLP, no biases in the causal layer."""
    kind_a = {"kind": mixer, "conv_kernel": 2} | ONE_WIDE[mixer][0]
    return {
        "vocab_size": 8,
        "context_length": 8,
        "n_layer": 2,
        "d_model": 2,
        "position": {"kind": "rope"} | position,
        "attention": {"n_head": 1, "qkv_bias": False, "out_bias": False},
        "mlp": {"kind": "none"},
        "layers": {"kinds": {"a": {"attention": kind_a}, "b": {"attention": other}}, "pattern": ["a", "b"]},
    }


@pytest.mark.parametrize("position", [{}, {"rotary_dim": 2}], ids=["whole-heads", "rotary_dim-2"])
@pytest.mark.parametrize("mixer", sorted(ONE_WIDE))
def test_rope_fits_no_head_to_a_recurrent_layer_kind_but_still_to_a_causal_one(mixer, position):
    """The property tests drew d_model 2, one head, RoPE and a layer kind of a recurrent mixer one dim
    wide: ``count`` refused it (model.position.rotary_dim=1 against head_dim=1, in layer kind a), though no
    rotation reaches that mixer. It builds, and counts by hand: the embedding 8·2 (tied), the recurrent
    layer, the causal one 4·2·2, a LayerNorm per block and the final one 2·2 each. A causal kind of heads
    that narrow is still refused, naming what its RoPE cannot rotate."""
    cfg = to_model_config(_recurrent_hybrid(mixer, position, {}))
    assert [c.attention.kind for c in layer_configs(cfg)] == [mixer, "causal"]
    total = 8 * 2 + ONE_WIDE[mixer][1] + 4 * 2 * 2 + 3 * 2 * 2
    assert count_params(cfg)["total"] == total
    model = build_model(cfg)  # compares each component with the closed form
    assert sum(p.numel() for p in model.parameters()) == total
    assert model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 8)

    narrow = _recurrent_hybrid(mixer, position, {"head_dim": 1})  # the causal kind b: one head of 1
    with pytest.raises(ConfigError) as refused:
        count_params(to_model_config(narrow))
    if position:  # 2 rotated dims do not fit a head of 1
        assert refused.value.field == "model.position.rotary_dim" and refused.value.value == 2
        assert "head_dim=1" in refused.value.allowed and "(in layer kind b)" in refused.value.allowed
    else:  # a whole head of 1 is no pair
        assert refused.value.field == "model.layers.kinds.b.attention.head_dim" and refused.value.value == 1
