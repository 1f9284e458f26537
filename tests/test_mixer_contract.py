"""The contract every token mixer passes by being registered in ``MIXERS``: each test runs once per
registered kind (``MIXERS.names()``, read at collection), at the tiny sizes its line in
``helpers.mixers.TINY`` gives (else its defaults), and each checks against an independent expectation: cached decoding (a
prefill, a chunk, then token by token) against the full forward; a left-padded batch against each prompt
alone; packed documents against each document alone; float32 gradients against the float64 model's, and those against central differences; the closed-
form counts and cache size against the built model and a meta build; the μP roles against every parameter
held; a hybrid layout beside another mixer (all of the above again), and the mixer given to every layer
by a layer kind over another mixer's model against the model of it; and tests/test_properties.py's
generator drawing the kind. Weights are redrawn far from their init (``helpers.mixers.randomise``); models
run in float64 where two computations must agree to rounding.

A new mixer gets all of this by registering (a line in ``TINY`` only where its defaults are too large)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import cast

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import (
    TINY,
    decode_in_pieces,
    hybrid_config,
    layered_config,
    mixer_config,
    partner,
    randomise,
    tiny_attention,
)
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample, Unsatisfiable

from archlab import build_model
from archlab.accounting import COMPONENTS, built_counts, count, kv_cache_bytes
from archlab.build import compose
from archlab.config import ModelConfig
from archlab.config.layers import layer_configs, layer_kind
from archlab.generate import generate
from archlab.nn.component import Component, Role
from archlab.nn.mixers.base import MIXERS
from archlab.nn.model import document_positions
from archlab.nn.validation import validate
from archlab.training.parametrization import roles

pytestmark = pytest.mark.usefixtures("single_thread")

KINDS = sorted(MIXERS.names())
# parameters the loss cannot reach, by mixer: qsa's indexer picks keys by a top-k, as Qwen4-Exp's does
UNREACHED = {"qsa": ".attn.indexer."}
# float64: the cached and the full forward run the same ops in another order, so they agree to rounding
# (~1e-15 relative); 1e-10 of the logits' scale leaves room and catches any real difference
TIGHT = 1e-10
T = 12  # = the context: a prefill of 7 crosses a scan chunk of 5, and 3 + 6 crosses two


def model_of(cfg, seed: int = 0, dtype=torch.float64):
    return randomise(build_model(cfg, dtype=dtype), seed).eval()


def ids(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 48, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_tight(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=TIGHT, atol=TIGHT * expected.abs().max().item())


def uncached_greedy(model, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy continuation recomputing the whole sequence at every step: no cache, no mask."""
    with torch.no_grad():
        for _ in range(steps):
            prompt = torch.cat((prompt, model(prompt)[:, -1].argmax(-1, keepdim=True)), dim=1)
    return prompt


# ---- what a registered mixer must provide ----


@pytest.mark.parametrize("kind", KINDS)
def test_every_registered_mixer_builds_at_its_tiny_sizes(kind):
    """Its TINY line, or its defaults with 4 heads, is a valid model alone and in a hybrid."""
    validate(mixer_config(kind))
    validate(hybrid_config(kind))


def test_the_table_names_only_registered_mixers():
    assert not set(TINY) - set(KINDS), f"TINY has lines for kinds no longer registered: {set(TINY) - set(KINDS)}"


# ---- 1. cached decoding = the full forward ----


def check_cached_decoding(model) -> None:
    """Logits fed through the cache in pieces (a prefill of 7, then one token at a time; a prefill of 3,
    a chunk of 6, then one at a time) equal the full forward; greedy ``generate`` (the cache) equals
    greedy decoding recomputing everything."""
    idx = ids(2, T, seed=1)
    with torch.no_grad():
        full = model(idx)
    assert full.abs().max() > 1  # random weights: logits far from any that a broken model would give too
    for cuts in ([7, 8, 9, 10, 11, 12], [3, 9, 10, 11, 12]):
        assert_tight(decode_in_pieces(model, idx, cuts), full)
    assert torch.equal(generate(model, idx[:, :4], 8), uncached_greedy(model, idx[:, :4], 8))


@pytest.mark.parametrize("kind", KINDS)
def test_cached_decoding_equals_the_full_forward(kind):
    check_cached_decoding(model_of(mixer_config(kind)))


# ---- 2. a left-padded batch = each prompt alone ----


def check_padded_batch(model) -> None:
    """Prompts of 2, 7 and 5 tokens left-padded to 7 with random ids (5 pads: more than a convolution's 3
    cached inputs, before a prompt shorter than them) and their mask, as ``generate`` takes them: each row
    generates what its prompt generates alone, and its logits at every position through the cache (the
    prefill, then the generated tokens one at a time) equal the full forward of its own tokens alone."""
    lengths, width, new = (2, 7, 5), 7, T - 7
    prompts = [ids(1, n, seed=10 + n) for n in lengths]
    batch = torch.cat([torch.cat((ids(1, width - n, seed=20 + n), p), dim=1) for n, p in zip(lengths, prompts)])
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    together = generate(model, batch, new, attention_mask=mask)
    full_mask = torch.cat((mask, torch.ones(len(lengths), new, dtype=torch.long)), dim=1)
    steps = decode_in_pieces(model, together, [width, *range(width + 1, T + 1)], full_mask)
    for row, (n, prompt) in enumerate(zip(lengths, prompts)):
        pad = width - n
        assert torch.equal(together[row, pad:], generate(model, prompt, new)[0]), f"row {row} (prompt of {n})"
        with torch.no_grad():
            alone = model(together[row : row + 1, pad:])[0]
        assert_tight(steps[row, pad:], alone)


@pytest.mark.parametrize("kind", KINDS)
def test_a_left_padded_batch_computes_each_prompt_as_alone(kind):
    check_padded_batch(model_of(mixer_config(kind)))


# ---- 2a. under a per-head bias (ALiBi's) ----


@pytest.mark.parametrize("kind", KINDS)
def test_under_a_per_head_bias_decoding_and_padding_hold_or_it_is_refused(kind):
    """With ALiBi the mask is a bias per head ([H, T, S], per row [B, H, T, S]): cached decoding and a
    left-padded batch hold as in 1 and 2, or the mixer refuses the scheme naming model.position.kind (moa,
    dsa and qsa took the bias's heads for the batch or for their own query heads: make explore found it)."""
    from archlab import ConfigError

    try:
        model = model_of(mixer_config(kind, position={"kind": "alibi"}))
    except ConfigError as refused:
        assert refused.field == "model.position.kind", refused
        return
    check_cached_decoding(model)
    check_padded_batch(model)


# ---- 2b. packed documents = each document alone ----


def check_packed_documents(model) -> None:
    """Two rows of 12 tokens packing documents of 3, 5 and 4, and of 1, 6 and 5 (a one-token document; one
    that crosses a scan chunk of 5), with their document ids and positions restarting per document, as
    data.document_mask and reset_positions give them: each document's logits equal its own run alone (a
    recurrent layer's state and convolution start empty at each document)."""
    lengths = ((3, 5, 4), (1, 6, 5))
    rows = [[ids(1, n, seed=30 + 7 * r + i) for i, n in enumerate(row)] for r, row in enumerate(lengths)]
    documents = torch.tensor([[i for i, n in enumerate(row) for _ in range(n)] for row in lengths])
    with torch.no_grad():
        logits = model(
            torch.cat([torch.cat(row, dim=1) for row in rows]),
            document_ids=documents,
            position_ids=document_positions(documents),
        )
        for r, row in enumerate(rows):
            starts = [0, *torch.tensor([d.shape[1] for d in row]).cumsum(0).tolist()]
            for doc, start, end in zip(row, starts, starts[1:]):
                assert_tight(logits[r, start:end], model(doc)[0])


@pytest.mark.parametrize("kind", KINDS)
def test_packed_documents_are_each_computed_as_alone(kind):
    check_packed_documents(model_of(mixer_config(kind)))


# ---- 3. gradients against a float64 reference ----


def cross_entropy_of(model, idx: torch.Tensor) -> torch.Tensor:
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())


def loss_of(model, idx: torch.Tensor) -> torch.Tensor:
    """The training loss: the cross-entropy plus the layers' weighted auxiliary losses (dsa's indexer
    learns from its own alone)."""
    loss = cross_entropy_of(model, idx)
    return loss + sum((w * aux for w, aux in model.auxiliary_losses().values()), torch.zeros(()))


@pytest.mark.parametrize("kind", KINDS)
def test_float32_gradients_equal_the_float64_models(kind):
    """The float32 model's gradient of every parameter equals the same weights' in float64 within float32
    rounding; every one of them is nonzero (each parameter reaches the loss, but those ``UNREACHED``); and in float64 the gradient
    of each of the mixer's parameters is the loss's derivative: a central difference along a random
    direction in that parameter alone, of the cross-entropy for its own gradient (an auxiliary loss may
    read its inputs detached, as dsa's indexer loss does: its gradient is no derivative of the sum)."""
    model32 = model_of(mixer_config(kind), dtype=None).train()
    model64 = copy.deepcopy(model32).double()
    idx = ids(2, T + 1, seed=2)
    loss_of(model32, idx).backward()
    loss_of(model64, idx).backward()
    for (name, p32), p64 in zip(model32.named_parameters(), model64.parameters()):
        if kind in UNREACHED and UNREACHED[kind] in name:
            assert p32.grad is None and p64.grad is None, name
            continue
        assert p32.grad is not None and p64.grad is not None, name
        g32, g64 = p32.grad.double(), p64.grad
        scale = g64.abs().max().item()
        assert scale > 0, f"{name}: no gradient"
        # float32 rounding through a 2-layer model, of each tensor's largest: measured at most 5e-5 (mamba2),
        # 6e-6 the others; a wrong gradient is off by its own size
        torch.testing.assert_close(g32, g64, rtol=0, atol=1e-3 * scale, msg=lambda m, n=name: f"{n}: {m}")
    model64.zero_grad()
    cross_entropy_of(model64, idx).backward()
    mixer = model64.blocks[0].attn
    generator = torch.Generator().manual_seed(3)
    eps = 1e-6
    for name, p in mixer.named_parameters():
        direction = torch.randn(p.shape, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            p.add_(eps * direction)
            up = cross_entropy_of(model64, idx).item()
            p.sub_(2 * eps * direction)
            down = cross_entropy_of(model64, idx).item()
            p.add_(eps * direction)
        expected = (up - down) / (2 * eps)
        got = 0.0 if p.grad is None else (p.grad * direction).sum().item()  # None: the cross-entropy has none
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-9), name


@pytest.mark.parametrize("kind", KINDS)
def test_a_bf16_mixed_step_follows_the_float32_one(kind):
    """Under bf16 autocast (``trainer.precision=bf16-mixed``, and ``auto`` on a CPU with native bf16) the
    forward and backward run, the loss is the float32 model's within bf16 rounding, and every parameter's
    gradient is finite and points the float32 one's way: cosine above 0.7 (measured: at least 0.97 for every
    mixer but gated_deltanet, 0.75 there, its first layer's norm and convolution: the randomised weights
    make its rule sensitive to the bf16 projection and convolution feeding it; a broken backward gives ~0)."""
    model = model_of(mixer_config(kind), dtype=None).train()
    idx = ids(2, T + 1, seed=4)
    loss32 = loss_of(model, idx)
    grads32 = torch.autograd.grad(loss32, list(model.parameters()), allow_unused=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss16 = loss_of(model, idx)
    grads16 = torch.autograd.grad(loss16, list(model.parameters()), allow_unused=True)
    assert loss16.item() == pytest.approx(loss32.item(), rel=2e-2)
    for (name, _), g32, g16 in zip(model.named_parameters(), grads32, grads16):
        if g32 is None:
            continue
        assert g16 is not None and torch.isfinite(g16).all(), name
        cosine = F.cosine_similarity(g16.double().flatten(), g32.double().flatten(), dim=0).item()
        assert cosine > 0.7, f"{name}: {cosine}"


# ---- 4. the closed-form counts = the built model = a meta build ----


@pytest.mark.parametrize("kind", KINDS)
def test_the_closed_form_counts_equal_the_built_and_the_meta_model(kind):
    """``count`` per component equals ``built_counts`` of the model built on the meta device (its own
    check on) and on the CPU (check off: this is the comparison), and each layer's mixer holds exactly
    its entry's ``num_params``."""
    cfg = mixer_config(kind)
    analytic = count(cfg)
    for device, check in (("meta", True), ("cpu", False)):
        model = build_model(cfg, device=device, check=check)
        built = built_counts(model)
        assert {c: built[c] for c in COMPONENTS} == {c: analytic[c] for c in COMPONENTS}, device
        assert sum(p.numel() for p in model.parameters()) == analytic["total"], device
        for i, (block, c) in enumerate(zip(model.blocks, layer_configs(cfg))):
            assert sum(p.numel() for p in block.attn.parameters()) == MIXERS.get(kind).num_params(c, i), (device, i)


@pytest.mark.parametrize("kind", KINDS)
def test_the_cache_holds_what_its_closed_form_counts(kind):
    """After 3 and after 12 tokens through a cache of that length, the tensors it holds (float64: 8 bytes a
    value) are ``kv_cache_bytes``'s count."""
    cfg = mixer_config(kind)
    model = build_model(cfg, dtype=torch.float64).eval()
    for length in (3, T):
        cache = model.new_cache(1, length)
        with torch.no_grad():
            model(ids(1, length, seed=4), cache)
        held = [t for t in (*cache.k, *cache.v, *cache.conv_state, *cache.recurrent_state) if t is not None]
        assert sum(t.numel() * t.element_size() for t in held) == kv_cache_bytes(cfg, length, 8), length


# ---- 5. every parameter has a μP role ----


@pytest.mark.parametrize("kind", KINDS)
def test_every_parameter_of_the_mixer_has_a_mup_role(kind):
    """The mixer's ``param_roles`` names every parameter it holds itself (those of a child entry, a
    QK-norm or latent norm, are that entry's to name), each a ``Role``; and ``param=mup``'s gathering
    (``training.parametrization.roles``) finds a role for every parameter of the model."""
    model = build_model(mixer_config(kind))
    for i, block in enumerate(model.blocks):
        mixer = block.attn
        declared = mixer.param_roles()
        assert declared is not None, f"{kind} declares no μP roles"
        children = [f"{n}." for n, m in mixer.named_modules() if n and isinstance(m, Component)]
        own = [n for n, _ in mixer.named_parameters() if not n.startswith(tuple(children))]
        assert own or children, kind  # a mixer of two entries (parallel) holds none itself
        missing = [n for n in own if n not in declared]
        assert not missing, f"{kind} (layer {i}) declares no μP role for {missing}"
        assert all(isinstance(declared[n], Role) for n in own)
    assert set(roles(model)) == {id(p) for p in model.parameters()}


# ---- 6. the mixer inside a hybrid layout ----


@pytest.mark.parametrize("kind", KINDS)
def test_the_mixer_in_a_hybrid_layout(kind):
    """3 layers by ``model.layers``, the mixer, its partner (causal; for causal another kind), the mixer:
    each layer the kind asked, the closed-form counts equal to the built model's, and cached decoding, a
    left-padded batch and packed documents as above."""
    cfg = hybrid_config(kind)
    assert [c.attention.kind for c in layer_configs(cfg)] == [kind, partner(kind), kind]
    analytic, model = count(cfg), build_model(cfg, dtype=torch.float64, check=False)
    assert {c: built_counts(model)[c] for c in COMPONENTS} == {c: analytic[c] for c in COMPONENTS}
    model = randomise(model, seed=5).eval()
    check_cached_decoding(model)
    check_padded_batch(model)
    check_packed_documents(model)


def same_weights_same_logits(cfg, reference_cfg) -> None:
    """Built from ``cfg``, with the weights of the model of ``reference_cfg`` (randomised), the logits of
    that model, to float64 rounding."""
    reference = model_of(reference_cfg, seed=6)
    model = build_model(cfg, dtype=torch.float64).eval()
    model.load_state_dict(reference.state_dict())
    idx = ids(2, T, seed=7)
    with torch.no_grad():
        assert_tight(model(idx), reference(idx))


PAIRS = [(kind, host) for kind in KINDS for host in KINDS if host != kind]


@pytest.mark.parametrize("kind,host", PAIRS, ids=[f"{kind}-over-{host}" for kind, host in PAIRS])
def test_a_layer_kind_of_the_mixer_computes_what_a_model_of_it_computes(kind, host):
    """Every layer given the mixer by a layer kind over a model whose own mixer is another (the kind swaps
    the mixer whole: its own fields alone) computes, with the same weights, what
    the model whose own attention is the mixer computes: a kind's layers take the position scheme built for
    their own heads (RoPE over mla's 4 rotated dims among causal heads of 8, over a causal kind's 8 in a
    model whose own mixer takes no rotation)."""
    layered = layered_config({"mixer": {"attention": tiny_attention(kind)}}, ["mixer"], attention=tiny_attention(host))
    same_weights_same_logits(layered, mixer_config(kind))


@pytest.mark.parametrize(
    "position,attention",
    [({"kind": "rope"}, {"head_dim": 16}), ({"kind": "rope"}, {"head_dim": 4}), ({"kind": "alibi"}, {"n_head": 2})],
    ids=["rope-wider-heads", "rope-narrower-heads", "alibi-fewer-heads"],
)
def test_a_causal_layer_kind_of_other_heads_computes_what_a_model_of_them_computes(position, attention):
    """The same for causal layers whose kind changes what the scheme reads: RoPE rotates all of a 16- or
    4-dim head (the model's heads: 8), ALiBi draws a slope per head of 2 (the model's: 4)."""
    attention = {"n_kv_head": 1} | attention
    layered = layered_config({"other": {"attention": attention}}, ["other"], position=position)
    same_weights_same_logits(layered, mixer_config("causal", position=position, attention=attention))


# ---- 7. the property tests draw it ----


EXAMPLES = 500  # the most draws searched for a config of a kind that the model accepts


def mixers_of(raw: dict) -> set[str]:
    """The mixer of each layer of a drawn config, read from the dict (a layer kind's ``attention.kind``,
    else the model's), its layers laid out by ``layer_kind`` as the model lays them out."""
    model = raw["attention"].get("kind", "causal")
    layers = raw.get("layers") or {}
    layout = SimpleNamespace(
        layers=SimpleNamespace(first=layers.get("first") or [], pattern=layers.get("pattern") or [])
    )
    kinds = layers.get("kinds") or {}
    names = (layer_kind(cast(ModelConfig, layout), i) for i in range(raw["n_layer"]))
    return {model if name is None else kinds[name].get("attention", {}).get("kind", model) for name in names}


@pytest.mark.parametrize("kind", KINDS)
def test_the_property_tests_draw_the_mixer(kind):
    """tests/test_properties.py's ``model_configs`` draws the kind (the model's mixer, or a layer kind's from
    ``SWAPPED``, every registered mixer but those two) in a config the model accepts: searched for among its
    draws of that mixer (derandomised, so the same every run). Unconditioned, a swapped mixer is one of ~20
    choices of a layer kind, a few thousand draws apart: conditioning finds the same configs in far fewer."""
    from test_properties import model_configs

    search = settings(
        max_examples=EXAMPLES,
        database=None,
        derandomize=True,
        phases=[Phase.generate],  # the first config found: no shrinking
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    try:
        find(model_configs(mixer=kind), lambda raw: kind in mixers_of(raw), settings=search)
    except (NoSuchExample, Unsatisfiable):  # none drawn, or every draw of it refused
        pytest.fail(
            f"tests/test_properties.py's model_configs drew mixer {kind!r} in no config the model accepts in "
            f"{EXAMPLES} draws: add it to the kinds it samples (the model's attention, or a layer kind's through "
            "mixers()), with fields the model accepts (mixers() draws a kind's own where its defaults do not fit)"
        )


@pytest.mark.parametrize("kind", KINDS)
def test_its_group_option_selects_it(kind):
    """``model/attention=<kind>`` composes the mixer: by its YAML file, or by the option ``config.store`` holds
    for a registered mixer without one."""
    assert compose("check", [f"model/attention={kind}"]).model.attention.kind == kind
