"""Hugging Face parity of Bamba (BambaForCausalLM): tiny random models with both layer kinds (every parameter
redrawn: biases, norm scales, A_log, dt_bias, D and the convolution's bias 0.5 + N(0, 0.3²)) give the same
float32 logits in archlab and in transformers' torch path, with GQA attention layers (RoPE on half of each
head), 2 groups of B and C, with every bias and a tied head, and with a time-step clamp; greedy and
left-padded decoding equal HF ``generate``; archlab -> HF -> archlab gives back every tensor bit for bit;
``BambaConfig()``'s defaults read into the ``bamba-9b`` preset.

HF's Mamba layers zero a padded position's input before ``in_proj``, as Mamba2ForCausalLM's: with
``mamba_proj_bias`` the projection's bias reaches the convolution of the tokens after the padding and HF's
padded row differs from the prompt alone, while archlab's (zeroed convolution inputs, dt = 0) computes what
the prompt alone does. Its one-token decoding step ignores ``time_step_limit``, as Mamba2ForCausalLM's does:
archlab's decoding equals HF's full forward there."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS, TOL, V, logits, max_diff
from helpers.published import PUBLISHED

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.config.layers import layer_kind
from archlab.generate import generate
from archlab.interop.hf import FAMILIES, config_from_hf, config_to_hf, from_hf, hf_family

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# 3 layers, attention at 1 (4 heads of 16, 2 KV heads); Mamba-2: 8 heads of 16 (expand 2), 2 groups of B and
# C of 8, conv 4, chunks of 5 (12 positions: two chunks and part of one)
SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4)
SMALL |= dict(num_key_value_heads=2, max_position_embeddings=64, attn_layer_indices=[1], mamba_n_heads=8)
SMALL |= dict(mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=5, **NO_TOKENS)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "bamba-gqa": ("BambaForCausalLM", "BambaConfig", SMALL),
    "bamba-biases-tied": (
        "BambaForCausalLM",
        "BambaConfig",
        dict(SMALL, num_hidden_layers=4, attn_layer_indices=[0, 2], mamba_n_groups=1, mamba_proj_bias=True)
        | dict(mamba_conv_bias=False, attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    ),
    "bamba-dt-limit": (
        "BambaForCausalLM",
        "BambaConfig",
        dict(SMALL, mamba_n_groups=4, time_step_limit=(0.2, 1.5), rope_parameters={"rope_theta": 500.0}),
    ),
}
TINY = ["model.n_layer=4", "model.d_model=64", "model.attention.n_head=4", "model.attention.n_kv_head=2"]
TINY += ["model.vocab_size=96", "model.context_length=64", "model.mlp.d_ff=96", "+model.layers.kinds.attention={}"]
TINY += ["model.layers.first=[mamba2,attention]", "model.layers.kinds.mamba2.attention.n_head=8"]
TINY += ["model.layers.kinds.mamba2.attention.state_size=8", "model.layers.kinds.mamba2.attention.groups=2"]
TINY += ["model.layers.kinds.mamba2.attention.scan_chunk=5"]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_back_bit_for_bit(case):
    """The logits (measured: 1.3e-6 to 2.7e-6), the family the layout read maps back to, and HF -> archlab ->
    HF -> archlab with the same config and every tensor bit for bit."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == "bamba"
    parity.check_back_and_again(hf, model, **ATTN)


def test_from_hf_reads_the_parts():
    cfgs = {case: from_hf(hf_model(case)).cfg for case in HF_CASES}
    gqa = cfgs["bamba-gqa"]
    assert (gqa.layers.first, gqa.layers.pattern) == ([], ["mamba2", "attention"])
    assert gqa.layers.kinds == {
        "mamba2": {
            "attention": {
                "kind": "mamba2", "n_head": 8, "state_size": 8, "groups": 2, "conv_kernel": 4, "conv_bias": True,
                "scan_chunk": 5,
            }
        },
        "attention": {},
    }  # fmt: skip
    a, p = gqa.attention, gqa.position
    assert (a.kind, a.n_head, a.n_kv_head, a.head_dim, a.qkv_bias) == ("causal", 4, 2, None, False)
    assert (p.kind, p.rotary_fraction, p.pairing, p.theta) == ("rope", 0.5, "half", 10000.0)
    assert (gqa.mlp.kind, gqa.mlp.d_ff, gqa.mlp.bias, gqa.head.tied) == ("swiglu", 96, False, False)
    biased = cfgs["bamba-biases-tied"]
    assert (biased.layers.first, biased.layers.pattern) == ([], ["attention", "mamba2"])
    mamba = biased.layers.kinds["mamba2"]["attention"]
    assert (mamba["qkv_bias"], mamba["out_bias"], mamba["conv_bias"], mamba["groups"]) == (True, True, False, 1)
    assert (biased.attention.qkv_bias, biased.attention.out_bias, biased.mlp.bias, biased.head.tied) == (True,) * 4
    limit = cfgs["bamba-dt-limit"]
    assert (limit.layers.kinds["mamba2"]["attention"]["dt_limit_min"], limit.position.theta) == (0.2, 500.0)
    assert limit.layers.kinds["mamba2"]["attention"]["dt_limit_max"] == 1.5


@pytest.mark.parametrize("case", ["bamba-gqa", "bamba-biases-tied"])
def test_greedy_generation_equals_hf(case):
    parity.check_greedy_generation(hf_model(case))


def test_left_padded_generation_equals_hf():
    """Prompts of 7, 3 and 5 tokens left-padded into one batch, without Mamba projection biases (HF's padding,
    zeroed inputs, is then archlab's, zeroed convolution inputs): the attention layer's RoPE counts from each
    row's first token in both."""
    parity.check_padded_generation(hf_model("bamba-gqa"))


def test_decoding_with_a_time_step_clamp_equals_hfs_full_forward_not_its_decoding():
    """With ``time_step_limit`` transformers clamps dt in its chunked forward but not in its one-token step
    (as Mamba2ForCausalLM's): archlab's logits through its cache equal HF's full forward at every step, while
    HF's own cached decoding does not (measured: 0.56 away)."""
    parity.check_decoding_equals_hfs_full_forward_not_its_decoding(hf_model("bamba-dt-limit"))


def test_left_padding_with_projection_biases_computes_each_prompt_as_alone():
    """With ``mamba_proj_bias`` HF's zeroed padded inputs still carry in_proj's bias into the convolution of
    the next tokens, so its padded row differs from the prompt alone; archlab's padded row gives the logits
    of the prompt alone and generates what HF generates for it."""
    hf = hf_model("bamba-biases-tied")
    model = from_hf(hf)
    short = torch.randint(0, V, (1, 3), generator=torch.Generator().manual_seed(3))
    long = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(7))
    batch = torch.cat((torch.cat((torch.zeros(1, 4, dtype=torch.long), short), 1), long))
    mask = torch.tensor([[0] * 4 + [1] * 3, [1] * 7])
    alone = hf.generate(short, attention_mask=torch.ones_like(short), max_new_tokens=8, do_sample=False)
    together = generate(model, batch, 8, attention_mask=mask)
    assert torch.equal(together[0, 4:], alone[0])
    with torch.no_grad():
        assert max_diff(hf(batch, attention_mask=mask).logits[0, 4:], hf(short).logits[0]) > 1e-3
        assert max_diff(model(batch, attention_mask=mask)[0, 4:], hf(short).logits[0]) <= TOL


def test_an_archlab_layout_converts_to_hf_and_back(tmp_path):
    """The bamba-9b preset shrunk (4 layers, attention at 1 by a kind in ``first``, every weight random) to
    BambaForCausalLM with the same logits and back bit for bit with the same config; a save_pretrained
    directory read by load_hf_dir and written back."""
    model = parity.randomize(build_model(compose_model(["model=bamba-9b", *TINY])), 2)
    hf, back = parity.check_to_hf_and_back(model, "BambaForCausalLM", attn_implementation="eager")
    c = hf.config
    assert (c.attn_layer_indices, c.mamba_n_heads, c.mamba_d_head, c.mamba_expand) == ([1], 8, 16, 2)
    assert (c.mamba_n_groups, c.mamba_d_state, c.mamba_chunk_size, c.num_key_value_heads) == (2, 8, 5, 2)
    assert [layer_kind(back.cfg, i) for i in range(4)] == ["mamba2", "attention", "mamba2", "mamba2"]
    assert count_params(back.cfg) == count_params(model.cfg)
    parity.check_directory_round_trip(hf, tmp_path, attn_implementation="eager")


def test_bamba_config_defaults_read_into_the_preset():
    """transformers' ``BambaConfig()`` reads into ``bamba-9b`` field for field and writes back the same
    sizes; the count is the published one."""
    default = transformers.BambaConfig()
    cfg = config_from_hf(default)
    assert cfg == compose_model(["model=bamba-9b"])
    assert count_params(cfg)["total"] == PUBLISHED["bamba-9b"]
    back = config_to_hf(cfg)
    for key in ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_chunk_size", "hidden_size"):
        assert getattr(back, key) == getattr(default, key), key
    assert (back.attn_layer_indices, back.rope_parameters) == (None, default.rope_parameters)


def test_attention_at_given_indices_is_a_layout_of_first_and_pattern():
    """attn_layer_indices [9, 18, 27] of 32 layers: the shortest layout, and back."""
    cfg = config_from_hf(transformers.BambaConfig(attn_layer_indices=[9, 18, 27]))
    assert cfg.layers.first == ["mamba2"] and cfg.layers.pattern == ["mamba2"] * 8 + ["attention"]
    assert config_to_hf(cfg).attn_layer_indices == [9, 18, 27]


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.position.rotary_fraction=1.0"], "model.position.rotary_fraction"),
        (["model/mlp=gelu"], "model.mlp.kind"),
        (["model.attention.out_bias=true"], "model.attention.out_bias"),
        (["model.attention.head_dim=8"], "model.attention.head_dim"),
        (["+model.layers.kinds.mamba2.attention.out_bias=true"], "model.layers.kinds.mamba2.attention.out_bias"),
        (["+model.layers.kinds.mamba2.attention.head_dim=12"], "model.layers.kinds.mamba2.attention.head_dim"),
        (["+model.layers.kinds.mamba2.attention.dt_min=0.01"], "model.layers.kinds.mamba2.attention.dt_min"),
        (["+model.layers.kinds.attention.attention={window: 4}"], "model.layers.kinds.attention.attention.window"),
        (["+model.layers.kinds.mamba2.mlp={d_ff: 32}"], "model.layers.kinds.mamba2.mlp.d_ff"),
        (["model.layers.first=[attention]", "model.layers.pattern=[attention]"], "model.layers.pattern"),
    ],
)
def test_the_record_refuses_what_bamba_does_not_hold(overrides, field):
    cfg = compose_model(["model=bamba-9b", *TINY, *overrides])
    assert field in {p.field for p in FAMILIES["bamba"].problems(cfg)}


def test_two_mamba_kinds_of_different_sizes_are_refused():
    """Bamba has one set of Mamba-2 sizes: a second mamba2 kind whose state differs is named by its field."""
    cfg = compose_model(["model=bamba-9b", *TINY])
    cfg.layers.kinds["wide"] = {"attention": {**cfg.layers.kinds["mamba2"]["attention"], "state_size": 16}}
    cfg.layers.pattern = ["wide"]
    assert [p.field for p in FAMILIES["bamba"].problems(cfg)] == ["model.layers.kinds.wide.attention.state_size"]


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_act="gelu"), "BambaConfig.hidden_act"),
        (dict(attn_layer_indices=[1, 3]), "BambaConfig.attn_layer_indices"),
        (dict(rope_parameters={"rope_type": "linear", "rope_theta": 100.0, "factor": 2.0}), "BambaConfig.rope_parameters.rope_type"),
    ],
)  # fmt: skip
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(transformers.BambaConfig(**{**SMALL, **changes}))
    assert err.value.field == field
