"""The Hugging Face conversion machinery (``from_hf``/``to_hf``, the config mapping both ways, checkpoint
directories and files), shown on GPT-2, GPT-J and LLaMA: tiny random models give the same float32 logits
in archlab and in transformers, in both directions and through files; unsupported layouts are refused.
The other families' parity is in the family files beside this one (tests/interop/test_<family>.py).

Every parameter (biases and norm scales included) is redrawn at random before comparing, so a bias
or norm that is dropped, transposed or swapped shows up in the logits. The Hugging Face models built
here use ``attn_implementation="eager"``; models made by ``to_hf`` use transformers' default
(SDPA for GPT-2 and LLaMA, eager for GPT-J, which has no SDPA path).
"""

import subprocess
import sys

import pytest
import torch

from archlab import ConfigError, build_model, compose_model
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf, load_hf_dir, save_hf_dir, to_hf
from archlab.weights import load_weights, save_weights

transformers = pytest.importorskip("transformers")

TOL = 1e-4  # max abs logit difference allowed (float32)
V, CTX = 96, 32


pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter N(0, 0.15²); norm scales 1 + N(0, 0.15²). Tied tensors are drawn once."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.15)
            if p.dim() == 1 and ("ln" in name or "norm" in name) and name.endswith("weight"):
                p.add_(1.0)
    return model.eval()


def hf_logits(hf_model, ids):
    with torch.no_grad():
        return hf_model(ids).logits


def archlab_logits(model, ids):
    with torch.no_grad():
        return model(ids)


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


IDS = torch.randint(0, V, (2, CTX), generator=torch.Generator().manual_seed(0))

HF_MODELS = {
    # GPT-2: tied head (tie_word_embeddings defaults to True), Conv1D weights.
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=V, n_positions=CTX, n_embd=32, n_layer=2, n_head=4, attn_implementation="eager"
        )
    ),
    # GPT-J: rotary on 6 of 16 head dims, interleaved pairs; untied head with a bias.
    "gptj": lambda: transformers.GPTJForCausalLM(
        transformers.GPTJConfig(
            vocab_size=V, n_positions=CTX, n_embd=64, n_layer=2, n_head=4, rotary_dim=6, attn_implementation="eager"
        )
    ),
    # LLaMA: GQA with 4 query heads sharing 2 key/value heads, theta 5e5, eps 1e-5.
    "llama": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=V,
            max_position_embeddings=CTX,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            attn_implementation="eager",
        )
    ),
}


@pytest.mark.parametrize("family", list(HF_MODELS))
def test_from_hf_gives_the_same_logits(family):
    hf_model = randomize(HF_MODELS[family](), seed=1)
    model = from_hf(hf_model)
    assert max_diff(hf_logits(hf_model, IDS), archlab_logits(model, IDS)) <= TOL
    assert not model.training


def test_from_hf_maps_the_layout():
    gpt2 = from_hf(HF_MODELS["gpt2"]()).cfg
    assert (gpt2.block.kind, gpt2.position.kind, gpt2.head.tied, gpt2.mlp.approximate) == (
        "pre",
        "learned",
        True,
        "tanh",
    )
    gptj = from_hf(HF_MODELS["gptj"]()).cfg
    assert (gptj.block.kind, gptj.block.shared_norm, gptj.position.rotary_dim, gptj.position.pairing) == (
        "parallel",
        True,
        6,
        "interleaved",
    )
    assert (gptj.attention.qkv_bias, gptj.head.tied, gptj.head.bias) == (False, False, True)
    llama = from_hf(HF_MODELS["llama"]()).cfg
    assert (llama.attention.n_head, llama.attention.n_kv_head, llama.position.theta) == (4, 2, 500000.0)
    assert (llama.mlp.kind, llama.mlp.d_ff, llama.norm.kind, llama.norm.eps) == ("swiglu", 96, "rmsnorm", 1e-5)


def test_tied_gpt2_head_stays_tied_after_conversion():
    model = from_hf(randomize(HF_MODELS["gpt2"](), seed=2))
    assert model.head.weight is model.tok_emb.weight
    hf_model = to_hf(model)
    assert hf_model.lm_head.weight.data_ptr() == hf_model.transformer.wte.weight.data_ptr()


TINY = ["model.vocab_size=96", "model.context_length=32", "model.n_layer=2"]
ARCHLAB_MODELS = {
    "gpt2": ["model=gpt2", *TINY, "model.d_model=32", "model.attention.n_head=4"],
    "gpt2-untied-relu": [
        "model=gpt2",
        *TINY,
        "model.d_model=32",
        "model.attention.n_head=4",
        "model/head=untied",
        "model/mlp=relu",
    ],
    "gptj": ["model=gptj-6b", *TINY, "model.d_model=64", "model.attention.n_head=4", "model.position.rotary_dim=6"],
    "gptj-tied-exact-gelu": [
        "model=gptj-6b",
        *TINY,
        "model.d_model=64",
        "model.attention.n_head=4",
        "model.position.rotary_dim=8",
        "model.head.tied=true",
        "model.mlp.approximate=none",
    ],
    "llama2-gqa": [
        "model=llama2-70b",
        *TINY,
        "model.d_model=64",
        "model.attention.n_head=8",
        "model.attention.n_kv_head=2",
        "model.mlp.multiple_of=32",
    ],
    "llama-biases-geglu-tied-headdim": [
        "model=llama-7b",
        *TINY,
        "model.d_model=48",
        "model.attention.n_head=4",
        "model.attention.head_dim=16",
        "model.attention.qkv_bias=true",
        "model.attention.out_bias=true",
        "model.mlp.bias=true",
        "model/mlp=geglu",
        "model/head=tied",
    ],
}
EXPECTED_CLASS = {"gpt2": "GPT2LMHeadModel", "gptj": "GPTJForCausalLM", "llama": "LlamaForCausalLM"}


@pytest.mark.parametrize("name", list(ARCHLAB_MODELS))
def test_to_hf_gives_the_same_logits(name):
    model = randomize(build_model(compose_model(ARCHLAB_MODELS[name])), seed=3)
    hf_model = to_hf(model)
    family = "gpt2" if name.startswith("gpt2") else "gptj" if name.startswith("gptj") else "llama"
    assert type(hf_model).__name__ == EXPECTED_CLASS[family]
    assert max_diff(archlab_logits(model, IDS), hf_logits(hf_model, IDS)) <= TOL


@pytest.mark.parametrize("name", ["gptj", "llama2-gqa"])
def test_config_round_trip_keeps_the_parameter_count(name):
    cfg = compose_model(ARCHLAB_MODELS[name])
    back = config_from_hf(config_to_hf(cfg))
    assert build_model(back, device="meta").state_dict().keys() == build_model(cfg, device="meta").state_dict().keys()
    assert sum(p.numel() for p in build_model(back, device="meta").parameters()) == sum(
        p.numel() for p in build_model(cfg, device="meta").parameters()
    )


@pytest.mark.parametrize("family", list(HF_MODELS))
def test_file_round_trip(family, tmp_path):
    """HF save_pretrained directory -> archlab safetensors -> HF directory -> same logits."""
    hf_model = randomize(HF_MODELS[family](), seed=4)
    hf_model.save_pretrained(tmp_path / "hf")
    save_weights(load_hf_dir(tmp_path / "hf"), tmp_path / "archlab.safetensors")
    model = load_weights(tmp_path / "archlab.safetensors").eval()
    assert max_diff(hf_logits(hf_model, IDS), archlab_logits(model, IDS)) <= TOL
    save_hf_dir(model, tmp_path / "hf2")
    assert (tmp_path / "hf2" / "model.safetensors").exists()
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf2", attn_implementation="eager").eval()
    assert type(back) is type(hf_model)
    assert max_diff(hf_logits(hf_model, IDS), hf_logits(back, IDS)) <= TOL


def test_base_model_checkpoint_with_mask_buffers_loads(tmp_path):
    """Hub GPT-2 checkpoints name tensors without ``transformer.`` and carry ``attn.bias`` masks."""
    from safetensors.torch import save_file

    hf_model = randomize(HF_MODELS["gpt2"](), seed=5)
    hf_model.config.save_pretrained(tmp_path)
    state = {
        k.removeprefix("transformer."): v.contiguous()
        for k, v in hf_model.state_dict().items()
        if k != "lm_head.weight"
    }
    for i in range(2):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, CTX, CTX))
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(state, str(tmp_path / "model.safetensors"))
    model = load_hf_dir(tmp_path, dtype=torch.float32)
    assert max_diff(hf_logits(hf_model, IDS), archlab_logits(model.eval(), IDS)) <= TOL


def test_unconverted_tensors_are_refused(tmp_path):
    hf_model = HF_MODELS["llama"]()
    hf_model.save_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    state["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.mlp.up_proj.weight'\].*extra.weight"):
        load_hf_dir(tmp_path)


NANO = ["model=nano"]


@pytest.mark.parametrize(
    "overrides, field",
    [
        ([*NANO, "model/position=alibi"], "model.embedding_norm"),  # BLOOM's layout has its embedding norm
        ([*NANO, "model/position=sinusoidal"], "model.position.kind"),
        ([*NANO, "model/block=post", "model/position=rope"], "model.block.kind"),  # post-norm: OPT's, learned
        ([*NANO, "model/block=parallel"], "model.position.kind"),  # parallel with learned positions
        (  # parallel with two norms and RoPE is GPT-NeoX's layout, which has LayerNorm
            [
                *NANO,
                "model/block=parallel",
                "model/position=rope",
                "model.block.shared_norm=false",
                "model/norm=rmsnorm",
            ],
            "model.norm.kind",
        ),
        ([*NANO, "model/norm=rmsnorm"], "model.norm.kind"),
        ([*NANO, "model/mlp=swiglu"], "model.mlp.kind"),
        ([*NANO, "model.attention.n_kv_head=2"], "model.attention.n_kv_head"),  # GPTBigCode: MQA or MHA
        ([*NANO, "model.attention.qkv_bias=false"], "model.attention.qkv_bias"),
        ([*NANO, "model.norm.bias=false"], "model.norm.bias"),
        (
            ["model=llama-7b", *TINY, "model.d_model=64", "model.attention.n_head=4", "model.dropout=0.1"],
            "model.dropout",
        ),
        (
            [
                "model=gptj-6b",
                *TINY,
                "model.d_model=64",
                "model.attention.n_head=4",
                "model.position.rotary_dim=8",
                "model.position.theta=5e5",
            ],
            "model.position.theta",
        ),
        (
            [
                "model=gptj-6b",
                *TINY,
                "model.d_model=64",
                "model.attention.n_head=4",
                "model.position.rotary_dim=8",
                "model.position.pairing=half",
            ],
            "model.position.pairing",
        ),
        *(
            (
                ["model=llama-7b", *TINY, "model.d_model=64", "model.attention.n_head=4", f"model.mlp.{f}={v}"],
                f"model.mlp.{f}",
            )
            for f, v in (("swiglu_limit", 7.0), ("swiglu_alpha", 1.702), ("up_offset", 1.0))
        ),  # gpt-oss's clamped SwiGLU
        *(
            (
                [
                    "model=mixtral-8x7b",
                    *TINY,
                    "model.d_model=64",
                    "model.attention.n_head=4",
                    "model.attention.n_kv_head=2",
                    f"model.mlp.routing.{f}=true",
                ],
                f"model.mlp.routing.{f}",
            )
            for f in ("router_bias", "weight_input")
        ),  # gpt-oss's router bias, Llama 4's weighted expert inputs
    ],
)
def test_config_to_hf_refuses_what_no_family_holds(overrides, field):
    with pytest.raises(ConfigError) as err:
        config_to_hf(compose_model(overrides))
    assert err.value.field == field
    assert "Hugging Face" in str(err.value) or "rope with" in str(err.value)


def test_config_from_hf_refuses_what_archlab_does_not_implement():
    scaled = transformers.LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=1,
        intermediate_size=96,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0},
    )
    with pytest.raises(ConfigError, match="rope_type='yarn'"):
        config_from_hf(scaled)
    with pytest.raises(ConfigError, match="scale_attn_by_inverse_layer_idx"):
        config_from_hf(transformers.GPT2Config(n_embd=32, n_head=4, scale_attn_by_inverse_layer_idx=True))
    with pytest.raises(ConfigError, match="activation_function='quick_gelu'"):
        config_from_hf(transformers.GPTJConfig(n_embd=64, n_head=4, activation_function="quick_gelu"))
    with pytest.raises(ConfigError, match="model_type='bert'"):
        config_from_hf(transformers.BertConfig())
    with pytest.raises(TypeError, match="GPT2LMHeadModel"):
        from_hf(transformers.GPT2Model(transformers.GPT2Config(n_embd=32, n_head=4, n_layer=1, vocab_size=V)))


def test_core_modules_do_not_import_transformers():
    code = (
        "import sys, archlab, archlab.build, archlab.weights, archlab.generate, archlab.interop.hf\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
