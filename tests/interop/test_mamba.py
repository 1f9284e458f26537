"""Hugging Face parity of Mamba (MambaForCausalLM) and FalconMamba (FalconMambaForCausalLM), archlab's
``mamba`` mixer (archlab/interop/families/mamba1.py): tiny random models (every parameter redrawn: biases,
A_log, D and dt_proj's bias 0.5 + N(0, 0.3²)) give the same float32 logits in archlab and in transformers'
torch path, with projection biases and a tied head, and FalconMamba's normed B, C and Δ; greedy and
left-padded decoding equal HF ``generate``; HF -> archlab -> HF -> archlab gives back every tensor bit for
bit, and a save_pretrained directory round trips; an archlab layout converts to HF; the refusals."""

import pytest
from helpers import hf as parity
from helpers.hf import NO_TOKENS, V, randomize
from helpers.parts import tiny

from archlab import build_model
from archlab.interop.hf import FAMILIES, config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# width 32, inner 64 (expand 2), state 8, Δ of rank 2 (ceil(32/16), transformers' "auto"), conv 4
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4, **NO_TOKENS)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "mamba": ("MambaForCausalLM", "MambaConfig", dict(SMALL, tie_word_embeddings=False)),
    "mamba-biases-tied": ("MambaForCausalLM", "MambaConfig", dict(SMALL, use_bias=True, time_step_rank=3)),
    "falcon_mamba": ("FalconMambaForCausalLM", "FalconMambaConfig", dict(SMALL, mixer_rms_eps=1e-5)),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_family_gives_hf_logits_and_round_trips(case, tmp_path):
    parity.check_converts_both_ways(hf_model(case), tmp_path)


def test_from_hf_reads_the_parts():
    a = config_from_hf(hf_model("mamba-biases-tied").config).attention
    assert (a.kind, a.inner, a.state_size, a.dt_rank, a.conv_kernel, a.bias, a.bc_dt_norm) == (
        "mamba", None, 8, 3, 4, True, False,
    )  # fmt: skip
    falcon = config_from_hf(hf_model("falcon_mamba").config)
    assert (falcon.attention.bc_dt_norm, falcon.attention.bc_dt_norm_eps, falcon.attention.dt_rank) == (
        True,
        1e-5,
        None,
    )
    assert (falcon.mlp.kind, falcon.position.kind, falcon.norm.kind, falcon.head.tied) == (
        "none",
        "none",
        "rmsnorm",
        True,
    )


@pytest.mark.parametrize("case", ["mamba", "falcon_mamba"])
def test_greedy_generation_equals_hf(case):
    parity.check_greedy_generation(hf_model(case))


@pytest.mark.parametrize("case", ["mamba", "falcon_mamba"])
def test_left_padded_generation_equals_hf(case):
    """Prompts of 7, 3 and 5 tokens left-padded into one batch, without projection biases (HF's padding,
    zeroed inputs, is then archlab's, zeroed convolution inputs)."""
    parity.check_padded_generation(hf_model(case))


def test_an_archlab_layout_converts_to_hf_and_back():
    attention = {"kind": "mamba", "inner": 64, "state_size": 8, "dt_rank": 5, "bc_dt_norm": True}
    cfg = tiny(vocab_size=V, attention=attention, mlp={"kind": "none"}, norm={"eps": 1e-5}, head={"tied": False})
    model = randomize(build_model(cfg), 2)
    hf, _ = parity.check_to_hf_and_back(model, "FalconMambaForCausalLM")
    assert (hf.config.expand, hf.config.time_step_rank, hf.config.mixer_rms_eps) == (2, 5, 1e-6)


@pytest.mark.parametrize(
    ("family", "changes", "field"),
    [
        ("mamba", dict(mlp={"kind": "gelu"}), "model.mlp.kind"),
        ("mamba", dict(attention={"bc_dt_norm": True}), "model.attention.bc_dt_norm"),
        ("falcon_mamba", dict(attention={"bc_dt_norm": False}), "model.attention.bc_dt_norm"),
        ("falcon_mamba", dict(attention={"bc_dt_norm_scale": True}), "model.attention.bc_dt_norm_scale"),
        ("mamba", dict(attention={"inner": 40}), "model.attention.inner"),  # expand 1.25
        ("mamba", dict(position={"kind": "rope"}), "model.position.kind"),
    ],
)
def test_the_records_refuse_what_they_do_not_hold(family, changes, field):
    attention = {"kind": "mamba", "state_size": 8, "bc_dt_norm": family == "falcon_mamba"}
    base = dict(vocab_size=V, attention=attention, mlp={"kind": "none"}, norm={"eps": 1e-5})
    assert not FAMILIES[family].problems(tiny(**base))
    merged = {k: ({**base.get(k, {}), **v} if isinstance(v, dict) else v) for k, v in changes.items()}
    assert field in {p.field for p in FAMILIES[family].problems(tiny(**{**base, **merged}))}
