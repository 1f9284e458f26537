"""Hugging Face parity of DeepSeek-V2 and DeepSeek-V3 (archlab/interop/families/deepseek.py): their latent
norms at 1e-6 whatever ``rms_norm_eps`` says."""

import pytest
from helpers.hf import HF_SIZES

from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread


@pytest.mark.parametrize("eps, latent", [(1e-6, None), (1e-5, 1e-6)])
def test_deepseek_reads_any_rms_norm_eps(eps, latent):
    """DeepSeek-V3's latent norms are at 1e-6 whatever rms_norm_eps says: latent_norm_eps 1e-6 beside
    another eps, null beside 1e-6 (its presets' spelling); written back as the rms_norm_eps it read."""
    keys = dict(
        HF_SIZES,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
    )
    cfg = config_from_hf(transformers.DeepseekV3Config(**keys, rms_norm_eps=eps))
    assert (cfg.norm.eps, cfg.attention.latent_norm_eps) == (eps, latent)
    FAMILIES["deepseek_v3"].check(cfg)
    assert FAMILIES["deepseek_v3"].to_hf(cfg)["rms_norm_eps"] == eps
