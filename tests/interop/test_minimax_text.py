"""Hugging Face parity of MiniMax-01 (archlab/interop/families/minimax_text.py, model_type minimax,
``MiniMaxForCausalLM``): Mixtral's attention (GQA, RoPE, a sliding window in one case) and lightning-attention
layers by ``layer_types``, a softmax top-k MoE, and the skip taken after each norm with its alpha and beta
factors far from 1.

Tiny random models (every parameter redrawn: matrices and stacked experts N(0, 0.2²), norm scales 0.5 + N(0,
0.3²); the lightning layers' slope and decay buffers are no weights: transformers computes them from the layer
index, as archlab does) give HF's float32 eager logits within 1e-4 over 12 positions, which cross lightning
blocks of 4 and 3; archlab -> HF -> archlab is bit-identical and keeps layer_types; greedy and left-padded
batched generation equal HF ``generate`` (HF decodes the lightning layers by their recurrence from the
blockwise prefill's state; it zeroes the padded q, k, v, and an empty state decayed stays empty, as archlab's
padding, which keeps it); a save_pretrained directory (the decay buffers in it) loads and saves back; what
archlab cannot hold is refused both ways, naming the field."""

from typing import Any

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, TOL, V, changed_cfg, max_diff, randomize
from safetensors.torch import load_file, save_file

from archlab.config.layers import layer_configs
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf, load_hf_dir
from archlab.nn.validation import ignored

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

LINEAR, FULL = "linear_attention", "full_attention"
FACTORS = dict(full_attn_alpha_factor=1.7, linear_attn_alpha_factor=1.7, full_attn_beta_factor=0.6)
FACTORS |= dict(linear_attn_beta_factor=0.6, mlp_alpha_factor=1.3, mlp_beta_factor=0.8)
BASE = dict(
    HF_SIZES,
    **NO_TOKENS,
    **FACTORS,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=24,
    num_local_experts=5,
    num_experts_per_tok=2,
    rope_parameters=dict(rope_type="default", rope_theta=100.0),
)
HF_CASES = {
    # two lightning layers, a full one, a lightning one (first [lightning], pattern ...); blocks of 4; heads of 16
    "mixed": (
        "MiniMaxForCausalLM",
        "MiniMaxConfig",
        dict(BASE, num_hidden_layers=4, block_size=4, layer_types=[LINEAR, LINEAR, FULL, LINEAR]),
    ),  # fmt: skip
    # full, lightning, full; heads of 12 (not hidden / heads), blocks of 3, a sliding window of 4, a tied head
    "window-tied": (
        "MiniMaxForCausalLM",
        "MiniMaxConfig",
        dict(
            BASE,
            num_hidden_layers=3,
            block_size=3,
            head_dim=12,
            sliding_window=4,
            tie_word_embeddings=True,
            layer_types=[FULL, LINEAR, FULL],
        ),
    ),  # fmt: skip
}


def hf_model(case: str, seed: int = 1) -> Any:
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name; HF's left-padded generation only
# where its first layer is a full-attention one (test_padded_decoding_equals_hfs_full_forward below)
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        impl=EAGER,
        only=(
            "test_from_hf_gives_hf_logits_and_back",
            "test_greedy_generation_matches_hf_generate",
            "test_save_pretrained_directories_round_trip",
        ),
    )
)
FULL_FIRST = {"window-tied": HF_CASES["window-tied"]}
globals().update(
    parity.family_tests(hf_model, FULL_FIRST, impl=EAGER, only=("test_padded_batch_generation_matches_hf_generate",))
)


def test_padded_decoding_equals_hfs_full_forward_where_its_own_decoding_departs():
    """'mixed' begins with a lightning layer, whose slot in MiniMaxCache holds no keys, and the cache's length
    is read from layer 0: HF's cached steps then build their attention masks for no past keys, and a
    left-padded row's new query sees the padding. Prompts of 7, 3 and 5 tokens left-padded, then 4 tokens one
    at a time: archlab's logits through its cache equal HF's full forward over the padded batch, from which
    HF's own cached decoding departs by more than 0.1 in the padded rows."""
    hf = hf_model("mixed", seed=6)
    model = from_hf(hf)
    prompts = [torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (7, 3, 5)]
    ids = torch.tensor([[0] * (7 - len(p)) + p + [5, 9, 2, 7] for p in prompts])
    mask = torch.tensor([[0] * (7 - len(p)) + [1] * (len(p) + 4) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cuts = [(0, 7), (7, 8), (8, 9), (9, 10), (10, 11)]
    with torch.no_grad():
        full = hf(ids, attention_mask=mask).logits[:, 6:]
        cache, ours = model.new_cache(3, 11), []
        for start, end in cuts:
            ours.append(model(ids[:, start:end], cache, mask[:, :end])[:, -1])
        out, hf_steps = None, []
        for start, end in cuts:
            cached = None if out is None else out.cache
            out = hf(ids[:, start:end], attention_mask=mask[:, :end], position_ids=positions[:, start:end],
                     cache=cached, use_cache=True)  # fmt: skip
            hf_steps.append(out.logits[:, -1])
    assert max_diff(torch.stack(ours, 1), full) <= TOL
    departs = (torch.stack(hf_steps, 1) - full).abs().amax((1, 2))
    assert departs[0] <= TOL and (departs[1:] > 0.1).all()


def test_from_hf_reads_the_layer_kinds_and_the_multipliers():
    """layer_types become kinds (lightning with the model's heads and the config's block size; attention, the
    model's own), the factors the normed_skip block's four multipliers; no field set that its part does not
    read."""
    cfg = from_hf(hf_model("mixed")).cfg
    assert ignored(cfg) == []
    assert (cfg.layers.first, cfg.layers.pattern) == ([], ["lightning", "lightning", "attention"])
    assert [lc.attention.kind for lc in layer_configs(cfg)] == ["lightning", "lightning", "causal", "lightning"]
    lightning = layer_configs(cfg)[0].attention
    assert (lightning.n_head, lightning.head_dim, lightning.block_size, lightning.norm_eps) == (4, 16, 4, 1e-6)
    b = cfg.block
    assert (b.kind, b.attn_alpha, b.attn_beta, b.mlp_alpha, b.mlp_beta) == ("normed_skip", 1.7, 0.6, 1.3, 0.8)
    tied = from_hf(hf_model("window-tied")).cfg
    assert (tied.attention.window, tied.head.tied, layer_configs(tied)[1].attention.head_dim) == (4, True, 12)


PARTS = [
    ("block__attn_alpha", 1.0),  # the attention skip's multiplier
    ("block__mlp_beta", 1.0),  # the MLP output's
    ("kinds__lightning__attention__block_size", 256),  # not the output: one block of the 12 positions (control)
]


@pytest.mark.parametrize("field, value", PARTS, ids=[p[0] for p in PARTS])
def test_each_multiplier_changes_the_logits_and_the_block_size_does_not(field, value):
    """The same weights with a multiplier set to 1 give other logits; with another block size the same (the
    blockwise form computes the same recurrence, to float32 rounding)."""
    model = from_hf(hf_model("mixed"))
    changed = changed_cfg(model.cfg, **{field: value})
    if field.startswith("kinds"):
        other = parity.build_model(changed, device="meta")
        other.load_state_dict(model.state_dict(), assign=True)
        assert parity.max_diff(parity.logits(other.eval()), parity.logits(model)) <= 1e-5
        return
    parity.check_changes_logits(model, changed, field)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(kinds__lightning__attention__norm_eps=1e-5), "model.layers.kinds.lightning.attention.norm_eps"),
        (dict(kinds__lightning__attention__head_dim=8), "model.layers.kinds.lightning.attention.head_dim"),
        (dict(kinds__attention__attention__window=4), "model.layers.kinds.attention.attention.window"),
        (dict(kinds__lightning__mlp__routing__top_k=1), "model.layers.kinds.lightning.mlp.routing.top_k"),
        (dict(block__kind="pre"), "model.block.kind"),
        (dict(mlp__expert="geglu"), "model.mlp.expert"),
        (dict(mlp__routing__normalize_top_k=False), "model.mlp.routing.normalize_top_k"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(fields, field):
    cfg = from_hf(hf_model("mixed")).cfg
    parity.check_family_refuses("minimax", changed_cfg(cfg, **fields), field)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(linear_attn_alpha_factor=2.0), "MiniMaxConfig.linear_attn_alpha_factor"),
        (dict(linear_attn_beta_factor=2.0), "MiniMaxConfig.linear_attn_beta_factor"),
        (dict(hidden_act="gelu"), "MiniMaxConfig.hidden_act"),
        (dict(router_jitter_noise=0.1), "MiniMaxConfig.router_jitter_noise"),
        (dict(layer_types=[LINEAR, "sliding_attention", FULL, LINEAR]), "MiniMaxConfig.layer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "mixed", **changes)), field)


def test_all_lightning_layers_and_all_full_ones_convert():
    """Every layer linear (each a lightning kind, the model's attention unused) or every one full (no kinds):
    HF's logits, and back to the same layer_types."""
    for types in ([LINEAR] * 3, [FULL] * 3):
        keys = dict(HF_CASES["mixed"][2], num_hidden_layers=3, layer_types=types)
        hf = randomize(transformers.MiniMaxForCausalLM(transformers.MiniMaxConfig(**keys, **EAGER)), 3)
        model = from_hf(hf)
        assert parity.max_diff(parity.logits(hf), parity.logits(model)) <= parity.TOL
        assert config_to_hf(model.cfg).layer_types == types


def test_the_config_class_defaults_count_as_transformers_builds_them():
    """MiniMaxConfig() (Mixtral-8x7B's sizes, layers alternating, no preset: docs/reference.md): the closed form,
    archlab's meta build and transformers' meta model hold 47,373,946,880 parameters, 13,551,079,424 active,
    not MiniMax-Text-01's published 456B / 45.9B."""
    config = transformers.MiniMaxConfig()
    cfg = config_from_hf(config)
    counts = parity.count_params(cfg)
    assert (counts["total"], counts["active"]) == (47_373_946_880, 13_551_079_424)
    parity.build_model(cfg, device="meta")  # compares every component with the closed form
    with torch.device("meta"):
        hf = transformers.MiniMaxForCausalLM(config)
    assert sum(p.numel() for p in hf.parameters()) == 47_373_946_880


def test_a_checkpoint_whose_slopes_differ_is_refused(tmp_path):
    """A save_pretrained directory holds each lightning layer's slope_rate, which transformers decays by: one
    halved (layer 0 of 'mixed') is refused naming the tensor, where the directory as saved loads."""
    hf = hf_model("mixed")
    hf.save_pretrained(tmp_path)
    assert max_diff(parity.logits(load_hf_dir(tmp_path)), parity.logits(hf)) <= TOL
    file = tmp_path / "model.safetensors"
    state = load_file(file)
    state["model.layers.0.self_attn.slope_rate"] = state["model.layers.0.self_attn.slope_rate"] / 2
    save_file(state, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="model.layers.0.self_attn.slope_rate"):
        load_hf_dir(tmp_path)
