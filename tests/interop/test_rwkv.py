"""Hugging Face parity of RWKV-4 (RwkvForCausalLM; archlab/interop/families/rwkv.py): archlab's ``rwkv4`` time-mix
and ``rwkv_channel_mix`` MLP. Tiny random models (every parameter redrawn: decays, bonuses, token-shift mixes,
LayerNorm scales and biases away from their init) give transformers' float32 logits, untied and tied, the
channel-mix at its own width; HF -> archlab -> HF -> archlab is bit for
bit and save_pretrained directories round trip; greedy decoding equals HF ``generate``; the refusals."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import NO_TOKENS, V

from archlab import build_model, count_params
from archlab.generate import generate
from archlab.interop.families.mlps import mlp_section
from archlab.interop.hf import FAMILIES, config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# width 32, 2 layers (fewer than rescale_every: HF's eval is its training form), WKV 32, channel-mix 128; no
# attention_hidden_size apart from hidden_size: transformers' state is hidden_size wide, so its cached forward fails
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, context_length=16, **NO_TOKENS)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "rwkv": ("RwkvForCausalLM", "RwkvConfig", SMALL),
    "rwkv-narrow-tied": (
        "RwkvForCausalLM",
        "RwkvConfig",
        dict(SMALL, num_hidden_layers=3, intermediate_size=72, tie_word_embeddings=True),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name; generation below, row by row
STANDARD = ("test_the_family_converts_both_ways",)
globals().update(parity.family_tests(hf_model, HF_CASES, only=STANDARD))


def hf_alone(hf, prompt: list[int], new: int):
    """HF ``generate``'s greedy continuation of ``prompt`` as a batch of one, with the logits it decoded with:
    transformers' one-token RWKV step broadcasts a batch's shifted tokens [B, d] against [B, 1, d] (rows mix
    for B > 1), and its forward ignores the attention mask (padding would be read as tokens)."""
    ids = torch.tensor([prompt])
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new,
        do_sample=False,
        return_dict_in_generate=True,
        output_logits=True,
    )
    return out.sequences[0], torch.cat(out.logits)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_greedy_generation_of_a_batch_equals_hf_generate_row_by_row(case):
    """Two 5-token prompts decoded 20 tokens as one batch through archlab's cache: each row's tokens and its
    logits at every step equal HF ``generate`` on that prompt alone."""
    hf = hf_model(case, seed=4)
    model = from_hf(hf)
    ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(5))
    got = generate(model, ids, max_new_tokens=20)
    cache, steps = model.new_cache(2, 25), []
    with torch.no_grad():
        for start, end in [(0, 5), *((t, t + 1) for t in range(5, 24))]:
            steps.append(model(got[:, start:end], cache)[:, -1])
    for row in range(2):
        want, want_logits = hf_alone(hf, ids[row].tolist(), 20)
        assert torch.equal(got[row], want)
        assert parity.max_diff(torch.stack(steps, 1)[row], want_logits) <= parity.TOL


@pytest.mark.parametrize("case", list(HF_CASES))
def test_left_padded_generation_equals_hf_generate_of_each_prompt_alone(case):
    """Prompts of 7, 3 and 5 tokens left-padded into one batch with their attention mask: archlab's greedy
    continuation of each row is HF ``generate``'s of the prompt alone (the token shift sees zeros before the
    first token, the WKV state stays empty through the padding)."""
    hf = hf_model(case, seed=4)
    model = from_hf(hf)
    prompts = [torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (7, 3, 5)]
    ids = torch.tensor([[0] * (7 - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (7 - len(p)) + [1] * len(p) for p in prompts])
    got = generate(model, ids, max_new_tokens=12, attention_mask=mask)
    for row, prompt in enumerate(prompts):
        want, _ = hf_alone(hf, prompt, 12)
        assert torch.equal(got[row, 7 - len(prompt) :], want)


def test_from_hf_reads_the_parts():
    plain = config_from_hf(parity.hf_config(HF_CASES, "rwkv"))
    a, m = plain.attention, plain.mlp
    assert (a.kind, a.width, m.kind, m.d_ff, plain.head.tied) == ("rwkv4", None, "rwkv_channel_mix", None, False)
    assert (plain.norm.kind, plain.norm.bias, plain.embedding_norm, plain.position.kind) == (
        "layernorm",
        True,
        True,
        "none",
    )
    wide = config_from_hf(parity.hf_config(HF_CASES, "rwkv-narrow-tied"))
    assert (wide.attention.width, wide.mlp.d_ff, wide.head.tied) == (None, 72, True)


def test_a_final_norm_eps_apart_is_refused():
    """transformers' ln_out is at torch's 1e-5 whatever layer_norm_epsilon says: another eps is refused."""
    config = transformers.RwkvConfig(**SMALL, layer_norm_epsilon=1e-6)
    with pytest.raises(Exception, match="layer_norm_epsilon"):
        config_from_hf(config)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(norm__kind="rmsnorm"), "model.norm.kind"),
        (dict(norm__bias=False), "model.norm.bias"),
        (dict(norm__eps=1e-6), "model.norm.eps"),
        (dict(embedding_norm=False), "model.embedding_norm"),
        (dict(block__kind="post"), "model.block.kind"),
        (dict(head__bias=True), "model.head.bias"),
    ],
)
def test_the_record_refuses_what_it_does_not_hold(changes, field):
    parity.check_problem("rwkv", config_from_hf(parity.hf_config(HF_CASES, "rwkv")), field, **changes)


def test_another_mlp_is_refused():
    cfg = config_from_hf(parity.hf_config(HF_CASES, "rwkv"))
    cfg.mlp = mlp_section("relu2", d_ff=64)
    assert "model.mlp.kind" in {p.field for p in FAMILIES["rwkv"].problems(cfg)}


@pytest.mark.parametrize("every", [1, 2])
def test_rescale_every_is_transformers_training_form(every):
    """4 layers halved every 1 or 2 blocks: HF in training mode (no rescaling) gives archlab's logits; HF in eval
    differs (the halvings move its LayerNorms' eps), and written back rescale_every is 0, whose eval is archlab's."""
    cases = {"x": ("RwkvForCausalLM", "RwkvConfig", dict(SMALL, num_hidden_layers=4, rescale_every=every))}
    hf = parity.hf_case(cases, "x", 1)
    model = from_hf(hf)  # before HF's first eval forward, which divides its weights in place
    assert parity.max_diff(parity.logits(hf.train()), parity.logits(model)) <= parity.TOL
    assert parity.max_diff(parity.logits(hf.eval()), parity.logits(model)) > 1e-4
    back = parity.to_hf(model)
    assert back.config.rescale_every == 0
    assert parity.max_diff(parity.logits(back.eval()), parity.logits(model)) <= parity.TOL


def test_the_default_config_counts_alike_three_ways():
    """RwkvConfig()'s defaults (hidden 4096, 32 layers, vocabulary 50277, untied: a 7B layout, not the
    rwkv-4-169m-pile its docstring names, so no preset): archlab's closed form, a meta build and transformers'
    meta model all count 7,392,649,216 parameters."""
    config = transformers.RwkvConfig()
    cfg = config_from_hf(config)
    with torch.device("meta"):
        theirs = sum(p.numel() for p in transformers.RwkvForCausalLM(config).parameters())
    ours = sum(p.numel() for p in build_model(cfg, device="meta").parameters())
    assert count_params(cfg)["total"] == ours == theirs == 7_392_649_216
