"""How a dense layout finds its Hugging Face family (archlab/interop/families/dense.py's routing, which
``config_to_hf`` follows): each preset's own family, and the layouts between them (LLaMA plus q/k/v biases
is Qwen2, plus a window Mistral, plus a per-head QK-norm Qwen3); what the routing, or the family it picks
where that family's file has no place for it, refuses naming the field; a layout its family refuses that
another family holds exports there."""

import pytest

from archlab import ConfigError, compose_model
from archlab.interop.families.dense import dense_family
from archlab.interop.hf import FAMILIES, config_to_hf

FAMILY_OF = {
    "pythia-160m": "GPTNeoXConfig",
    "pythia-1.4b": "GPTNeoXConfig",
    "phi-1.5": "PhiConfig",
    "gptj-6b": "GPTJConfig",
    "llama3.1-8b": "LlamaConfig",
    "mistral-7b": "MistralConfig",
    "qwen2.5-7b": "Qwen2Config",
    "qwen3-8b": "Qwen3Config",
    "gemma-7b": "GemmaConfig",
    "gemma2-9b": "Gemma2Config",
    "olmo2-7b": "Olmo2Config",
}


@pytest.mark.parametrize(
    "overrides, config_class",
    [
        # each preset's own family
        *[([f"model={p}"], c) for p, c in FAMILY_OF.items()],
        # LLaMA plus biases on q/k/v only is Qwen2; plus a window on every layer, Mistral; plus per-head
        # QK-norm, Qwen3; a pre-norm LayerNorm with RoPE is GPT-NeoX without parallel residuals
        (["model=llama2-7b", "model.attention.qkv_bias=true"], "Qwen2Config"),
        (["model=llama2-7b", "model.attention.window=128"], "MistralConfig"),
        (["model=llama2-7b", "model.attention.qk_norm=head"], "Qwen3Config"),
        (["model=llama2-7b", "model.attention.qkv_bias=true", "model.attention.out_bias=true"], "LlamaConfig"),
        (["model=pythia-160m", "model/block=pre"], "GPTNeoXConfig"),
        (["model=qwen2-0.5b", "model.attention.window=128", "model/layers=every_other_global"], "Qwen2Config"),
    ],
)
def test_the_layout_picks_the_family(overrides, config_class):
    assert type(config_to_hf(compose_model(overrides))).__name__ == config_class


@pytest.mark.parametrize(
    "overrides, field",
    [
        # GPT-J (its parity: tests/interop/test_hf.py) holds no RoPE scaling
        (
            ["model=gptj-6b", "model.position.scaling.kind=linear", "model.position.scaling.factor=2.0"],
            "model.position.scaling.kind",
        ),
        # no dense family: the routing itself refuses
        (["model=gemma2-2b", "model/position=alibi"], "model.position.kind"),
        (["model=olmo2-7b", "model/block=post"], "model.block.kind"),
    ],
)
def test_the_family_a_layout_routes_to_refuses_what_it_cannot_hold(overrides, field):
    with pytest.raises(ConfigError) as err:
        FAMILIES[dense_family(cfg := compose_model(overrides)).model_type].check(cfg)
    assert err.value.field == field
    assert "Hugging Face" in str(err.value)


@pytest.mark.parametrize(
    "overrides, config_class",
    [
        # what Mistral and OLMo 2 refuse, another family holds exactly: the export goes there
        (["model=mistral-7b", "model.attention.qkv_bias=true", "model.attention.out_bias=true"], "SmolLM3Config"),
        (["model=olmo2-7b", "model.attention.qk_norm=head"], "Exaone4Config"),
        (["model=olmo2-7b", "model.attention.qkv_bias=true"], None),  # no family: OLMo 2 names its field
    ],
)
def test_a_layout_its_family_refuses_exports_to_a_family_that_holds_it(overrides, config_class):
    cfg = compose_model([*overrides, "model.n_layer=2"])
    if config_class is None:
        with pytest.raises(ConfigError) as err:
            config_to_hf(cfg)
        assert err.value.field == "model.attention.out_bias"
        return
    assert type(config_to_hf(cfg)).__name__ == config_class
