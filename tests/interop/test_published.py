"""The presets against the published configs (tests/helpers/published.py's HF_CONFIGS: each preset's
family and its ``config.json`` keys): transformers builds each published config with the published
parameter count (on the meta device), ``config_to_hf`` of the preset writes every published key, and the
published config reads back into the preset's layout and count."""

import pytest
import torch
from helpers.published import HF_CONFIGS, PUBLISHED

from archlab import compose_model, count_params
from archlab.interop.hf import config_from_hf, config_to_hf, hf_family

transformers = pytest.importorskip("transformers")

_ROPE_KEYS = {"rope_theta", "rotary_pct", "rotary_emb_base", "partial_rotary_factor", "rope_scaling"}


def published_config(preset: str):
    model_type, keys = HF_CONFIGS[preset]
    return transformers.CONFIG_MAPPING[model_type](**keys)


@pytest.mark.parametrize("preset", list(HF_CONFIGS))
def test_published_config_built_by_transformers_has_the_published_count(preset):
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(published_config(preset))
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[preset]


@pytest.mark.parametrize("preset", list(HF_CONFIGS))
def test_preset_converts_to_the_published_config(preset):
    """Every published key (RoPE's as transformers files them in rope_parameters) equals the one
    config_to_hf writes for the preset, in the published family's config class."""
    published, _, keys = published_config(preset), *HF_CONFIGS[preset]
    ours = config_to_hf(compose_model([f"model={preset}"]))
    assert type(ours) is type(published)
    # implied keys too: the RoPE pairs DeepSeek-V3 rotates (its config.json leaves the default, interleaved)
    compared = [k for k in keys if k not in _ROPE_KEYS] + ["rope_parameters", "head_dim", "layer_types"]
    compared += ["rope_interleave"]

    def value(config, k):  # DeepSeek's config.json spells rope_type "type"; transformers keeps both
        v = getattr(config, k)
        return {n: x for n, x in v.items() if n != "type"} if k == "rope_parameters" else v

    differ = {
        k: (value(published, k), value(ours, k))
        for k in compared
        if hasattr(published, k) and value(published, k) != value(ours, k)
    }
    assert not differ


@pytest.mark.parametrize("preset", list(HF_CONFIGS))
def test_published_config_reads_into_the_preset_s_layout(preset):
    cfg = config_from_hf(published_config(preset))
    assert hf_family(cfg) == HF_CONFIGS[preset][0]
    assert count_params(cfg)["total"] == PUBLISHED[preset]
    assert config_to_hf(cfg).to_dict() == config_to_hf(compose_model([f"model={preset}"])).to_dict()
