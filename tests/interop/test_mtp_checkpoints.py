"""Multi-token prediction modules in Hugging Face checkpoints (archlab/interop/families/mtp.py): transformers'
causal-LM classes drop DeepSeek-V3's and GLM-4.5's MTP layers (``model.layers.<n_layer>.*``; the Sarvam
models' in the same classes), so archlab reads and writes them in the checkpoint files (Step-3.5's:
test_step_mtp.py). Checked against transformers' own ``MtpModel`` (what ``generate(..., use_mtp=True)``
drafts with), every weight and buffer random: a checkpoint archlab writes loads into
``MtpModel.from_pretrained`` (which raises on a missing tensor) and gives its logits; a checkpoint written
from ``MtpModel``'s tensors by the names DeepSeek's checkpoints use (each family of that scheme) loads into
archlab with the same logits; archlab -> files -> archlab is bit-identical; the loaded model drafts for
speculative decoding."""

import json

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER

from archlab import build_model
from archlab.generate import generate
from archlab.interop.families import FAMILIES
from archlab.interop.hf import from_hf, load_hf_dir, save_hf_dir
from archlab.nn.mtp import with_depth
from archlab.speculative import speculate

transformers = pytest.importorskip("transformers")
from transformers.modeling_layers import MtpModel  # noqa: E402

from interop.test_bailing_hybrid import HF_CASES as BAILING  # noqa: E402
from interop.test_deepseek import HF_CASES as DEEPSEEK  # noqa: E402
from interop.test_glm4_moe import HF_CASES as GLM  # noqa: E402
from interop.test_mellum import HF_CASES as MELLUM  # noqa: E402
from interop.test_sarvam_mla import HF_CASES as SARVAM_MLA  # noqa: E402
from interop.test_sarvam_moe import HF_CASES as SARVAM_MOE  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

CASES = {
    "deepseek_v3": (DEEPSEEK, "deepseek_v3-yarn-groups"),
    "glm4_moe": (GLM, "glm4_moe"),
    "mellum": (MELLUM, "mellum"),  # Qwen3-Next's names: mtp.fc, mtp.pre_fc_norm_*, mtp.norm, mtp.layers.0
    # DeepSeek-V3's and GLM-4.5's classes under other model_types (written as their own, not the layouts' export)
    "sarvam_mla": (SARVAM_MLA, "sarvam_mla"),
    "sarvam_moe": (SARVAM_MOE, "sarvam_moe"),
    # KDA and MLA layers, its MTP layer an MLA MoE one (MtpModel needs the config's MTP types, which archlab writes)
    "bailing_hybrid": (BAILING, "groups"),
}
# what a config must say of its MTP layers for transformers to build them (none of these checkpoints' configs do)
MTP_TYPES = {"bailing_hybrid": dict(mtp_layer_types=["full_attention"], mtp_mlp_layer_types=["sparse"])}
LAYERS = [case for case in CASES if FAMILIES[case].mtp_scheme == "layers"]


def hf_main(case, seed):
    cases, name = CASES[case]
    return parity.hf_case(cases, name, seed, **EAGER).eval()


def reference(hf_model, mtp, idx):
    """transformers' logits of the model and of its first MTP layer over ``idx`` (module 1 at position i
    reads the state of i and token i + 1)."""
    with torch.no_grad():
        out = hf_model(idx, output_hidden_states=True)
        positions = torch.arange(idx.shape[1])[None].expand(idx.shape[0], -1)
        states = mtp.forward_layer(0, out.hidden_states[-1][:, :-1], positions[:, 1:], None, input_ids=idx[:, 1:])
        return out.logits, mtp._project_to_logits(states)


def archlab_logits(model, idx):
    """archlab's logits of the model and of its first module over ``idx``."""
    with torch.no_grad():
        h = model.hidden(idx)
        module = model.mtp.depths[0]
        x = module.enter(model.embed(idx[:, 1:]), h[:, :-1])
        state = module.norm(model.run(x, [(module.block, model.mtp_position, None)], None, None, None, None))
        return model.logits(h), model.logits(state)


def load_mtp(case, path, n_layer):
    """transformers' model and ``MtpModel`` from a directory. DeepSeek's and GLM's classes name their MTP tensors
    by the published layer count (DeepSeek-V3's ``model\\.layers\\.61``): the tiny model's is set in its place."""
    cases, name = CASES[case]
    hf_model = getattr(transformers, cases[name][0]).from_pretrained(str(path), **EAGER).eval()
    if FAMILIES[case].mtp_scheme == "layers":
        hf_model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{n_layer}.*"]
    return hf_model, MtpModel.from_pretrained(hf_model).eval()


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_archlab_writes_is_read_by_transformers_mtp_model(case, tmp_path):
    cfg = with_depth(from_hf(hf_main(case, 3)).cfg, 1, FAMILIES[case].mtp_layer_kind)
    model = parity.randomize(build_model(cfg), 5).eval()
    save_hf_dir(model, tmp_path, family=case)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == case
    hf_model, mtp = load_mtp(case, tmp_path, cfg.n_layer)
    idx = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    for ours, theirs in zip(archlab_logits(model, idx), reference(hf_model, mtp, idx)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    back = load_hf_dir(tmp_path)
    assert back.cfg.head.mtp.depth == 1
    parity.assert_same_tensors(model, back)


def checkpoint_names(mtp, n_layer):
    """``MtpModel``'s tensors by the names DeepSeek-V3's checkpoints give them: layer ``n_layer``, its block's
    tensors beside enorm, hnorm, eh_proj and shared_head.norm, the experts one tensor per expert and matrix."""
    out = {}
    for name, t in mtp.state_dict().items():
        if not name.startswith("layers.0."):
            continue  # the embedding and head, the model's own
        rest = name.removeprefix("layers.0.").removeprefix("mtp_block.").replace("post_norm.", "shared_head.norm.")
        key = f"model.layers.{n_layer}.{rest}"
        if rest.endswith("experts.gate_up_proj"):
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[key.replace("gate_up_proj", f"{e}.gate_proj.weight")] = t[e, :half].clone()
                out[key.replace("gate_up_proj", f"{e}.up_proj.weight")] = t[e, half:].clone()
        elif rest.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                out[key.replace("down_proj", f"{e}.down_proj.weight")] = t[e].clone()
        else:
            out[key] = t.clone()
    return out


@pytest.mark.parametrize("case", LAYERS)
def test_a_checkpoint_with_its_mtp_layer_loads_with_transformers_logits(case, tmp_path):
    from safetensors.torch import load_file, save_file

    hf_model = hf_main(case, 4)
    hf_model.config.num_mtp_layers = 1  # the count its checkpoints' config gives
    for key, value in MTP_TYPES.get(case, {}).items():
        setattr(hf_model.config, key, value)
    mtp = parity.randomize(MtpModel(hf_model, 1), 6).eval()
    mtp.tie_with_main_model(hf_model)  # the embedding and head drawn with the model's
    hf_model.save_pretrained(str(tmp_path))
    L = hf_model.config.num_hidden_layers
    tensors = checkpoint_names(mtp, L)
    tensors[f"model.layers.{L}.embed_tokens.weight"] = hf_model.model.embed_tokens.weight.detach().clone()
    tensors[f"model.layers.{L}.shared_head.head.weight"] = hf_model.lm_head.weight.detach().clone()
    file = tmp_path / "model.safetensors"
    save_file({**load_file(str(file)), **tensors}, str(file), metadata={"format": "pt"})
    model = load_hf_dir(tmp_path).eval()
    assert model.cfg.head.mtp.depth == 1
    idx = torch.randint(0, model.cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    for ours, theirs in zip(archlab_logits(model, idx), reference(hf_model, mtp, idx)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
    # the modules draft for speculative decoding: the tokens are greedy decoding's
    prompt = idx[:, :5]
    assert torch.equal(speculate(model, prompt, 8).ids, generate(model, prompt, 8, temperature=0.0))


def test_a_copy_that_is_not_the_models_embedding_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    cfg = with_depth(from_hf(hf_main("deepseek_v3", 3)).cfg, 1)
    save_hf_dir(parity.randomize(build_model(cfg), 5), tmp_path)
    file = tmp_path / "model.safetensors"
    held = load_file(str(file))
    held[f"model.layers.{cfg.n_layer}.embed_tokens.weight"] += 1.0
    save_file(held, str(file), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="embed_tokens"):
        load_hf_dir(tmp_path)


def test_a_checkpoint_without_its_mtp_layers_loads_without_modules(tmp_path):
    hf_model = hf_main("deepseek_v3", 3)
    assert hf_model.config.num_mtp_layers == 1  # the config counts one; save_pretrained drops its tensors
    hf_model.save_pretrained(str(tmp_path))
    assert load_hf_dir(tmp_path).cfg.head.mtp.depth == 0


@pytest.mark.parametrize("case", ["qwen3_next", "qwen3_5"])
def test_qwen3_next_s_mtp_layer_is_written_by_its_names_and_read_back(case, tmp_path):
    """Qwen3-Next's and Qwen3.5's mtp.* (transformers holds no MTP of them): the names their checkpoints and
    vLLM's loader use, ``mtp_num_hidden_layers``, a gated full-attention block (MoE or dense), and the round
    trip bit for bit."""
    from safetensors.torch import load_file

    from interop.test_qwen3_5 import hf_model as qwen3_5
    from interop.test_qwen3_next import hf_model as qwen3_next

    hf_model = qwen3_next("mixed") if case == "qwen3_next" else qwen3_5("dense")
    cfg = with_depth(from_hf(hf_model).cfg, 1)
    model = parity.randomize(build_model(cfg), 5).eval()
    save_hf_dir(model, tmp_path)
    names = {k for k in load_file(str(tmp_path / "model.safetensors")) if k.startswith("mtp.")}
    parts = {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"}
    assert parts <= names and "mtp.layers.0.self_attn.q_proj.weight" in names
    if case == "qwen3_next":  # its experts one tensor each, as saved
        assert "mtp.layers.0.mlp.experts.0.gate_proj.weight" in names
    assert not {n for n in names if n.startswith("mtp.layers.1.")}
    assert json.loads((tmp_path / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    back = load_hf_dir(tmp_path)
    assert back.cfg.head.mtp.depth == 1 and back.mtp.depths[0].block.attn.gate is not None
    parity.assert_same_tensors(model, back)
    prompt = torch.randint(0, cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    assert torch.equal(speculate(back.eval(), prompt, 6).ids, generate(back, prompt, 6, temperature=0.0))
