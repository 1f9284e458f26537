"""mla's options beyond DeepSeek's: the latents scaled by sqrt(d_model / rank) and the shared rotated key
normed (``latent_scale``, ``rope_key_norm``: dots.3-note's attention), queries and the output gate from
[normed, raw] query latent (``q_latent`` both, ``gate_input`` q_latent: A.X K2's). Each against the
transformers attention it mirrors (float32, eager, every weight redrawn), its closed-form count against the
meta build and transformers' module, its validation."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import randomise
from omegaconf import OmegaConf

from archlab import build_model
from archlab.accounting import check_build
from archlab.config import to_model_config
from archlab.errors import ConfigError
from archlab.nn.mixers.dsa import DeepSeekSparseAttention
from archlab.nn.mixers.mla import MultiHeadLatentAttention
from archlab.nn.rope import RoPE
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

D, H, Q, R, NOPE, ROPE, V = 32, 4, 12, 16, 6, 4, 5
MLA = dict(kind="mla", n_head=H, q_lora_rank=Q, kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE)
MLA |= dict(v_head_dim=V)
T = 9


def tiny(**attention):
    """d_model 32, RMSNorm at 1e-5, interleaved RoPE of base 500, mla of 4 heads (6 + 4 qk, 5 v), ranks 12
    and 16, the ``attention`` fields over it."""
    base = {
        "vocab_size": 48,
        "context_length": 16,
        "n_layer": 2,
        "d_model": D,
        "norm": {"kind": "rmsnorm", "eps": 1e-5},
        "position": {"kind": "rope", "theta": 500.0, "pairing": "interleaved"},
        "attention": MLA | attention,
        "mlp": {"kind": "swiglu", "bias": False},
        "head": {"tied": False},
    }
    cfg = to_model_config(OmegaConf.create(base))
    validate(cfg)
    return cfg


def copy_weights(ours: torch.nn.Module, theirs: dict[str, torch.Tensor], names: dict[str, str]) -> None:
    """Each of ``ours``' parameters from ``theirs`` under ``names`` (module -> HF module)."""
    with torch.no_grad():
        for name, p in ours.named_parameters():
            module, _, leaf = name.rpartition(".")
            p.copy_(theirs[f"{names[module]}.{leaf}"])


def inputs():
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(1))
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
    return x, causal


MLA_NAMES = {"q_down": "q_a_proj", "q_norm": "q_a_layernorm", "kv_down": "kv_a_proj_with_mqa"}
MLA_NAMES |= {"kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj", "proj": "o_proj"}


# ---- dots.3-note: scaled latents, the normed rotated key, a gate per head


def hf_dots3():
    transformers = pytest.importorskip("transformers")
    from transformers.models.dots3_note import modeling_dots3_note as m

    sizes = dict(hidden_size=D, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=Q, kv_lora_rank=R)
    sizes |= dict(qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V, head_dim=NOPE + ROPE)
    sizes |= dict(num_hidden_layers=1, layer_types=["full_attention"], use_dsa=False, rms_norm_eps=1e-5)
    sizes |= dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500.0}})
    config = transformers.Dots3NoteTextConfig(**sizes)
    config._attn_implementation = "eager"
    return m.Dots3NoteTextAttention(config, 0), m.Dots3NoteTextRotaryEmbedding(config)


def test_scaled_latents_and_the_normed_rotated_key_equal_dots3_notes_attention():
    hf, rotary = hf_dots3()
    randomise(hf)
    cfg = tiny(latent_scale=True, rope_key_norm=True, gate="head")
    ours = MultiHeadLatentAttention(cfg)
    copy_weights(ours, dict(hf.named_parameters()), MLA_NAMES | {"q_up": "q_b_proj", "gate": "g_proj"} | {
        "k_rope_norm": "k_rope_only_layernorm"})  # fmt: skip
    assert sum(p.numel() for p in hf.parameters()) == MultiHeadLatentAttention.num_params(cfg)
    x, causal = inputs()
    with torch.no_grad():
        expected = hf(x, rotary(x, torch.arange(T)[None], "full_attention"), causal)[0]
        got = ours(x, RoPE(cfg).rotary(torch.arange(T), torch.float32))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        for field in ("latent_scale", "rope_key_norm"):  # each part moves the output
            other = MultiHeadLatentAttention(tiny(latent_scale=field != "latent_scale", rope_key_norm=field != "rope_key_norm", gate="head"))  # fmt: skip
            other.load_state_dict(ours.state_dict(), strict=False)
            assert (other(x, RoPE(cfg).rotary(torch.arange(T), torch.float32)) - got).abs().max() > 1e-3


def test_the_latent_scales_are_sqrt_of_width_over_rank():
    """sqrt(32 / 12) on the query latent, sqrt(32 / 16) on the key/value latent; none without the option."""
    ours = MultiHeadLatentAttention(tiny(latent_scale=True))
    assert (ours.q_scale, ours.kv_scale) == pytest.approx(((32 / 12) ** 0.5, 2**0.5))
    plain = MultiHeadLatentAttention(tiny())
    assert (plain.q_scale, plain.kv_scale, plain.k_rope_norm) == (None, None, None)


# ---- A.X K2: queries and gate from [normed, raw] query latent


def hf_axk2():
    transformers = pytest.importorskip("transformers")
    from transformers.models.axk2 import modeling_axk2 as m

    sizes = dict(hidden_size=D, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=Q, kv_lora_rank=R)
    sizes |= dict(qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V, num_hidden_layers=1)
    sizes |= dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, rms_norm_eps=1e-6)
    sizes |= dict(index_n_heads=4, index_head_dim=8, index_topk=T)
    config = transformers.AXK2Config(**sizes)
    config._attn_implementation = "eager"
    return m.AXK2Attention(config, 0), m.AXK2RotaryEmbedding(config)


def test_queries_and_gate_of_both_latents_equal_axk2s_attention():
    """A.X K2's attention keeping every key (index_topk = the length): archlab's dsa with q_latent both and an
    elementwise gate of q_up's input; HF's fused q_gate_proj holds per head the query rows, then the gate's."""
    hf, rotary = hf_axk2()
    randomise(hf)
    cfg = tiny(kind="dsa", q_latent="both", gate="elementwise", gate_input="q_latent", latent_norm_eps=None)
    cfg.norm.eps = 1e-6
    cfg.attention.index_n_heads, cfg.attention.index_head_dim, cfg.attention.index_topk = 4, 8, T
    ours = DeepSeekSparseAttention(cfg)
    theirs: dict[str, torch.Tensor] = dict(hf.named_parameters())
    fused = theirs.pop("q_gate_proj.weight").unflatten(0, (H, NOPE + ROPE + V))
    theirs["q_up.weight"], theirs["gate.weight"] = (p.flatten(0, 1) for p in fused.split((NOPE + ROPE, V), dim=1))
    names = MLA_NAMES | {"q_up": "q_up", "gate": "gate", "indexer.q_up": "indexer.wq_b", "indexer.k_proj": "indexer.wk"}
    copy_weights(
        ours, theirs, names | {"indexer.k_norm": "indexer.k_norm", "indexer.head_weights": "indexer.weights_proj"}
    )
    assert sum(p.numel() for p in hf.parameters()) == DeepSeekSparseAttention.num_params(cfg)
    x, causal = inputs()
    with torch.no_grad():
        expected = hf(x, rotary(x, torch.arange(T)[None]), causal, position_ids=torch.arange(T)[None])[0]
        got = ours(x, RoPE(cfg).rotary(torch.arange(T), torch.float32))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_q_up_and_the_gate_read_the_widths_the_options_name():
    """q_latent both: q_up reads 2·q_r; gate_input q_latent: the gate reads what q_up reads."""
    for q_latent, width in (("both", 2 * Q), ("normed", Q)):
        attn = MultiHeadLatentAttention(tiny(q_latent=q_latent, gate="head", gate_input="q_latent"))
        assert attn.gate is not None and (attn.q_up.in_features, attn.gate.in_features) == (width, width)


# ---- counts, decoding, validation


@pytest.mark.parametrize(
    "attention, extra",
    [
        (dict(latent_scale=True), 0),
        (dict(rope_key_norm=True), ROPE),
        (dict(q_latent="both"), Q * H * (NOPE + ROPE)),
        (dict(gate="head", gate_input="q_latent"), (Q - D) * H),
        (dict(q_latent="both", gate="elementwise", gate_input="q_latent"), Q * H * (NOPE + ROPE) + (2 * Q - D) * H * V),
    ],
)  # fmt: skip
def test_each_option_s_count_is_the_closed_form_and_the_meta_build(attention, extra):
    """The parameters each option adds over mla with the same gate reading x, by hand; the closed form equals
    the meta build."""
    cfg = tiny(**attention)
    check_build(cfg, build_model(cfg, device="meta"))
    base = tiny(**{k: v for k, v in attention.items() if k in ("gate",)})
    assert MultiHeadLatentAttention.num_params(cfg) - MultiHeadLatentAttention.num_params(base) == extra


@pytest.mark.parametrize(
    "attention",
    [
        dict(latent_scale=True, rope_key_norm=True, gate="head"),
        dict(q_latent="both", gate="elementwise", gate_input="q_latent"),
    ],
    ids=["dots3", "axk2"],
)
def test_cached_decoding_with_the_options_equals_the_full_forward(attention):
    cfg = tiny(**attention)
    model = build_model(cfg)
    randomise(model)
    model.eval()
    idx = torch.randint(0, 48, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 12)
        steps = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "attention, field",
    [
        (dict(q_lora_rank=None, q_latent="both"), "model.attention.q_latent"),
        (dict(gate_input="q_latent"), "model.attention.gate_input"),
        (dict(q_lora_rank=None, gate="head", gate_input="q_latent"), "model.attention.gate_input"),
        (dict(q_latent="raw"), "model.attention.q_latent"),
    ],
)
def test_options_it_cannot_run_are_refused_naming_the_field(attention, field):
    with pytest.raises(ConfigError) as e:
        tiny(**attention)
    assert e.value.field == field


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.attention.latent_scale=true"], "model.attention.latent_scale"),
        (["model.attention.rope_key_norm=true"], "model.attention.rope_key_norm"),
        (["model.attention.q_latent=both"], "model.attention.q_latent"),
        (["model.attention.gate=head", "model.attention.gate_input=q_latent"], "model.attention.gate_input"),
    ],
)
def test_deepseek_v3_finds_each_option_it_cannot_hold(overrides, field):
    """DeepSeek-V3's record, which holds mla without them, lists each among the problems of a layout."""
    from archlab import compose_model
    from archlab.interop.families import FAMILIES

    cfg = compose_model(["model=deepseek-v3", *overrides])
    assert field in {p.field for p in FAMILIES["deepseek_v3"].problems(cfg)}
