"""Hugging Face parity of Qwen4-Exp's text decoder (``Qwen4ExpForCausalLM``, archlab/interop/families/qwen4_exp.py):
Qwen3.5-MoE's Gated DeltaNet and gated attention layers, the attention narrowed by a QSA indexer (``qsa``), inside
gated residual streams (``hc_count`` 2, ``hc_lowrank`` 6) with no layer or final norm, hashed n-gram inputs before
two linear layers (``ple_layer_ids`` 1 and 3), a sigmoid or silu output gate on the linear layers.

Tiny random models, every parameter redrawn (vectors 0.5 ± 0.3, matrices and tables N(0, 0.2²)), on token ids thick
with the document end (``eos_token_id``'s first id), give HF eager's float32 logits within 1e-4 and map back to the
family; archlab's tensors written under Qwen4-Exp's names equal HF's bit for bit (the n-gram hash buffers
included), and HF -> archlab -> HF -> archlab and archlab -> HF -> archlab are bit-identical; greedy and left-padded
generation equal HF ``generate``; a save_pretrained directory (each n-gram table in shards, ``shard_10`` after
``shard_9``, beside a multi-token-prediction tensor, left out) loads and saves again for ``from_pretrained``; hash
buffers other than the config's are refused, naming the buffer; the closed-form count is transformers' on the
default config with its indexer filled; what the record cannot hold is refused both ways, naming the field.

The indexer keeps a query's best ``indexer_budget / indexer_compress_ratio`` blocks by Σ_h relu(q_h·k): blocks that
every head scores below zero tie at exactly 0, and transformers' ``torch.topk`` breaks such ties in an order torch
leaves unspecified (on CPU not always the earlier block, which archlab keeps). The cases use 8 indexer heads, as the
record's default does, so that a tie at 0 (each of 8 heads negative, 1 in 256 per block) does not decide a choice in
these inputs; with 2 heads it does and the logits part at one query."""

import dataclasses

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, IDS, TOL, V, logits, max_diff
from safetensors.torch import load_file, save_file

from archlab import build_model
from archlab.accounting import count
from archlab.config.layers import layer_configs
from archlab.interop.hf import archlab_state_to_hf, config_from_hf, from_hf, load_hf_dir

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

LINEAR, INDEXED, EOS = "linear_attention", "indexed_attention", 5
HF = dict(HF_SIZES, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
HF |= dict(rope_parameters=dict(rope_type="default", rope_theta=100.0, partial_rotary_factor=0.25))
HF |= dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=12)
HF |= dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32)
HF |= dict(hc_count=2, hc_lowrank=6, layer_types=[LINEAR, INDEXED, LINEAR, INDEXED])
HF |= dict(indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=8, indexer_budget=4, indexer_compress_ratio=2)
HF |= dict(ple_layer_ids=[1, 3], heads_per_ngram=2, ngram_vocab_size_base=100, make_ngram_vocab_size_divisible_by=16)
HF |= dict(split_ngram_parts=12, eos_token_id=[EOS, 6], bos_token_id=None, pad_token_id=None)
CLASSES = ("Qwen4ExpForCausalLM", "Qwen4ExpTextConfig")
HF_CASES = {
    # a sigmoid output gate; n-gram inputs of their own width, order 3, before layers 0 and 2
    "qwen4-exp": (*CLASSES, dict(HF, output_gate_type="sigmoid", ple_embed_dim=48)),
    # the gate hidden_act's (silu); no n-gram inputs; the published configs' full_attention read as indexed;
    # 5-grams, a convolution of 3 taps; a tied head
    "qwen4-exp-silu": (
        *CLASSES,
        dict(
            HF,
            layer_types=[LINEAR, "full_attention", LINEAR, LINEAR],
            ple_layer_ids=[3, 4],
            ngram_size=5,
            ple_conv_kernel_size=3,
            norm_topk_prob=False,
            tie_word_embeddings=True,
        ),
    ),
}
# ids thick with the document end, so n-grams restart inside each row
EOS_IDS = torch.where(torch.rand(2, 12, generator=torch.Generator().manual_seed(1)) < 0.25, EOS, IDS)


def hf_model(case: str, seed: int = 1):
    """The case's HF model, every parameter redrawn; generation runs to its length (no stop on the end token)."""
    hf = parity.hf_case(HF_CASES, case, seed, **EAGER)
    hf.generation_config.eos_token_id = None
    return hf


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        impl=EAGER,
        ids=(IDS, EOS_IDS),
        only=(
            "test_from_hf_gives_hf_logits_and_maps_back_to_the_family",
            "test_hf_to_archlab_to_hf_and_back",
            "test_generation_matches_hf_generate",
        ),
    )
)


def test_the_config_is_read_as_its_parts():
    """ple_layer_ids count from 1, archlab's layers from 0; the document end is eos_token_id's first id;
    ple_embed_dim of d_model reads as null; the indexer's keys, the streams and the gate as set."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, "qwen4-exp"))
    g = cfg.ngram_input
    assert (g.layers, g.boundary, g.dim, g.order, g.heads, g.table_base, g.table_multiple) == (
        [0, 2],
        EOS,
        48,
        3,
        2,
        100,
        16,
    )
    assert (cfg.stream.kind, cfg.stream.n, cfg.stream.rank) == ("gated", 2, 6)
    assert (cfg.block.attn_norm, cfg.block.mlp_norm, cfg.block.final_norm) == (False, False, False)
    a = cfg.attention
    assert (a.kind, a.index_n_heads, a.index_head_dim, a.index_budget, a.index_ratio) == ("qsa", 8, 8, 4, 2)
    gates = [lc.attention.output_gate for lc in layer_configs(cfg) if lc.attention.kind == "gated_deltanet"]
    assert gates == ["sigmoid", "sigmoid"]
    silu = config_from_hf(parity.hf_config(HF_CASES, "qwen4-exp-silu"))
    assert silu.ngram_input.layers == [2, 3] and silu.ngram_input.dim is None
    assert [lc.attention.kind for lc in layer_configs(silu)] == [
        "gated_deltanet",
        "qsa",
        "gated_deltanet",
        "gated_deltanet",
    ]
    assert {lc.attention.output_gate for lc in layer_configs(silu) if lc.attention.kind == "gated_deltanet"} == {"silu"}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_archlab_writes_hfs_tensors_and_buffers_bit_for_bit(case):
    """archlab's tensors under Qwen4-Exp's names are HF's bit for bit, the n-gram hash buffers (which archlab
    computes from the config) and the flat stream norm scales included; and an archlab model of the layout,
    every parameter redrawn, converts to Qwen4ExpForCausalLM with the same logits and back bit for bit."""
    hf = hf_model(case)
    model = from_hf(hf)
    state, reference = archlab_state_to_hf(model.cfg, model.state_dict()), hf.state_dict()
    if hf.config.tie_word_embeddings:
        reference.pop("lm_head.weight")
    assert state.keys() == reference.keys()
    assert all(torch.equal(state[k], reference[k]) for k in state)
    assert any(k.endswith("layer_multipliers") for k in state) == bool(model.cfg.ngram_input.layers)
    parity.check_exports(model.cfg, "Qwen4ExpForCausalLM", family="qwen4_exp_text", **EAGER)


def test_other_hash_constants_are_refused_naming_the_buffer():
    """A table whose hash multipliers are not those its config gives (archlab computes them) is refused."""
    hf = hf_model("qwen4-exp")
    with torch.no_grad():
        hf.model.layers[2].ple.ple_embedding.layer_multipliers.add_(2)
    field = "model.layers.2.ple.ple_embedding.layer_multipliers"
    parity.check_refuses(lambda: from_hf(hf), field, "ngram_size, seed")


def _with_mtp(directory):
    """A multi-token-prediction tensor beside the saved ones, as published checkpoints hold."""
    path = directory / "model.safetensors"
    save_file({**load_file(path), "mtp.fc.weight": torch.zeros(4, 4)}, path)


def test_save_pretrained_directories_round_trip(tmp_path):
    """save_pretrained writes each n-gram table in 12 shards (shard_10 sorts before shard_2 as text): load_hf_dir
    joins them in their order and leaves mtp.* out (the same logits); save_hf_dir writes shards again, which
    from_pretrained joins (the same logits)."""
    hf = hf_model("qwen4-exp", seed=7)
    parity.check_directory_round_trip(hf, tmp_path, None, _with_mtp, **EAGER)
    saved = load_file(tmp_path / "again" / "model.safetensors")
    shards = [k for k in saved if k.startswith("model.layers.0.ple.ple_embedding.ngram_embedding.")]
    assert len(shards) > 10 and "model.layers.0.ple.ple_embedding.ngram_embedding.weight" not in saved
    assert max_diff(logits(hf, EOS_IDS), logits(load_hf_dir(tmp_path / "again").eval(), EOS_IDS)) <= TOL


def test_a_missing_shard_is_refused(tmp_path):
    hf = hf_model("qwen4-exp", seed=8)
    hf.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    save_file({k: v for k, v in load_file(path).items() if not k.endswith("ngram_embedding.shard_3.weight")}, path)
    with pytest.raises(ValueError, match="shard"):
        load_hf_dir(tmp_path)


INDEXER = dict(
    indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=256, indexer_budget=2048, indexer_compress_ratio=64
)


@pytest.mark.parametrize("ple", [{}, dict(ple_layer_ids=[1, 2], eos_token_id=248044)])
def test_the_count_is_transformers_on_the_default_config(ple):
    """Qwen4ExpTextConfig's defaults (40 layers, 3 linear to 1 indexed, 512 experts; 4 streams of rank 320)
    cannot build: their indexer keys are unset. Filled with qsa's defaults but the head width, 256, the least
    that holds the default RoPE's 256 rotated dims: the closed form is transformers' numel on the meta device
    and archlab's meta build; again with n-gram inputs before the first two layers (two tables of 16 primes
    from 20,000,000)."""
    config = transformers.Qwen4ExpTextConfig(**INDEXER, **ple)
    cfg = config_from_hf(config)
    with torch.device("meta"):
        hf = transformers.Qwen4ExpForCausalLM(config)
    expected = sum(p.numel() for p in hf.parameters())
    assert count(cfg)["total"] == expected == sum(p.numel() for p in build_model(cfg, device="meta").parameters())
    assert expected == (149_331_730_048 if ple else 67_368_820_352)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hidden_act="gelu"), "hidden_act"),
        (dict(layer_types=[LINEAR, "sliding_attention", LINEAR, INDEXED]), "layer_types"),
        (dict(linear_num_key_heads=3), "linear_num_key_heads"),
        (dict(output_gate_type="tanh"), "output_gate_type"),
        (dict(indexer_kv_heads=2), "indexer_kv_heads"),
        (dict(indexer_budget=None), "indexer_budget"),
        (dict(num_experts=0), "num_experts"),
        (dict(eos_token_id=[V]), "eos_token_id"),  # no token: its n-grams' document end
        (dict(rope_parameters=dict(rope_type="linear", rope_theta=100.0, factor=2.0)), "rope_parameters.rope_type"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    """Each key archlab cannot hold (set past transformers' own checks) is refused naming it."""
    config = parity.hf_config(HF_CASES, "qwen4-exp")
    for key, value in changes.items():
        setattr(config, key, value)
    parity.check_refuses(lambda: config_from_hf(config), f"Qwen4ExpTextConfig.{field}")


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(stream__n=1), "model.stream.n"),
        (dict(block__mlp_norm=True), "model.block.mlp_norm"),
        (dict(block__final_norm=True), "model.block.final_norm"),
        (dict(block__attn_norm=True), "model.block.attn_norm"),
        (dict(ngram_input__layers=[2, 0]), "model.ngram_input.layers"),  # ple_layer_ids is sorted
        (dict(ngram_input__layers=[0, 1]), "model.ngram_input.layers"),  # layer 1 is an attention layer
        (dict(attention__index_head_dim=1), "model.attention.index_head_dim"),  # 2 rotated dims
        (dict(kinds__deltanet__attention__allow_neg_eigval=True), "model.layers.kinds.deltanet.attention.allow_neg_eigval"),
        (dict(mlp__n_shared_experts=0), "model.mlp.n_shared_experts"),
    ],
)  # fmt: skip
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "qwen4-exp")), **change)
    parity.check_family_refuses("qwen4_exp_text", cfg, field)


def test_other_streams_and_attention_are_refused():
    """One plain stream, or causal attention without the indexer: not Qwen4-Exp's."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, "qwen4-exp"))
    plain = dataclasses.replace(cfg, stream=dataclasses.replace(cfg.stream, kind="plain"))
    parity.check_family_refuses("qwen4_exp_text", plain, "model.stream.kind")
    causal = parity.changed_cfg(cfg, attention__kind="causal")
    parity.check_family_refuses("qwen4_exp_text", causal, "model.attention.kind")


def test_an_end_token_other_than_the_n_gram_inputs_is_refused_on_export(tmp_path):
    """The exported config's eos_token_id is the n-gram inputs' document end (``model.ngram_input.boundary``),
    which HF's n-gram inputs read: another id passed on (as archlab-export passes its tokenizer's) is refused
    naming it, before any file is written; the same id or None keeps it."""
    from archlab.errors import ConfigError
    from archlab.interop.hf import config_to_hf, save_hf_dir

    model = from_hf(parity.hf_case(HF_CASES, "qwen4-exp", 1, **EAGER))
    assert model.cfg.ngram_input.boundary == EOS
    for same in (EOS, None):
        assert config_to_hf(model.cfg, eos_token_id=same).eos_token_id == EOS
    with pytest.raises(ConfigError) as refused:
        save_hf_dir(model, tmp_path / "out", eos_token_id=EOS + 1)
    assert refused.value.field == "eos_token_id" and not (tmp_path / "out").exists()
