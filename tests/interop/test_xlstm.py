"""Hugging Face parity of xLSTM (xLSTMForCausalLM), archlab's ``mlstm`` mixer with a SwiGLU feedforward
(archlab/interop/families/xlstm.py): tiny random models (every parameter redrawn: gate biases, norm scales far
from 1, the gates' weights scaled so the soft cap bends them) give the same float32 logits in archlab and in
transformers' native torch kernels (chunks of 4: its chunkwise and recurrent kernels both run), soft caps
of 15 and 30 and of 2.5 and 3 (bending most values); its tie_word_embeddings, which ties nothing; greedy decoding equals HF ``generate``; HF -> archlab -> HF -> archlab gives
back every tensor bit for bit, and a save_pretrained directory round trips; the refusals; ``xLSTMConfig()``'s
defaults read into the ``xlstm-7b`` preset."""

import dataclasses

import pytest
import torch
from helpers import hf as parity
from helpers.hf import NO_TOKENS, V
from helpers.published import PUBLISHED

from archlab import compose_model, count_params
from archlab.errors import ConfigError
from archlab.interop.hf import FAMILIES, config_from_hf, config_to_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# width 128, 4 heads of 16 query/key and 32 value dims (qk 64 and v 128 wide: multiples of 64, as xLSTMCache's
# rounded sizes need), feedforward round_up(128·1.5, 64) = 192, chunks of 4
SMALL = dict(vocab_size=V, hidden_size=128, num_hidden_layers=2, num_heads=4, chunk_size=4, ffn_proj_factor=1.5)
SMALL |= dict(norm_eps=1e-5, **NO_TOKENS)
TIGHT = dict(gate_soft_cap=2.5, output_logit_soft_cap=3.0)  # caps that bend most values
HF_CASES = {
    "xlstm": ("xLSTMForCausalLM", "xLSTMConfig", SMALL),
    "tight-caps": ("xLSTMForCausalLM", "xLSTMConfig", SMALL | TIGHT),
}


def hf_model(case: str, seed: int = 1):
    """The case's model, randomised, its gates' weights ×10 (random 0.3-scale weights keep the gates small)."""
    hf = parity.hf_case(HF_CASES, case, seed)
    with torch.no_grad():
        for block in hf.backbone.blocks:
            for gate in (block.mlstm_layer.igate_preact, block.mlstm_layer.fgate_preact):
                gate.weight.mul_(10)
    return hf


@pytest.mark.parametrize("case", list(HF_CASES))
def test_family_gives_hf_logits_and_round_trips(case, tmp_path):
    parity.check_converts_both_ways(hf_model(case), tmp_path)


def test_from_hf_reads_the_parts():
    cfg = config_from_hf(hf_model("xlstm").config)
    a = cfg.attention
    assert (a.kind, a.n_head, a.head_dim, a.qk_head_dim, a.bias, a.gate_soft_cap, a.eps, a.scan_chunk) == (
        "mlstm", 4, None, None, False, 15.0, 1e-6, 4,
    )  # fmt: skip
    assert (cfg.mlp.kind, cfg.mlp.d_ff, cfg.head.softcap, cfg.head.tied, cfg.norm.eps) == (
        "swiglu",
        192,
        30.0,
        False,
        1e-5,
    )


def test_tie_word_embeddings_ties_nothing_in_transformers_nor_here():
    """xLSTMForCausalLM declares no tied weights: with tie_word_embeddings its lm_head stays its own (random
    here), so archlab reads an untied head and gives HF's logits; it writes tie_word_embeddings false."""
    hf = parity.hf_case({"tied": ("xLSTMForCausalLM", "xLSTMConfig", SMALL | dict(tie_word_embeddings=True))}, "tied")
    assert not torch.equal(hf.lm_head.weight, hf.backbone.embeddings.weight)
    model = parity.check_from_hf(hf)
    assert model.cfg.head.tied is False
    assert FAMILIES["xlstm"].to_hf(model.cfg)["tie_word_embeddings"] is False


def test_greedy_generation_equals_hf():
    parity.check_greedy_generation(hf_model("xlstm"))


@pytest.mark.parametrize(
    ("changes", "name"),
    [
        (dict(use_bias=True), "use_bias"),
        (dict(weight_mode="fused"), "weight_mode"),
        (dict(qk_dim_factor=0.25 + 1 / 128), "qk_dim_factor"),
    ],
)
def test_hf_configs_it_cannot_hold_are_refused_by_name(changes, name):
    c = transformers.xLSTMConfig(**(SMALL | changes))
    with pytest.raises(ConfigError) as error:
        config_from_hf(c)
    assert error.value.field == f"xLSTMConfig.{name}"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(mlp={"kind": "gelu"}), "model.mlp.kind"),
        (dict(attention={"bias": True}), "model.attention.bias"),
        (dict(norm={"kind": "layernorm"}), "model.norm.kind"),
        (dict(position={"kind": "rope"}), "model.position.kind"),
        (dict(attention={"gate_soft_cap": None}), "model.attention.gate_soft_cap"),  # xLSTMConfig's is a float
        (dict(head={"softcap": None}), "model.head.softcap"),
        (dict(head={"tied": True}), "model.head.tied"),
    ],
)
def test_the_record_refuses_what_it_does_not_hold(changes, field):
    from helpers.parts import tiny

    base = dict(vocab_size=V, attention={"kind": "mlstm", "n_head": 4}, mlp={"kind": "swiglu", "bias": False})
    base |= dict(position={"kind": "none"}, head={"softcap": 30.0, "tied": False})
    assert not FAMILIES["xlstm"].problems(tiny(**base))
    merged = {k: ({**base.get(k, {}), **v} if isinstance(v, dict) else v) for k, v in changes.items()}
    assert field in {p.field for p in FAMILIES["xlstm"].problems(tiny(**{**base, **merged}))}


def test_a_left_padded_prompt_gives_hf_logits_of_the_prompt_alone():
    """transformers' xLSTM ignores the attention mask (its pads enter the state: 0.43 apart here), so its
    left-padded ``generate`` is not compared; archlab's padded prompt (pads neither decay nor write) gives
    HF's logits of the prompt alone."""
    hf = hf_model("xlstm")
    model = parity.from_hf(hf)
    prompt = parity.IDS[:1, :5]
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompt], 1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 5, dtype=torch.long)], 1)
    with torch.no_grad():
        alone, hf_padded = hf(prompt).logits[0, -1], hf(padded, attention_mask=mask).logits[0, -1]
        ours = model(padded, None, mask)[0, -1].float()
    assert (alone - hf_padded).abs().max() > 0.1
    assert (ours - alone).abs().max() <= parity.TOL


def test_the_default_config_reads_into_the_xlstm_7b_preset():
    """transformers' ``xLSTMConfig()`` (its docstring's NX-AI/xLSTM-7b) reads into ``xlstm-7b`` field for field
    but the context (xLSTMConfig has none), counting what transformers' meta model holds, and the preset
    writes back its sizes."""
    read = config_from_hf(transformers.xLSTMConfig())
    preset = compose_model(["model=xlstm-7b"])
    assert dataclasses.replace(read, context_length=8192) == preset
    assert count_params(preset)["total"] == PUBLISHED["xlstm-7b"] == 6_865_424_896
    written = config_to_hf(preset)
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "qk_dim", "v_dim", "gate_soft_cap")
    default = transformers.xLSTMConfig()
    assert [getattr(written, k) for k in keys] == [getattr(default, k) for k in keys]
    assert round_up_ff(written) == round_up_ff(default) == 10944


def round_up_ff(c) -> int:
    """xLSTMFeedForward's width from a config, as transformers computes it."""
    from transformers.models.xlstm.configuration_xlstm import round_up_to_next_multiple_of

    return round_up_to_next_multiple_of(c.hidden_size * c.ffn_proj_factor, c.ffn_round_up_to_multiple_of)
