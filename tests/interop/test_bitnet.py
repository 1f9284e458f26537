"""Hugging Face parity of BitNet b1.58 (archlab/interop/families/bitnet.py): LLaMA's layout with an RMSNorm
on the heads' output before ``o_proj`` (``attention.sub_norm``) and on the gated MLP's hidden activations
before ``down_proj`` (``mlp.sub_norm``), the gate through the squared ReLU (``mlp.kind: relu2_glu``).

Tiny random models (GQA; every parameter redrawn, the sub-norms' scales among them) give the same float32
logits in archlab and in transformers' eager attention; greedy decoding (a left-padded batch too) equals HF
``generate``; archlab -> HF -> archlab gives back every tensor bit for bit; a save_pretrained directory
loads; what the family cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab import build_model, compose_model
from archlab.interop.hf import config_from_hf, from_hf, to_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS)
HF |= dict(intermediate_size=96)
CLASSES = ("BitNetForCausalLM", "BitNetConfig")
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "bitnet-relu2": (*CLASSES, HF),  # BitNetConfig's default activation
    "bitnet-silu-bias-tied": (*CLASSES, dict(HF, hidden_act="silu", attention_bias=True, tie_word_embeddings=True)),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, impl=EAGER, only=parity.MAPPED_TESTS))


def test_from_hf_reads_the_family_s_parts():
    cfg = from_hf(hf_model("bitnet-relu2")).cfg
    assert (cfg.mlp.kind, cfg.mlp.sub_norm, cfg.attention.sub_norm, cfg.mlp.bias) == ("relu2_glu", True, True, False)


def test_config_from_hf_refuses_quantized_weights():
    c = parity.hf_config(HF_CASES, "bitnet-relu2", quantization_config={"quant_method": "bitnet"})
    parity.check_refuses(lambda: config_from_hf(c), "BitNetConfig.quantization_config")


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(attention__sub_norm=False), "model.attention.sub_norm"),
        (dict(mlp__sub_norm=False), "model.mlp.sub_norm"),
        (dict(attention__head_dim=8), "model.attention.head_dim"),
        (dict(mlp__bias=True), "model.mlp.bias"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(from_hf(hf_model("bitnet-relu2")).cfg, **change)
    parity.check_family_refuses("bitnet", cfg, field)


def test_the_layout_picks_the_family():
    """LLaMA's layout with both sub-norms and a squared-ReLU gated MLP exports as BitNet."""
    overrides = [*parity.LLAMA, "model/mlp=relu2_glu", "model.mlp.d_ff=96", "model.mlp.bias=false"]
    overrides += ["model.mlp.sub_norm=true", "model.attention.sub_norm=true"]
    assert type(to_hf(build_model(compose_model(overrides)))).__name__ == "BitNetForCausalLM"
