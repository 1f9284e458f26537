"""Hugging Face parity of Mamba-2 (Mamba2ForCausalLM): tiny random models (every parameter redrawn: biases,
norm scales, A_log, dt_bias and D 0.5 + N(0, 0.3²)) give the same float32 logits in archlab and in
transformers' torch path, with 2 groups of B and C, with projection biases and a tied head, and with a
time-step clamp; greedy and left-padded decoding equal HF ``generate``; archlab -> HF -> archlab gives back
every tensor bit for bit; ``Mamba2Config()``'s defaults read into the ``mamba-codestral-7b`` preset.

Two places where transformers' own paths disagree, and archlab follows its full forward: its one-token
decoding step ignores ``time_step_limit`` (the chunked forward clamps dt, the step does not), and it zeroes a
padded position's input before ``in_proj``, so with ``use_bias`` the projection's bias reaches the
convolution of the tokens after the padding (archlab zeroes the convolution's inputs: a padded row computes
what it computes alone)."""

import dataclasses

import pytest
import torch
from helpers import hf as parity
from helpers.hf import NO_TOKENS, TOL, V, logits, max_diff, randomize
from helpers.parts import tiny

from archlab import ConfigError, build_model, compose_model
from archlab.generate import generate
from archlab.interop.hf import FAMILIES, config_from_hf, from_hf, hf_family

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# 8 heads of 16 (expand 2), B and C of 8, conv 4, chunks of 5 (12 positions: two chunks and part of one)
SMALL = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, expand=2, state_size=8)
SMALL |= dict(conv_kernel=4, chunk_size=5, **NO_TOKENS)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "mamba2-groups": ("Mamba2ForCausalLM", "Mamba2Config", dict(SMALL, n_groups=2)),
    "mamba2-biases-tied": (
        "Mamba2ForCausalLM",
        "Mamba2Config",
        dict(SMALL, n_groups=1, use_bias=True, use_conv_bias=False, tie_word_embeddings=True),
    ),
    "mamba2-dt-limit": ("Mamba2ForCausalLM", "Mamba2Config", dict(SMALL, n_groups=4, time_step_limit=(0.2, 1.5))),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_back_bit_for_bit(case):
    """The logits (measured: at most 1.2e-6), the family the layout read maps back to, and HF -> archlab ->
    HF -> archlab with the same config and every tensor bit for bit."""
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == "mamba2"
    parity.check_back_and_again(hf, model)


def test_from_hf_reads_the_parts():
    cfgs = {case: from_hf(hf_model(case)).cfg for case in HF_CASES}
    a = cfgs["mamba2-groups"].attention
    assert (a.kind, a.n_head, a.head_dim, a.state_size, a.groups, a.conv_kernel, a.scan_chunk) == (
        "mamba2", 8, 16, 8, 2, 4, 5,
    )  # fmt: skip
    assert (a.qkv_bias, a.out_bias, a.conv_bias, a.dt_limit_min, a.dt_limit_max) == (False, False, True, 0.0, None)
    biased = cfgs["mamba2-biases-tied"]
    assert (biased.attention.qkv_bias, biased.attention.conv_bias, biased.head.tied) == (True, False, True)
    limit = cfgs["mamba2-dt-limit"].attention
    assert (limit.groups, limit.dt_limit_min, limit.dt_limit_max) == (4, 0.2, 1.5)
    for cfg in cfgs.values():
        assert (cfg.mlp.kind, cfg.position.kind, cfg.block.kind, cfg.norm.kind) == ("none", "none", "pre", "rmsnorm")


@pytest.mark.parametrize("case", ["mamba2-groups", "mamba2-biases-tied"])
def test_greedy_generation_equals_hf(case):
    parity.check_greedy_generation(hf_model(case))


def test_left_padded_generation_equals_hf():
    """Prompts of 7, 3 and 5 tokens left-padded into one batch, without projection biases (HF's padding,
    zeroed inputs, is then archlab's, zeroed convolution inputs)."""
    parity.check_padded_generation(hf_model("mamba2-groups"))


def test_decoding_with_a_time_step_clamp_equals_hfs_full_forward_not_its_decoding():
    """With ``time_step_limit`` transformers clamps dt in its chunked forward but not in its one-token step:
    archlab's logits through its cache equal HF's full forward of the same sequence at every step, while
    HF's own cached decoding does not (it moves by far more than the tolerance)."""
    parity.check_decoding_equals_hfs_full_forward_not_its_decoding(hf_model("mamba2-dt-limit"))


def test_left_padding_with_projection_biases_computes_each_prompt_as_alone():
    """With ``use_bias`` HF's zeroed padded inputs still carry in_proj's bias into the convolution of the
    next tokens, so its padded row differs from the prompt alone; archlab's padded row generates what HF
    generates for the prompt alone."""
    hf = hf_model("mamba2-biases-tied")
    model = from_hf(hf)
    short = torch.randint(0, V, (1, 3), generator=torch.Generator().manual_seed(3))
    long = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(7))
    batch = torch.cat((torch.cat((torch.zeros(1, 4, dtype=torch.long), short), 1), long))
    mask = torch.tensor([[0] * 4 + [1] * 3, [1] * 7])
    alone = hf.generate(short, attention_mask=torch.ones_like(short), max_new_tokens=8, do_sample=False)
    together = generate(model, batch, 8, attention_mask=mask)
    assert torch.equal(together[0, 4:], alone[0])
    with torch.no_grad():
        padded = hf(batch, attention_mask=mask).logits[0, 4:]
        assert max_diff(padded, hf(short).logits[0]) > 1e-3
        assert max_diff(model(batch, attention_mask=mask)[0, 4:], hf(short).logits[0]) <= TOL


def test_an_archlab_layout_converts_to_hf_and_back(tmp_path):
    """A tiny archlab model (4 heads of 16, expand 2, 2 groups, every weight random) to Mamba2ForCausalLM
    with the same logits and back bit for bit; a save_pretrained directory round trip."""
    attention = {"kind": "mamba2", "n_head": 4, "head_dim": 16, "state_size": 8, "groups": 2}
    attention |= {"qkv_bias": False, "out_bias": False, "scan_chunk": 5}
    cfg = tiny(vocab_size=V, attention=attention, mlp={"kind": "none"}, norm={"eps": 1e-5}, head={"tied": False})
    model = randomize(build_model(cfg), 2)
    hf, _ = parity.check_to_hf_and_back(model, "Mamba2ForCausalLM")
    assert (hf.config.expand, hf.config.n_groups, hf.config.use_bias) == (2, 2, False)
    parity.check_directory_round_trip(hf, tmp_path)


def test_mamba2_config_defaults_read_into_the_preset():
    """transformers' ``Mamba2Config()`` reads into ``mamba-codestral-7b`` field for field but the context,
    which the HF config does not hold (the preset's 262144)."""
    read = config_from_hf(transformers.Mamba2Config())
    assert dataclasses.replace(read, context_length=262144) == compose_model(["model=mamba-codestral-7b"])


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model/mlp=gelu"], "model.mlp.kind"),
        (["model.attention.out_bias=true"], "model.attention.out_bias"),
        (["model.attention.head_dim=40"], "model.attention.head_dim"),
        (["model/position=rope"], "model.position.kind"),
        (["model/block=parallel"], "model.block.kind"),
        (["model/norm=layernorm"], "model.norm.kind"),
    ],
)
def test_the_record_refuses_what_mamba2_does_not_hold(overrides, field):
    cfg = compose_model(["model=mamba-codestral-7b", "model.n_layer=2", *overrides])
    with pytest.raises(ConfigError) as error:
        FAMILIES["mamba2"].check(cfg)
    assert error.value.field == field


def test_every_other_family_refuses_a_mamba2_layout_and_mamba2_an_attention_one():
    mamba = compose_model(["model=mamba-codestral-7b", "model.n_layer=2"])
    others = {
        name for name, family in FAMILIES.items() if "model.attention.kind" in {p.field for p in family.problems(mamba)}
    }
    assert others == set(FAMILIES) - {"mamba2", "zamba2"}
    # Zamba2's layers are Mamba-2's too: it refuses a model without its shared blocks
    assert "model.layers.shared.layers" in {p.field for p in FAMILIES["zamba2"].problems(mamba)}
    llama = compose_model(["model=llama2-7b", "model.n_layer=2"])
    assert "model.attention.kind" in {p.field for p in FAMILIES["mamba2"].problems(llama)}


def test_a_config_with_another_activation_is_refused():
    with pytest.raises(ConfigError) as error:
        config_from_hf(transformers.Mamba2Config(**SMALL, hidden_act="gelu"))
    assert error.value.field == "Mamba2Config.hidden_act"


@pytest.mark.parametrize("preset", ["llama2-7b", "gpt2", "qwen3-30b-a3b"])
def test_every_family_but_mamba2_refuses_a_model_without_mlps(preset):
    """``mlp.kind: none`` on a dense, a learned-position and a MoE layout: each family of the layout's mixer
    names model.mlp.kind (a family of another mixer names the mixer alone); the same layout with Mamba-2 in
    every layer is one mamba2 holds as far as its MLP goes."""
    cfg = compose_model([f"model={preset}", "model.n_layer=2", "model/mlp=none"])
    same_mixer = [f for f in FAMILIES.values() if not f.mixer_problems(cfg)]
    assert same_mixer and all("model.mlp.kind" in {p.field for p in f.problems(cfg)} for f in same_mixer)
    assert FAMILIES["mamba2"].mixer_problems(cfg)
    mamba = compose_model([f"model={preset}", "model.n_layer=2", "model/mlp=none", "model/attention=mamba2"])
    assert "model.mlp.kind" not in {p.field for p in FAMILIES["mamba2"].problems(mamba)}
