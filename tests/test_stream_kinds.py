"""Residual-stream connections per layer kind (``model.layers.kinds.<kind>.stream``): a layout whose kinds
give some layers mhc and others static hyper-connections computes what the blocks of a whole mhc model and a
whole static-hyper model compute, run one by one with the same weights and merged as the model's stream
merges; an override equal to the model's stream changes nothing and one that differs changes the forward;
the closed-form count is the meta build's for several mixes and, for one, the sum worked by hand; the μP
roles are each connection's own; a family holding one stream setting refuses a kind's; every layout that
cannot hold is refused naming the kind's field."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import check_trains_then_decodes_in_pieces, randomise

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.accounting import built_counts
from archlab.build import compose
from archlab.cli.check import layer_kinds
from archlab.config import left_out
from archlab.nn.component import Role
from archlab.nn.streams.gated import GatedConnection
from archlab.nn.streams.hyper import HyperConnection
from archlab.nn.streams.mhc import MHCConnection
from archlab.nn.validation import validate
from archlab.training.parametrization import roles

pytestmark = pytest.mark.usefixtures("single_thread")

V, T, D, N = 64, 12, 32, 4
TINY = ["model=nano", f"model.d_model={D}", "model.n_layer=4", "model.attention.n_head=4", f"model.vocab_size={V}"]
TINY += [f"model.context_length={T}", "model/position=rope", "model/norm=rmsnorm"]
HYPER = [*TINY, "model/stream=hyper"]
# layers 0 and 2 mhc, 1 and 3 static hyper-connections, in a model of dynamic ones (summed before the final norm)
MIXED = ["model.layers.kinds={m: {stream: {kind: mhc}}, s: {stream: {dynamic: false}}}", "model.layers.pattern=[m,s]"]


def _load_own(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``model`` given the tensors of ``state`` it has (every one of its layers' that it shares)."""
    own = model.state_dict()
    model.load_state_dict({k: v for k, v in state.items() if k in own and own[k].shape == v.shape}, strict=False)


def test_each_layer_is_the_connection_its_kind_names():
    """Blocks 0 and 2 from a whole mhc model, 1 and 3 from a whole static-hyper one (every weight the layout's,
    randomised), run on the embeddings copied into 4 streams, summed (hyper's merge) and normed: the layout's
    logits. The layout holds no merge weights of mhc's: the model's part is the model's stream's."""
    layout = randomise(build_model(compose_model([*HYPER, *MIXED])), seed=1).eval()
    whole_mhc = build_model(compose_model([*TINY, "model/stream=mhc"])).eval()
    static = build_model(compose_model([*HYPER, "model.stream.dynamic=false"])).eval()
    blocks = layout.blocks
    assert [type(b.attn_stream) for b in blocks] == [MHCConnection, HyperConnection] * 2
    assert [type(b.mlp_stream) for b in blocks] == [MHCConnection, HyperConnection] * 2
    assert [blocks[i].attn_stream.dynamic for i in (1, 3)] == [False, False]
    assert not any(name.startswith("stream.") for name, _ in layout.named_parameters())
    with torch.no_grad():
        for source in (whole_mhc, static):
            _load_own(source, layout.state_dict())
        idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(2))
        x = layout.tok_emb(idx)
        h = x.unsqueeze(2).expand(-1, -1, N, -1)  # the embeddings in every stream
        rotary = static.position.rotary(torch.arange(T), x.dtype)
        mask = static.mask(static.position, 0, T, 0, None, x.dtype, x.device)
        for i, source in enumerate((whole_mhc, static, whole_mhc, static)):
            h = source.blocks[i](h, rotary, mask, None)
        expected = layout.head(layout.final_norm(h.sum(2)))
        torch.testing.assert_close(layout(idx), expected, rtol=1e-5, atol=1e-5)


def test_an_override_equal_to_the_models_stream_changes_nothing_and_another_changes_the_forward():
    """A kind naming the model's own stream (hyper, n 4, dynamic) builds the uniform model's tensors and its
    logits; a kind making its layers static drops their dynamic weights and moves the logits."""
    uniform = randomise(build_model(compose_model(HYPER)), seed=3).eval()
    same = ["model.layers.kinds={h: {stream: {kind: hyper, n: 4, dynamic: true}}}", "model.layers.pattern=[h]"]
    twin = build_model(compose_model([*HYPER, *same])).eval()
    assert {k: v.shape for k, v in twin.state_dict().items()} == {k: v.shape for k, v in uniform.state_dict().items()}
    half = ["model.layers.kinds={s: {stream: {dynamic: false}}}", "model.layers.first=[s,s]"]
    static = build_model(compose_model([*HYPER, *half])).eval()
    dropped = set(uniform.state_dict()) - set(static.state_dict())
    dynamic = ("dynamic_alpha", "dynamic_beta", "alpha_scale", "beta_scale", "norm.weight")
    assert dropped == {f"blocks.{i}.{s}_stream.{w}" for i in (0, 1) for s in ("attn", "mlp") for w in dynamic}
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        twin.load_state_dict(uniform.state_dict())
        _load_own(static, uniform.state_dict())
        torch.testing.assert_close(twin(idx), uniform(idx), rtol=0, atol=0)
        assert not torch.allclose(static(idx), uniform(idx), atol=1e-3)  # the random dynamic terms are gone


MIXES = {
    "hyper with mhc and static layers": [*HYPER, *MIXED],
    "mhc with static hyper and gated layers": [
        *TINY,
        "model/stream=mhc",
        "model.layers.kinds={h: {stream: {kind: hyper, dynamic: false}}, g: {stream: {kind: gated, rank: 8}}}",
        "model.layers.pattern=[h,g]",
    ],
    "gated with an unmixed mhc layer first": [
        *TINY,
        "model/stream=gated",
        "model.stream.rank=8",
        "model.layers.kinds={u: {stream: {kind: mhc, mix: none, post_scale: 1.5}}}",
        "model.layers.first=[u]",
    ],
    "hyper n 2 with mhc layers without an MLP": [
        *HYPER,
        "model.stream.n=2",
        "model.layers.kinds={m: {stream: {kind: mhc}, mlp: {kind: none}}}",
        "model.layers.pattern=[m,m,m,m]",
    ],
    "altup with a layer kind's own clip": [
        *TINY,
        "model/stream=altup",
        "model.layers.kinds={c: {stream: {coef_clip: 30.0}}}",
        "model.layers.pattern=[c]",
    ],
}


@pytest.mark.parametrize("overrides", MIXES.values(), ids=MIXES.keys())
def test_the_closed_form_count_is_the_meta_build(overrides):
    cfg = compose_model(overrides)
    counts, built = count_params(cfg), built_counts(build_model(cfg, device="meta"))
    assert {k: counts[k] for k in built} == built and counts["streams"] > 0


def test_the_mixed_count_and_flops_are_the_sum_worked_by_hand():
    """d 32, n 4, RMSNorm: an mhc connection holds fn 24 × 128, base 24 and 3 scales, 3,099; a static hyper
    one A_m and A_r 4 × 5 and B 4, 24; two of each per layer: 4·3,099 + 4·24 = 12,492 beside the plain twin's
    parameters, no merge weights (hyper's sum). FLOPs add 6 per weight and, per connection, 6·d·(n² + 2n)
    for mhc and 6·d·((1 + n)·n + n) for hyper: 6·32·24 each."""
    plain, mixed = count_params(compose_model(TINY)), count_params(compose_model([*HYPER, *MIXED]))
    assert mixed["streams"] == 4 * (24 * 128 + 24 + 3) + 4 * 24 == 12_492
    assert mixed["total"] - plain["total"] == 12_492
    assert mixed["per_block"] - plain["per_block"] == 2 * 24  # the last layer: static hyper
    assert mixed["flops_per_token"] - plain["flops_per_token"] == 6 * 12_492 + 8 * 6 * 32 * 24
    # an mhc model whose layers are all static hyper: hyper's connections and mhc's merge (n·n·d + n + 1; 6·d·n)
    static = ["model.layers.kinds={s: {stream: {kind: hyper, dynamic: false}}}", "model.layers.pattern=[s]"]
    merged = count_params(compose_model([*TINY, "model/stream=mhc", *static]))
    assert merged["streams"] == 8 * 24 + (4 * 128 + 4 + 1)
    assert merged["flops_per_token"] - plain["flops_per_token"] == 6 * merged["streams"] + 6 * 32 * (8 * 24 + 4)


def test_each_connection_keeps_its_own_mup_roles():
    model = build_model(compose_model([*TINY, *MIXES["mhc with static hyper and gated layers"][len(TINY) :]]))
    by_id = roles(model)
    role = {name: by_id[id(p)] for name, p in model.named_parameters()}
    assert isinstance(model.blocks[1].attn_stream, GatedConnection)
    assert role["blocks.0.attn_stream.static_alpha"] == Role.VECTOR
    assert (role["blocks.1.mlp_stream.down.weight"], role["blocks.1.mlp_stream.up.weight"]) == (Role.OUTPUT, Role.INPUT)
    assert role["stream.hc_fn"] == Role.OUTPUT  # the model's mhc merge


def test_a_mixed_model_trains_and_decodes_in_pieces_as_whole():
    torch.manual_seed(0)
    model = build_model(compose_model([*HYPER, *MIXED]))
    idx = torch.randint(0, V, (4, T))
    check_trains_then_decodes_in_pieces(model, idx, [5, 6, 7, T])


def test_check_names_each_kinds_stream():
    kinds = layer_kinds(compose_model([*HYPER, *MIXED]))
    assert kinds["m"]["layers"] == [0, 2] and kinds["m"]["parts"].endswith("stream=mhc ×4, sinkhorn 20")
    assert kinds["s"]["parts"].endswith("stream=hyper ×4, static")


def test_a_family_of_one_stream_setting_refuses_a_kinds_own():
    """HY V4 holds mhc without a mix in every layer: a kind's post scale is refused naming the kind's field."""
    transformers = pytest.importorskip("transformers")
    from archlab.interop.hf import FAMILIES, config_from_hf

    hf = transformers.HYV4Config(
        hidden_size=D, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, hc_mult=3, vocab_size=V
    )
    cfg = config_from_hf(hf)
    assert FAMILIES["hy_v4"].problems(cfg) == []
    kinds = dict(cfg.layers.kinds or {})
    used = cfg.layers.first[0] if cfg.layers.first else cfg.layers.pattern[0]
    kinds[used] = {**kinds[used], "stream": {"post_scale": 1.0}}
    cfg.layers.kinds = kinds
    problems = FAMILIES["hy_v4"].problems(cfg)
    assert [p.field for p in problems] == [f"model.layers.kinds.{used}.stream.post_scale"]
    assert "share one residual stream" in problems[0].why


PLAIN_KIND = ["model.layers.kinds={a: {stream: {kind: hyper}}}", "model.layers.pattern=[a]"]


@pytest.mark.parametrize(
    "overrides, field, allowed",
    [
        ([*TINY, *PLAIN_KIND], "model.layers.kinds.a.stream.kind", "plain with model.stream.kind=plain"),
        ([*HYPER, "model.layers.kinds={a: {stream: {kind: plain}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.stream.kind", "gated or hyper or mhc"),
        ([*HYPER, "model.layers.kinds={a: {stream: {kind: altup}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.stream.kind", "gated or hyper or mhc"),
        ([*HYPER, "model.layers.kinds={a: {stream: {kind: mhc, n: 2}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.stream.n", "4 (model.stream.n"),
        ([*HYPER, "model.layers.kinds={a: {stream: {kind: unknown}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.stream.kind", "one of"),
        ([*HYPER, "model.layers.kinds={a: {stream: {dynamic: 1}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.stream.dynamic", "true or false"),
        ([*HYPER, "model.layers.kinds={a: {stream: {kind: mhc, sinkhorn_iters: 0}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.stream.sinkhorn_iters", "integer"),
        ([*HYPER, "model.layers.kinds={a: {stream: {kind: gated, rank: 0}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.stream.rank", "integer"),
        ([*HYPER, "model.layers.kinds={a: {block: {kind: post}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.block.kind", "pre with model.stream.kind=hyper"),
        ([*HYPER, "model.layers.kinds={a: {stream: {kind: mhc}, block: {kind: post}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.block.kind", "pre with model.stream.kind=mhc"),
        ([*TINY, "model/stream=altup", "model.layers.kinds={a: {stream: {kind: hyper}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.stream.kind", "altup with model.stream.kind=altup"),
        ([*TINY, "model/stream=altup", "model.layers.kinds={a: {stream: {coef_clip: -1.0}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.stream.coef_clip", "positive"),
        ([*TINY, "model/stream=gated", "model.layers.kinds={a: {stream: {kind: altup}}}", "model.layers.pattern=[a]"], "model.layers.kinds.a.stream.kind", "with model.stream.kind=gated"),
    ],
)  # fmt: skip
def test_a_kinds_stream_that_cannot_hold_is_refused_naming_its_field(overrides, field, allowed):
    with pytest.raises(ConfigError) as err:
        compose_model(overrides)
    assert err.value.field == field and allowed in err.value.allowed, err.value


def test_a_field_the_kinds_stream_lacks_is_left_out_when_composed_and_refused_when_built():
    """As a kind's mixer or MLP field: the composed config leaves it out and says so (a sweep crossing
    options); a config built in Python that sets it is refused naming it and the option's fields."""
    overrides = [*HYPER, "model.layers.kinds={a: {stream: {rank: 8}}}", "model.layers.pattern=[a]"]
    assert left_out(compose("check", overrides)) == [
        "model.layers.kinds.a.stream.rank=8 is left out: residual stream hyper has no such field"
    ]
    cfg = compose_model(TINY)
    cfg.layers.kinds, cfg.layers.pattern = {"a": {"stream": {"n": 2}}}, ["a"]
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert (err.value.field, err.value.allowed) == (
        "model.layers.kinds.a.stream.n",
        "a field of residual stream plain: kind",
    )
