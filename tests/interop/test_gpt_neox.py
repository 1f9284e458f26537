"""Hugging Face parity of GPT-NeoX (Pythia) (archlab/interop/families/neox.py, model_type gpt_neox): a parallel
block with two LayerNorms (or sequential), partial RoPE, biases.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²), far
from 0 and 1, so a dropped, transposed or swapped tensor shows in the logits; GQA wherever the family has it;
sequences longer than every window of 4) give the same float32 logits in archlab and in transformers' eager
implementation, from HF to archlab and from the shrunk preset's layout to HF; archlab -> HF -> archlab gives
back every tensor bit for bit; greedy decoding, alone and in a left-padded batch, equals HF ``generate``; a
save_pretrained directory loads and saves again; what the family cannot hold is refused, naming the field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, CTX, SMALL, TOL, logits, max_diff

from archlab import compose_model
from archlab.interop.hf import config_from_hf, from_hf, load_hf_dir

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(SMALL, rotary_pct=0.25, hidden_act="gelu")),
    "gpt_neox-sequential-tied": (
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        dict(
            SMALL,
            rotary_pct=0.5,
            rotary_emb_base=500.0,
            use_parallel_residual=False,
            attention_bias=False,
            tie_word_embeddings=True,
            hidden_act="gelu_new",
        ),
    ),
}
D64 = ["model.d_model=64", "model.attention.n_head=4"]
# case -> (preset, the HF class it maps to, sizes): the preset shrunk, its registry choices and features kept
PRESET_CASES = {
    "pythia-160m": ("pythia-160m", "GPTNeoXForCausalLM", D64),
    # 30 of 44 dims: 44 · (30 / 44) is just below 30 in floating point, so the factor written is nudged up
    "pythia-160m-rotary-30-of-44": (
        "pythia-160m",
        "GPTNeoXForCausalLM",
        [
            "model.d_model=176",
            "model.attention.n_head=4",
            "model.position.rotary_fraction=null",
            "model.position.rotary_dim=30",
        ],
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES))


def test_from_hf_reads_the_family_s_parts():
    neox, seq = from_hf(hf_model("gpt_neox")).cfg, from_hf(hf_model("gpt_neox-sequential-tied")).cfg
    assert (neox.block.kind, neox.block.shared_norm, neox.position.rotary_fraction) == ("parallel", False, 0.25)
    assert (seq.block.kind, seq.position.theta, seq.attention.qkv_bias, seq.head.tied) == ("pre", 500.0, False, True)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model=pythia-160m", "model.attention.n_kv_head=4"], "model.attention.n_kv_head"),
        (["model=pythia-160m", "model.attention.out_bias=false"], "model.attention.out_bias"),
        (["model=pythia-160m", "model.head.bias=true"], "model.head.bias"),
        (["model=pythia-160m", "model.position.pairing=interleaved"], "model.position.pairing"),
    ],
)
def test_the_family_a_layout_routes_to_refuses_what_it_cannot_hold(overrides, field):
    parity.check_routed_family_refuses("gpt_neox", compose_model(overrides), field)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("gpt_neox", dict(rotary_pct=0.0625), "GPTNeoXConfig.rope_parameters.partial_rotary_factor"),  # 1 dim
        ("gpt_neox", dict(hidden_act="quick_gelu"), "GPTNeoXConfig.hidden_act"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


def test_pythia_checkpoint_with_embed_out_loads(tmp_path):
    """Pythia's Hub checkpoints predate transformers 5: the head is ``embed_out``, and older ones carry
    ``attention.bias`` / ``attention.masked_bias`` mask buffers."""
    from safetensors.torch import save_file

    hf = hf_model("gpt_neox", seed=6)
    hf.config.save_pretrained(tmp_path)
    state = {
        ("embed_out." + k.removeprefix("lm_head.")) if k.startswith("lm_head.") else k: v.contiguous()
        for k, v in hf.state_dict().items()
    }
    for i in range(2):
        state[f"gpt_neox.layers.{i}.attention.bias"] = torch.tril(torch.ones(1, 1, CTX, CTX, dtype=torch.bool))
        state[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
    save_file(state, str(tmp_path / "model.safetensors"))
    assert max_diff(logits(hf), logits(load_hf_dir(tmp_path).eval())) <= TOL


@pytest.mark.parametrize("case", ["gpt_neox"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)
