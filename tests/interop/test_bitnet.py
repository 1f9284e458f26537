"""Hugging Face parity of BitNet b1.58 (archlab/interop/families/bitnet.py): LLaMA's layout with an RMSNorm
on the heads' output before ``o_proj`` (``attention.sub_norm``) and on the gated MLP's hidden activations
before ``down_proj`` (``mlp.sub_norm``), the gate through the squared ReLU (``mlp.kind: relu2_glu``).

Tiny random models (GQA; every parameter redrawn, the sub-norms' scales among them) give the same float32
logits in archlab and in transformers' eager attention; greedy decoding (a left-padded batch too) equals HF
``generate``; archlab -> HF -> archlab gives back every tensor bit for bit; a save_pretrained directory
loads; what the family cannot hold is refused both ways, naming the field.

Quantised (``quantization_config``, ``model.linear.kind: bitlinear``): a save_pretrained-style directory the
test writes, every projection packed four to a uint8 by transformers' ``pack_weights`` with a random
``weight_scale`` (BitLinear, offline) or held full precision (AutoBitLinear, online), gives the logits and
the greedy and left-padded generations of transformers' quantised model loaded from it, and is written back
bit for bit."""

import json

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS
from safetensors.torch import load_file, save_file

from archlab import build_model, compose_model, count_params
from archlab.interop.hf import archlab_state_to_hf, config_from_hf, from_hf, load_hf_dir, save_hf_dir, to_hf
from archlab.nn.bitlinear import BitLinear

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


QUANTISED = {
    "offline": dict(quant_method="bitnet", linear_class="bitlinear", quantization_mode="offline"),
    "online": dict(quant_method="bitnet", linear_class="autobitlinear", quantization_mode="online"),
}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantised_dir(path, weights: str):
    """A tiny quantised BitNet's directory: config.json with its quantization_config; model.safetensors with
    every tensor random (norm scales far from 1) and, offline, each projection's weight ternarised from its
    draw by the paper's absmean rule, packed by transformers' pack_weights, with a random weight_scale."""
    from transformers.integrations.bitnet import pack_weights

    hf = hf_model("bitnet-relu2", seed=7)
    state, g = {k: v.clone() for k, v in hf.state_dict().items()}, torch.Generator().manual_seed(8)
    if weights == "offline":
        for name in [k for k in state if k.removesuffix(".weight").endswith(PROJECTIONS)]:
            w = state[name]
            state[name] = pack_weights((w / w.abs().mean()).round().clamp(-1, 1))
            state[name.removesuffix("weight") + "weight_scale"] = torch.rand(1, generator=g) * 20 + 0.5
    hf.config.quantization_config = QUANTISED[weights]
    hf.config.save_pretrained(path)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def hf_quantised(path):
    """transformers' BitNetForCausalLM as from_pretrained quantises it (BitLinear or AutoBitLinear layers)."""
    return transformers.BitNetForCausalLM.from_pretrained(path, dtype=torch.float32, **EAGER).eval()


@pytest.mark.usefixtures("eager_bitnet")  # transformers' quantisers uncompiled
@pytest.mark.parametrize("weights", ["offline", "online"])
def test_a_quantised_checkpoint_reads_as_transformers_and_writes_back_bit_for_bit(tmp_path, weights):
    path = quantised_dir(tmp_path / "hf", weights)
    hf, model = hf_quantised(path), load_hf_dir(path).eval()
    layers = {type(m).__name__ for m in hf.modules() if "BitLinear" in type(m).__name__}
    assert layers == {"BitLinear" if weights == "offline" else "AutoBitLinear"}
    assert (model.cfg.linear.kind, model.cfg.linear.weights) == ("bitlinear", weights)
    assert sum(isinstance(m, BitLinear) for m in model.modules()) == 4 * 2  # qkv, proj, gate_up, down per layer
    assert parity.max_diff(parity.logits(hf), parity.logits(model)) <= parity.TOL
    parity.assert_same_tensors(model, from_hf(hf))
    parity.check_generation(hf, model)
    stored = load_file(str(path / "model.safetensors"))
    written = archlab_state_to_hf(model.cfg, model.state_dict())
    assert written.keys() == stored.keys()
    assert all(written[k].dtype == stored[k].dtype and torch.equal(written[k], stored[k]) for k in stored)
    save_hf_dir(model, tmp_path / "again")
    again = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert again.keys() == stored.keys() and all(torch.equal(again[k], stored[k]) for k in stored)
    config = json.loads((tmp_path / "again" / "config.json").read_text())["quantization_config"]
    assert {k: config[k] for k in QUANTISED[weights]} == QUANTISED[weights]
    assert parity.max_diff(parity.logits(hf), parity.logits(hf_quantised(tmp_path / "again"))) <= parity.TOL


def test_quantised_counts_are_the_latent_weights():
    """BitLinear's parameters are the dense model's: the closed form = transformers' count of the dense class."""
    dense = hf_model("bitnet-relu2")
    cfg = config_from_hf(parity.hf_config(HF_CASES, "bitnet-relu2", quantization_config=QUANTISED["offline"]))
    assert count_params(cfg)["total"] == sum(p.numel() for p in dense.parameters())


@pytest.mark.usefixtures("eager_bitnet")  # transformers' quantisers uncompiled
@pytest.mark.parametrize("weights", ["offline", "online"])
def test_a_bitlinear_layout_exports_as_quantised_bitnet(weights):
    overrides = [*parity.LLAMA, "model/mlp=relu2_glu", "model.mlp.d_ff=96", "model.mlp.bias=false"]
    overrides += ["model.mlp.sub_norm=true", "model.attention.sub_norm=true", "model.linear.kind=bitlinear"]
    model = parity.randomize(build_model(compose_model([*overrides, f"model.linear.weights={weights}"])), 3)
    if weights == "offline":  # randomize drew the weight scales as vectors and the weights as matrices
        for m in model.modules():
            if isinstance(m, BitLinear):
                m.ternarise_()
    hf, _ = parity.check_to_hf_and_back(model, "BitNetForCausalLM", attn_implementation="eager")
    assert hf.config.quantization_config["quantization_mode"] == weights


@pytest.mark.slow  # transformers' quantisers compiled, as it runs them in bf16: 10-40 s each on a cold cache
def test_a_bf16_quantised_model_exports_in_bf16(tmp_path):
    """to_hf of a bf16 packed model gives transformers' BitLinear layers unpacking to bf16 (the dtype the model
    moved to, not the one it was built in): each gives the output of its layer in transformers' bf16 model of
    the same directory, bit for bit (the whole models differ as their RoPE tables do: built in float32, cast)."""
    path = quantised_dir(tmp_path / "hf", "offline")
    exported = to_hf(load_hf_dir(path, dtype=torch.bfloat16), **EAGER).eval()
    hf = transformers.BitNetForCausalLM.from_pretrained(path, dtype=torch.bfloat16, **EAGER).eval()
    layers = {n: m for n, m in hf.named_modules() if type(m).__name__ == "BitLinear"}
    assert len(layers) == 7 * 2
    with torch.no_grad():
        for name, layer in layers.items():
            x = torch.randn(2, 5, layer.in_features, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
            out = exported.get_submodule(name)(x)
            assert out.dtype == torch.bfloat16 and torch.equal(out, layer(x))


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(quant_method="gptq"), "quant_method"),
        (dict(linear_class="autobitlinear"), "quantization_mode"),  # AutoBitLinear offline
        (dict(quantization_mode="online"), "quantization_mode"),  # BitLinear is offline whatever the mode
        (dict(use_rms_norm=True), "use_rms_norm"),
        (dict(modules_to_not_convert=["lm_head", "model.layers.0.mlp"]), "modules_to_not_convert"),
        (dict(bits=2), "bits"),
    ],
)
def test_config_from_hf_refuses_quantisation_it_does_not_hold(change, field):
    c = parity.hf_config(HF_CASES, "bitnet-relu2", quantization_config={**QUANTISED["offline"], **change})
    parity.check_refuses(lambda: config_from_hf(c), f"BitNetConfig.quantization_config.{field}")


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
