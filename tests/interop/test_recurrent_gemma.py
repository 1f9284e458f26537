"""Hugging Face parity of RecurrentGemma (RecurrentGemmaForCausalLM, archlab/interop/families/recurrent_gemma.py):
tiny random models (every parameter redrawn: biases, (1 + w) norm scales, Λ and the gates' and conv's biases
0.5 + N(0, 0.3²)) of recurrent (``rglru``) and local attention layers give the same float32 logits in archlab
and in transformers' eager path: MQA with an RG-LRU narrower than the model, GQA with every bias, a conv of 3,
full rotary and an untied head, and an explicit head_dim with a quarter of it rotated; hidden_size 48, whose
sqrt (6.928) transformers rounds to bfloat16 (6.9375). Greedy decoding equals HF ``generate`` (past every window
of 4, through the conv's and the RG-LRU's cached state), so does a left-padded batch once HF's convolution
inputs are zeroed at the padding (archlab's rule: otherwise HF's padded row differs from the prompt alone, and
archlab's equals the prompt alone); gradients equal HF's with the square root's bound in play; HF -> archlab ->
HF -> archlab and the shrunk ``recurrentgemma-2b`` preset round trip bit for bit; the published layout's count;
refusals name their field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS, TOL, V, max_diff

from archlab import ConfigError, compose_model, count_params
from archlab.generate import generate
from archlab.interop.hf import FAMILIES, archlab_state_to_hf, config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# 3 layers (recurrent, recurrent, attention); 4 heads of 12 (rotary 6), one KV head, window 4; RG-LRU 32 wide
# (4 gate blocks of 8), conv 4; MLP 48 (intermediate_size / 2)
SMALL = dict(vocab_size=V, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4)
SMALL |= dict(num_key_value_heads=1, attention_window_size=4, lru_width=32, conv1d_width=4, **NO_TOKENS)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "rgemma-mqa": ("RecurrentGemmaForCausalLM", "RecurrentGemmaConfig", SMALL),
    "rgemma-gqa-biases-untied": (
        "RecurrentGemmaForCausalLM",
        "RecurrentGemmaConfig",
        dict(SMALL, num_hidden_layers=4, block_types=["attention", "recurrent"], num_key_value_heads=2)
        | dict(attention_bias=True, lru_width=None, conv1d_width=3, tie_word_embeddings=False, logits_soft_cap=8.0)
        | dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1.0}),
    ),
    "rgemma-head-dim": (
        "RecurrentGemmaForCausalLM",
        "RecurrentGemmaConfig",
        dict(SMALL, num_hidden_layers=5, num_key_value_heads=4, head_dim=16)
        | dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
    ),
}
# the preset shrunk: three layers (recurrent, recurrent, attention), 4 heads of 12, window 4
SIZES = ["model.n_layer=3", "model.d_model=48", "model.attention.n_head=4", "model.attention.window=4"]
SIZES += ["model.embedding_multiplier=6.9375"]  # sqrt(48) in bfloat16
PRESET_CASES = {"recurrentgemma-2b": ("recurrentgemma-2b", "RecurrentGemmaForCausalLM", SIZES)}
PROMPTS = (7, 3, 5)  # check_padded_generation's prompts, left-padded to 7


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        PRESET_CASES,
        only=(
            "test_the_family_converts_both_ways",
            "test_archlab_to_hf_to_archlab_is_bit_identical",
            "test_greedy_generation_matches_hf_generate",
        ),
    )
)


def test_from_hf_reads_the_parts():
    mqa = config_from_hf(parity.hf_config(HF_CASES, "rgemma-mqa"))
    assert (mqa.layers.first, mqa.layers.pattern) == ([], ["recurrent", "recurrent", "attention"])
    recurrent = {"attention": {"kind": "rglru", "conv_kernel": 4, "width": 32}}
    assert mqa.layers.kinds == {"recurrent": recurrent, "attention": {}}
    a, p = mqa.attention, mqa.position
    assert (a.kind, a.n_head, a.n_kv_head, a.head_dim, a.window) == ("causal", 4, 1, None, 4)
    assert (a.qkv_bias, a.out_bias, p.kind, p.rotary_fraction, p.pairing, p.theta) == (False, True, "rope", 0.5, "half", 1e4)  # fmt: skip
    assert (mqa.mlp.kind, mqa.mlp.d_ff, mqa.mlp.approximate, mqa.mlp.bias) == ("geglu", 48, "tanh", True)
    assert (mqa.norm.kind, mqa.norm.unit_offset, mqa.norm.eps, mqa.block.kind) == ("rmsnorm", True, 1e-6, "pre")
    assert (mqa.embedding_multiplier, mqa.scale_embedding, mqa.head.softcap, mqa.head.tied) == (6.9375, False, 30.0, True)  # fmt: skip
    gqa = config_from_hf(parity.hf_config(HF_CASES, "rgemma-gqa-biases-untied"))
    assert (gqa.layers.first, gqa.layers.pattern) == ([], ["attention", "recurrent"])
    assert gqa.layers.kinds["recurrent"] == {"attention": {"kind": "rglru", "conv_kernel": 3}}  # width: d_model
    a, p = gqa.attention, gqa.position
    assert (a.qkv_bias, p.rotary_fraction, p.theta, gqa.head.tied, gqa.head.softcap) == (True, None, 500.0, False, 8.0)
    wide = config_from_hf(parity.hf_config(HF_CASES, "rgemma-head-dim"))
    assert (wide.attention.head_dim, wide.position.rotary_fraction) == (16, 0.25)
    assert wide.layers.pattern == config_to_hf(wide).block_types == ["recurrent", "recurrent", "attention"]


def zero_padded_convolution_inputs(hf) -> None:
    """Hooks on ``hf`` that zero each recurrent block's ``linear_x`` output where the attention mask of the
    call is 0 (the prefill of a left-padded batch; a one-token step is never padding): archlab's rule."""
    seen = {}

    def keep_mask(module, args, kwargs):
        mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids", args[0] if args else None)
        seen["mask"] = None if mask is None else mask[:, -ids.shape[1] :]

    def zeroed(module, args, out):
        mask = seen.get("mask")
        return out if mask is None or mask.shape[1] != out.shape[1] else out * mask[..., None].to(out.dtype)

    hf.register_forward_pre_hook(keep_mask, with_kwargs=True)
    for layer in hf.model.layers:
        if hasattr(layer.temporal_block, "linear_x"):
            layer.temporal_block.linear_x.register_forward_hook(zeroed)


@pytest.mark.parametrize("case", ["rgemma-mqa", "rgemma-gqa-biases-untied"])
def test_padded_generation_equals_hf_generate_with_its_convolution_inputs_zeroed_at_the_padding(case):
    """Prompts of 7, 3 and 5 tokens left-padded into one batch: HF with the padded positions' conv inputs
    zeroed (its RG-LRU resets at each row's position 0, its attention masks the padding) generates what archlab
    does, with the same logits at every step."""
    hf = hf_model(case, seed=6)
    zero_padded_convolution_inputs(hf)
    parity.check_padded_generation(hf)


def test_left_padding_computes_each_prompt_as_alone_where_hf_does_not():
    """Unhooked, HF's padded positions reach the conv of the tokens after them: its padded row differs from
    the prompt alone; archlab's padded row gives the prompt alone's logits and generates what HF generates
    for it."""
    hf = hf_model("rgemma-mqa", seed=6)
    model = from_hf(hf)
    short = torch.randint(0, V, (1, 3), generator=torch.Generator().manual_seed(3))
    long = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(7))
    batch = torch.cat((torch.cat((torch.zeros(1, 4, dtype=torch.long), short), 1), long))
    mask = torch.tensor([[0] * 4 + [1] * 3, [1] * 7])
    alone = hf.generate(short, attention_mask=torch.ones_like(short), max_new_tokens=8, do_sample=False)
    assert torch.equal(generate(model, batch, 8, attention_mask=mask)[0, 4:], alone[0])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate gives them: each row's first token at 0
    with torch.no_grad():
        hf_padded = hf(batch, attention_mask=mask, position_ids=positions).logits[0, 4:]
        assert max_diff(hf_padded, hf(short).logits[0]) > 1e-3
        assert max_diff(model(batch, attention_mask=mask)[0, 4:], hf(short).logits[0]) <= TOL


def test_a_prompt_shorter_than_the_convolution_generates_as_hf():
    """A 2-token prompt (fewer than conv1d_width - 1 inputs to cache): 10 new tokens as HF ``generate``."""
    hf = hf_model("rgemma-mqa", seed=4)
    ids = torch.randint(0, V, (2, 2), generator=torch.Generator().manual_seed(2))
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    assert torch.equal(generate(from_hf(hf), ids, max_new_tokens=10), out)


def test_gradients_equal_hfs_with_the_square_roots_bound_in_play():
    """Λ at −20 in half the channels puts 1 − a² below 2.5e-7, where both clip sqrt's gradient at 1000: every
    parameter's float32 gradient of the same loss equals HF's."""
    hf = hf_model("rgemma-mqa")
    with torch.no_grad():
        hf.model.layers[0].temporal_block.rg_lru.recurrent_param[::2] = -20.0
    model = from_hf(hf)
    torch.log_softmax(hf(parity.IDS).logits, -1)[..., 0].sum().backward()
    torch.log_softmax(model(parity.IDS), -1)[..., 0].sum().backward()
    grads: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        grads[name] = p.grad
    assert grads["blocks.0.attn.recurrent_param"][::2].abs().min() > 0  # finite and moving where the bound acts
    hf_params = dict(hf.named_parameters())
    for name, grad in archlab_state_to_hf(model.cfg, grads).items():  # HF's names and layouts
        torch.testing.assert_close(grad, hf_params[name].grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_embedding_scale_and_the_soft_cap_each_move_the_logits():
    """sqrt(48) unrounded in place of transformers' bfloat16 6.9375, and no logit soft-cap, each give other
    logits."""
    model = from_hf(hf_model("rgemma-mqa"))
    parity.check_each_part_changes_logits(model, [("embedding_multiplier", 48**0.5), ("head__softcap", None)])


def test_the_published_layout_reads_into_the_preset_and_the_defaults_differ():
    """google-deepmind/recurrentgemma's RECURRENT_GEMMA_2B_V1 as RecurrentGemmaConfig keys (MLP 7680 wide:
    intermediate_size 15360; one key/value head) reads into ``recurrentgemma-2b`` but for the context, which
    neither config has; RecurrentGemmaConfig()'s defaults hold half the MLP and ten key/value heads."""
    preset = compose_model(["model=recurrentgemma-2b"])
    published = config_from_hf(transformers.RecurrentGemmaConfig(intermediate_size=15360, num_key_value_heads=1))
    published.context_length = preset.context_length
    assert published == preset
    default = config_from_hf(transformers.RecurrentGemmaConfig())
    assert (default.mlp.d_ff, default.attention.n_kv_head) == (3840, 10)
    L, d, hd, attention_layers = 26, 2560, 256, 8
    halved = L * 3 * (7680 - 3840) * d + L * 2 * (7680 - 3840)  # gate, up, down and two biases
    kv = attention_layers * 2 * d * (10 - 1) * hd
    assert count_params(preset)["total"] - count_params(default)["total"] == halved - kv


def test_the_preset_writes_the_published_config():
    """config_to_hf of ``recurrentgemma-2b`` has the published layer types, window, RoPE, heads and sizes
    (tests/helpers/published.py LAYOUT_CONFIGS), and the published config reads back to the same count and
    writes the same config."""
    parity.check_preset_is_published("recurrentgemma-2b")


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.attention.window=null"], "model.attention.window"),
        (["model.head.softcap=null"], "model.head.softcap"),
        (["model.scale_embedding=true", "model.embedding_multiplier=1.0"], "model.scale_embedding"),
        (["model.embedding_multiplier=7.0"], "model.embedding_multiplier"),
        (["model.attention.out_bias=false"], "model.attention.out_bias"),
        (["model.mlp.approximate=none"], "model.mlp.approximate"),
        (["model.mlp.bias=false"], "model.mlp.bias"),
        (["model.norm.unit_offset=false"], "model.norm.unit_offset"),
        (["+model.layers.kinds.recurrent.attention.n_head=2"], "model.layers.kinds.recurrent.attention.n_head"),
        (["+model.layers.kinds.attention.attention={window: 8}"], "model.layers.kinds.attention.attention.window"),
        (["+model.layers.kinds.recurrent.mlp={d_ff: 32}"], "model.layers.kinds.recurrent.mlp.d_ff"),
    ],
)
def test_the_record_refuses_what_recurrent_gemma_does_not_hold(overrides, field):
    cfg = parity.composed("model=recurrentgemma-2b", *parity.TINY, *SIZES, *overrides)
    assert field in {p.field for p in FAMILIES["recurrent_gemma"].problems(cfg)}


def test_two_recurrent_kinds_of_different_sizes_are_refused():
    """RecurrentGemma has one lru_width and conv1d_width: a second rglru kind of another width is named."""
    cfg = parity.composed("model=recurrentgemma-2b", *parity.TINY, *SIZES)
    cfg.layers.kinds["wide"] = {"attention": {**cfg.layers.kinds["recurrent"]["attention"], "width": 96}}
    cfg.layers.pattern = ["recurrent", "wide", "attention"]
    problems = [p.field for p in FAMILIES["recurrent_gemma"].problems(cfg)]
    assert problems == ["model.layers.kinds.wide.attention.width"]


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_activation="gelu"), "RecurrentGemmaConfig.hidden_activation"),
        (dict(intermediate_size=95), "RecurrentGemmaConfig.intermediate_size"),
        (dict(block_types=["recurrent", "mlp"]), "RecurrentGemmaConfig.block_types"),
        (dict(lru_width=30), "RecurrentGemmaConfig.lru_width"),
        (dict(rope_parameters={"rope_type": "linear", "rope_theta": 100.0, "factor": 2.0}), "RecurrentGemmaConfig.rope_parameters.rope_type"),
    ],
)  # fmt: skip
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(transformers.RecurrentGemmaConfig(**{**SMALL, **changes}))
    assert err.value.field == field
