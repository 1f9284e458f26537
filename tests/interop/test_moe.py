"""How a mixture-of-experts layout finds its Hugging Face family (archlab/interop/families/moe.py's routing,
which ``config_to_hf`` follows): each preset's own family, and the layouts between them (a moe MLP on causal
attention is Mixtral, with a per-head QK-norm Qwen3-MoE; mla with sigmoid scores or a correction bias is
DeepSeek-V3, else V2); a layout its family refuses that another family holds exports there."""

import pytest

from archlab import compose_model
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_to_hf, hf_family


@pytest.mark.parametrize(
    "overrides, config_class",
    [
        (["model=mixtral-8x7b"], "MixtralConfig"),
        (["model=qwen3-30b-a3b"], "Qwen3MoeConfig"),
        (["model=deepseek-v2-lite"], "DeepseekV2Config"),
        (["model=deepseek-v3"], "DeepseekV3Config"),
        (["model=llama2-7b", "model/mlp=moe", "model.attention.qkv_bias=false"], "MixtralConfig"),
        (["model=qwen3-30b-a3b", "model.attention.qk_norm=none"], "MixtralConfig"),
        (
            ["model=mixtral-8x7b", "model.attention.qk_norm=head", "model.mlp.routing.normalize_top_k=false"],
            "Qwen3MoeConfig",
        ),
        (
            ["model=deepseek-v2-lite", "model.mlp.routing.scoring=sigmoid", "model.mlp.routing.correction_bias=true"],
            "DeepseekV3Config",
        ),
    ],
)
def test_the_layout_picks_the_family(overrides, config_class):
    assert type(config_to_hf(compose_model(overrides))).__name__ == config_class


@pytest.mark.parametrize(
    "overrides, family, field, holder",
    [
        (
            ["model=mixtral-8x7b", "model.mlp.n_shared_experts=1"],
            "mixtral",
            "model.mlp.n_shared_experts",
            "granitemoeshared",
        ),
        (
            ["model=llama3.1-8b", "model.position.scaling.kind=yarn"],
            "llama",
            "model.position.scaling.kind",
            "ministral3",
        ),
    ],
)
def test_a_layout_its_family_refuses_exports_to_a_family_that_holds_it(overrides, family, field, holder):
    """Mixtral has no shared experts and LLaMA no YaRN: each refuses naming the field, and the layout
    exports to the family that holds it (GraniteMoeShared, Ministral 3's generic YaRN)."""
    cfg = compose_model(overrides)
    assert field in [p.field for p in FAMILIES[family].problems(cfg)]
    assert hf_family(cfg) == holder
