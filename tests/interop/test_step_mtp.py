"""Step-3.5's multi-token prediction layers (``num_nextn_predict_layers``: ``model.layers.<n_layer + k>``,
``families/step_mtp.py``) against transformers' ``MtpModel`` (what ``generate(use_mtp=True)`` drafts with),
every weight and buffer random. transformers has no causal-LM class for step3p5: the main model is archlab's
``Step3p5ForCausalLM`` (transformers' ``Step3p7TextModel`` and an ``lm_head``, as in test_step.py), whose
``lm_head`` ``MtpModel`` ties as its head. A checkpoint archlab writes loads into ``MtpModel.from_pretrained``
(which raises on a missing tensor) with archlab's MTP logits; a checkpoint written from ``MtpModel``'s tensors
by Step's checkpoint names (save_pretrained's stacked experts, or the published ``moe.*`` / ``share_expert``)
loads into archlab with the same logits and drafts speculative decoding's tokens; archlab -> files -> archlab
is bit-identical; Step-3.7's vision-language checkpoint with MTP layers loads its modules alike. The modules'
layer is read from ``mtp_layer_types`` / ``mtp_mlp_layer_types`` and the clamps transformers gives MTP layer k
(the model's layer k's); MTP layers archlab cannot give one kind are refused."""

import json

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, randomize
from helpers.published import LAYOUT_CONFIGS

from archlab import ConfigError, build_model, count_params
from archlab.generate import generate
from archlab.interop.families import FAMILIES
from archlab.interop.families.step import causal_lm_class
from archlab.interop.hf import config_from_hf, config_to_hf, load_hf_dir, save_hf_dir
from archlab.nn.mtp import with_depth
from archlab.nn.validation import validate
from archlab.speculative import speculate

transformers = pytest.importorskip("transformers")
from transformers.modeling_layers import MtpModel  # noqa: E402

from interop.test_mtp_checkpoints import archlab_logits  # noqa: E402
from interop.test_step import CASES as STEP  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

FULL, SLIDING = "full_attention", "sliding_attention"
STEP35 = FAMILIES["step3p5"]
CASES = {
    # a sliding dense MTP layer (6 heads, the sliding layers', which transformers builds from
    # mtp_per_layer_config alone), clamped at layer 0's shared bound 0.6 as transformers clamps it: a kind no
    # layer of the model has
    "sliding-dense": (
        "mixed-clamped",
        dict(
            mtp_layer_types=[SLIDING],
            mtp_mlp_layer_types=["dense"],
            mtp_per_layer_config={0: {"num_attention_heads": 6}},
        ),
    ),
    # a full MoE MTP layer of 6 heads (mtp_per_layer_config) beside the full layers' 4
    "full-moe-heads": (
        "mixed-clamped",
        dict(
            mtp_layer_types=[FULL],
            mtp_mlp_layer_types=["sparse"],
            mtp_per_layer_config={0: {"num_attention_heads": 6}},
        ),
    ),
    # two MTP layers of the model's own parts (every layer sliding MoE, one kind), a tied head
    "sliding-tied-2": ("sliding-tied", dict(mtp_layer_types=[SLIDING] * 2, mtp_mlp_layer_types=["sparse"] * 2)),
}
DEPTH = {"sliding-dense": 1, "full-moe-heads": 1, "sliding-tied-2": 2}
KIND = {"sliding-dense": "sliding_dense_clamp0p6", "full-moe-heads": "full_shared0p6_heads6", "sliding-tied-2": None}


def hf_config(case: str, **changes):
    base, mtp = CASES[case]
    keys = {**STEP[base], **mtp, "num_nextn_predict_layers": DEPTH[case], **changes}
    return transformers.Step3p7TextConfig(**keys, **EAGER)


def hf_main(case: str, seed: int):
    return randomize(causal_lm_class()(hf_config(case)), seed)


def archlab_cfg(case: str):
    c = hf_config(case)
    return validate(STEP35.with_mtp(config_from_hf(c), c, DEPTH[case]))


def reference(hf_model, mtp, idx, k):
    """transformers' logits of the model and of its MTP layers 0..k-1 over ``idx``, chained as
    ``MtpModel.forward`` chains them (layer j at position i reads layer j-1's state at i and token i + j + 1);
    the states of the model from its text model (the wrapper returns logits alone)."""
    with torch.no_grad():
        state = hf_model.model(idx).last_hidden_state
        out = [hf_model.lm_head(state)]
        positions = torch.arange(idx.shape[1])[None].expand(idx.shape[0], -1)
        for j in range(k):
            state = mtp.forward_layer(j, state[:, :-1], positions[:, j + 1 :], None, input_ids=idx[:, j + 1 :])
            out.append(mtp._project_to_logits(state))
        return out


def archlab_chain(model, idx, k):
    """archlab's logits of the model and of its modules 0..k-1 over ``idx``, chained as ``reference``."""
    logits = list(archlab_logits(model, idx))
    if k < 2:
        return logits
    with torch.no_grad():
        state, out = model.hidden(idx), logits[:1]
        for j, module in enumerate(model.mtp.depths[:k]):
            x = module.enter(model.embed(idx[:, j + 1 :]), state[:, :-1])
            layer = [(module.block, model.mtp_position, None)]
            state = module.norm(model.run(x, layer, None, None, None, None))
            out.append(model.logits(state))
        return out


def load_mtp(path):
    hf_model = causal_lm_class().from_pretrained(str(path), **EAGER).eval()
    return hf_model, MtpModel.from_pretrained(hf_model).eval()


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_archlab_writes_is_read_by_transformers_mtp_model(case, tmp_path):
    cfg = archlab_cfg(case)
    assert (cfg.head.mtp.depth, cfg.head.mtp.layer) == (DEPTH[case], KIND[case])
    model = parity.randomize(build_model(cfg), 5).eval()
    save_hf_dir(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    for key, value in CASES[case][1].items():  # the MTP layers' types as given (the heads keyed by str)
        assert written[key] == (value if key != "mtp_per_layer_config" else {"0": value[0]}), key
    assert written["num_nextn_predict_layers"] == DEPTH[case]
    hf_model, mtp = load_mtp(tmp_path)
    idx = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    for ours, theirs in zip(archlab_chain(model, idx, DEPTH[case]), reference(hf_model, mtp, idx, DEPTH[case])):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    back = load_hf_dir(tmp_path)
    assert (back.cfg.head.mtp.depth, back.cfg.head.mtp.layer) == (DEPTH[case], KIND[case])
    parity.assert_same_tensors(model, back)


# save_pretrained's names of a MoE layer -> the published checkpoints' (transformers' "step3p7" conversions)
PUBLISHED = {
    "mlp.gate.weight": "moe.gate.weight",
    "mlp.gate.e_score_correction_bias": "moe.router_bias",
    "mlp.experts.down_proj": "moe.down_proj.weight",
}


def checkpoint_names(mtp, n_layer, published):
    """``MtpModel``'s tensors by the names of Step's checkpoints: layer ``n_layer + k``, its block's tensors
    beside enorm, hnorm, eh_proj and shared_head.norm; the MoE as save_pretrained stores it, or (``published``)
    as stepfun's checkpoints do (``moe.*``, gate and up stacked apart, ``share_expert``)."""
    out = {}
    for name, t in mtp.state_dict().items():
        if not name.startswith("layers."):
            continue  # the embedding and head, the model's own
        k, rest = name.removeprefix("layers.").split(".", 1)
        rest = rest.removeprefix("mtp_block.").replace("post_norm.", "shared_head.norm.")
        key = f"model.layers.{n_layer + int(k)}."
        if published and rest.startswith("mlp.") and not rest.startswith("mlp.gate_proj"):
            if rest == "mlp.experts.gate_up_proj":
                half = t.shape[1] // 2
                out[key + "moe.gate_proj.weight"], out[key + "moe.up_proj.weight"] = (
                    t[:, :half].clone(),
                    t[:, half:].clone(),
                )
                continue
            rest = PUBLISHED.get(rest, rest.replace("mlp.shared_experts.", "share_expert."))
        out[key + rest] = t.clone()
    return out


@pytest.mark.parametrize("published", [False, True], ids=["saved", "published"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_step_checkpoint_with_its_mtp_layers_loads_with_transformers_logits(case, published, tmp_path):
    from safetensors.torch import load_file, save_file

    hf_model = hf_main(case, 4).eval()
    depth = DEPTH[case]
    mtp = parity.randomize(MtpModel(hf_model, depth), 6).eval()
    mtp.tie_with_main_model(hf_model)  # the embedding and head drawn with the model's
    hf_model.save_pretrained(str(tmp_path))
    L = hf_model.config.num_hidden_layers
    tensors = checkpoint_names(mtp, L, published)
    file = tmp_path / "model.safetensors"
    save_file({**load_file(str(file)), **tensors}, str(file), metadata={"format": "pt"})
    model = load_hf_dir(tmp_path).eval()
    assert (model.cfg.head.mtp.depth, model.cfg.head.mtp.layer) == (depth, KIND[case])
    idx = torch.randint(0, model.cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    for ours, theirs in zip(archlab_chain(model, idx, depth), reference(hf_model, mtp, idx, depth)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    # the modules draft for speculative decoding: the tokens are greedy decoding's
    prompt = idx[:, :5]
    assert torch.equal(speculate(model, prompt, 8).ids, generate(model, prompt, 8, temperature=0.0))


def test_the_published_config_reads_three_sliding_dense_mtp_layers():
    """stepfun-ai/Step-3.5-Flash's config pads its per-layer lists with its 3 MTP layers (sliding, dense,
    unclamped): they read as the preset's sliding_dense kind, of the sliding layers' 96 heads as its
    checkpoints hold them, where transformers (no mtp_per_layer_config) would build 64. Their count, in
    closed form, is transformers' MtpModel's built with those heads, less the embedding and head it shares."""
    _, config_class, keys, _ = LAYOUT_CONFIGS["step-3.5-flash"]
    published = getattr(transformers, config_class)(**keys)
    assert (published.mtp_layer_types, published.mtp_mlp_layer_types) == ([SLIDING] * 3, ["dense"] * 3)
    cfg = validate(STEP35.with_mtp(config_from_hf(published), published, 3))
    assert (cfg.head.mtp.depth, cfg.head.mtp.layer) == (3, "sliding_dense")
    modules = count_params(cfg)["total"] - count_params(config_from_hf(published))["total"]
    back = config_to_hf(cfg)
    assert back.mtp_per_layer_config == {k: {"num_attention_heads": 96} for k in range(3)}
    with torch.device("meta"):
        mtp = MtpModel(causal_lm_class()(back), 3)
    own = sum(p.numel() for n, p in mtp.named_parameters() if n.startswith("layers."))
    # per layer: 3 norms, eh_proj, q/o of 96 heads, k/v of 8, g_proj, q/k norms, 2 norms, the dense SwiGLU
    layer = 3 * 4096 + 8192 * 4096 + 2 * 96 * 128 * 4096 + 2 * 8 * 128 * 4096 + 96 * 4096 + 256 + 2 * 4096
    assert modules == own == 3 * (layer + 3 * 11264 * 4096) == 3 * 281_432_320


@pytest.mark.parametrize(
    "changes, field",
    [
        # two MTP layers (over layers 0 and 1, which clamp their shared expert at 0.6 and not at all)
        (
            dict(num_nextn_predict_layers=2, mtp_layer_types=[SLIDING] * 2, mtp_mlp_layer_types=["dense"] * 2),
            "swiglu_limits_shared",
        ),
        (
            dict(mtp_layer_types=[SLIDING, FULL], mtp_mlp_layer_types=["dense"] * 2, num_nextn_predict_layers=2),
            "mtp_layer_types",
        ),
        (
            dict(mtp_mlp_layer_types=["dense", "sparse"], mtp_layer_types=[FULL] * 2, num_nextn_predict_layers=2),
            "mtp_mlp_layer_types",
        ),
        (dict(mtp_layer_types=["chunked_attention"]), "mtp_layer_types"),
        (dict(mtp_per_layer_config={0: {"head_dim": 32}}), "mtp_per_layer_config"),
    ],
)
def test_mtp_layers_archlab_cannot_give_one_kind_are_refused(changes, field):
    c = hf_config("sliding-dense", **changes)
    with pytest.raises(ConfigError, match=field):
        STEP35.with_mtp(config_from_hf(c), c, c.num_nextn_predict_layers)


def test_all_sliding_model_refuses_a_full_mtp_layer():
    """transformers' MTP layer takes the RoPE of its type from the model's: a type the model has not is
    refused, reading (mtp_layer_types) and writing (the modules' kind's window)."""
    c = transformers.Step3p7TextConfig(
        **{**STEP["sliding-tied"], "num_nextn_predict_layers": 1, "mtp_layer_types": [FULL]},
        mtp_mlp_layer_types=["sparse"],
        **EAGER,
    )
    with pytest.raises(ConfigError, match="mtp_layer_types"):
        STEP35.with_mtp(config_from_hf(c), c, 1)
    cfg = config_from_hf(c)
    cfg.layers.kinds = {"full": {"attention": {"window": None}}}
    with pytest.raises(ConfigError, match=r"kinds\.full\.attention\.window"):
        config_to_hf(with_depth(cfg, 1, "full"), "step3p5")


def test_a_modules_clamp_transformers_would_not_give_it_is_refused():
    """transformers clamps MTP layer k as the model's layer k: a module kind clamped otherwise is refused,
    naming the kind's field."""
    cfg = archlab_cfg("sliding-dense")
    cfg.layers.kinds["sliding_dense_clamp0p6"]["mlp"]["swiglu_limit"] = 0.7
    with pytest.raises(ConfigError, match=r"kinds\.sliding_dense_clamp0p6\.mlp\.swiglu_limit"):
        config_to_hf(cfg, "step3p5")


def test_a_step_3_7_checkpoint_with_its_mtp_layers_loads_with_transformers_logits(tmp_path):
    """Step-3.7's vision-language checkpoint (read as its Step-3.5 language model) with its MTP layers by the
    published names beside the model's: the modules load with the logits of transformers' MtpModel drafting
    for Step3p7ForConditionalGeneration (its head the wrapper's lm_head)."""
    from safetensors.torch import load_file, save_file

    from interop.test_step import VISION

    config = transformers.Step3p7Config(text_config=hf_config("sliding-dense").to_dict(), vision_config=VISION)
    config.text_config._attn_implementation = config.text_config._experts_implementation = "eager"
    ref = randomize(transformers.Step3p7ForConditionalGeneration(config), 4)
    mtp = parity.randomize(MtpModel(ref, 1), 6).eval()
    mtp.tie_with_main_model(ref)
    ref.save_pretrained(str(tmp_path))
    file = tmp_path / "model.safetensors"
    held = load_file(str(file))
    assert "model.embed_tokens.weight" in held  # saved by the published names: model.*, vision_model.*
    tensors = checkpoint_names(mtp, config.text_config.num_hidden_layers, published=True)
    save_file({**held, **tensors}, str(file), metadata={"format": "pt"})
    model = load_hf_dir(tmp_path).eval()
    assert (model.cfg.head.mtp.depth, model.cfg.head.mtp.layer) == (1, KIND["sliding-dense"])
    idx = torch.randint(0, model.cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    ours = archlab_chain(model, idx, 1)
    with torch.no_grad():
        state = ref.model.language_model(idx).last_hidden_state
        positions = torch.arange(12)[None].expand(2, -1)
        theirs = [
            ref(idx).logits,
            mtp._project_to_logits(mtp.forward_layer(0, state[:, :-1], positions[:, 1:], None, input_ids=idx[:, 1:])),
        ]
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_the_head_s_copy_under_step_s_published_name_is_read(tmp_path):
    """Step-3.5's published checkpoints name each MTP layer's copy of the head ``shared_head.output`` (as
    SGLang's Step-3.5 MTP loader reads them): read as the copy archlab writes as ``shared_head.head``, dropped
    where it is the model's head (the model back bit for bit), refused naming it where it is not."""
    from safetensors.torch import load_file, save_file

    cfg = archlab_cfg("sliding-dense")
    model = parity.randomize(build_model(cfg), 5).eval()
    save_hf_dir(model, tmp_path)
    file, layer = tmp_path / "model.safetensors", f"model.layers.{cfg.n_layer}.shared_head"
    held = load_file(str(file))
    held[f"{layer}.output.weight"] = held.pop(f"{layer}.head.weight")
    save_file(held, str(file), metadata={"format": "pt"})
    parity.assert_same_tensors(model, load_hf_dir(tmp_path))
    held[f"{layer}.output.weight"] = held[f"{layer}.output.weight"] + 1.0
    save_file(held, str(file), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="shared_head.output"):
        load_hf_dir(tmp_path)
