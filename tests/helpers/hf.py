"""What the Hugging Face parity tests (tests/interop/test_<family>.py) share: the tiny sizes, fully
randomised weights, logits, the checks every family passes (HF's logits read, HF -> archlab -> HF ->
archlab, a shrunk preset or an archlab layout to HF and back, save_pretrained directories, a record that
holds a layout another family exports, the refusals naming a field), the check that a part moves the
logits, the two generation checks against HF ``generate``, cached decoding against HF's full forward (a
Mamba-2 layer's time-step clamp, which HF's own decoding step ignores), and the MoE routing against HF's.
Each family file holds its cases, binds the standard tests ``family_tests`` builds
over them, and calls these from its own family-specific tests. transformers is imported only
inside the functions that build its models."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from archlab import ConfigError, ModelConfig, build_model, compose_model, count_params
from archlab.config import MLP_OPTIONS, to_model_config
from archlab.config.layers import layer_configs
from archlab.generate import generate
from archlab.interop.hf import from_hf, hf_family, load_hf_dir, save_hf_dir, to_hf
from archlab.nn.moe import MoE
from archlab.nn.validation import validate

TOL = 1e-4  # max abs logit difference allowed (float32)
V, CTX, WINDOW = 96, 64, 4
IDS = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(0))  # 12 > WINDOW
LONG_IDS = torch.randint(
    0, V, (2, 24), generator=torch.Generator().manual_seed(3)
)  # past Phi-3's LongRoPE switch at 16
ATTN = dict(attn_implementation="eager")  # transformers' eager attention
EAGER = dict(ATTN, experts_implementation="eager")  # and its plain per-expert loop (the MoE families)
NO_TOKENS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
HF_SIZES = dict(vocab_size=V, max_position_embeddings=CTX, hidden_size=64)  # every tiny HF config's
SMALL = dict(HF_SIZES, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)  # a dense one's
# archlab overrides of the same sizes: a preset shrunk (TINY), its 4 heads grouped in 2 (GQA), LLaMA's layout
TINY = ["model.vocab_size=96", "model.context_length=64", "model.n_layer=2", "model.mlp.d_ff=96"]
GQA = ["model.d_model=64", "model.attention.n_head=4", "model.attention.n_kv_head=2"]
LLAMA = ["model=llama2-7b", *TINY, *GQA]
WIDTHS = ["model.vocab_size=96", "model.context_length=64", "model.mlp.d_ff=96", *GQA]  # TINY's and GQA's but the depth


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter redrawn: matrices, tables and stacked experts N(0, 0.2²); vectors (biases, norm
    scales or Gemma's scale offsets) 0.5 + N(0, 0.3²); a router correction-bias buffer (HF
    ``e_score_correction_bias``, archlab ``router_bias``) N(0, 0.3²), of the size of the sigmoid scores'
    spread, so it moves the choice; Gemma 4's ``layer_scalar`` buffers as vectors. A tied tensor is listed, so drawn, once."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        for name, b in model.named_buffers():
            if name.endswith(("e_score_correction_bias", "router_bias")):
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)
            elif name.endswith("layer_scalar"):  # Gemma 4's fixed multiplier per layer, drawn as a norm scale
                b.copy_(torch.randn(b.shape, generator=g) * 0.3 + 0.5)
    return model.eval()


def logits(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def hf_greedy(hf) -> tuple[torch.Tensor, Any]:
    """A seeded 5-token prompt of 2 rows, and HF ``generate``'s greedy output on it (20 new tokens, with the
    logits it decoded with)."""
    ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(5))
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=20,
        do_sample=False,
        return_dict_in_generate=True,
        output_logits=True,
    )
    return ids, out


def check_greedy_generation(hf, model=None) -> None:
    """20 new tokens after a 5-token prompt, past every window of 4: the same ids as HF ``generate``, and
    at every step archlab's logits through its KV cache equal the logits HF decoded with (a random model's
    greedy path may settle into a few tokens; the logits compare every step whatever it picks). ``model``:
    the archlab model to compare, by default ``from_hf(hf)``."""
    ids, out = hf_greedy(hf)
    model = from_hf(hf) if model is None else model
    got = generate(model, ids, max_new_tokens=20)
    assert got.shape == out.sequences.shape == (2, 25)
    assert torch.equal(got, out.sequences)
    cache, steps = model.new_cache(2, 25), []
    with torch.no_grad():
        for start, end in [(0, 5), *((t, t + 1) for t in range(5, 24))]:  # the prompt, then one token at a time
            steps.append(model(got[:, start:end], cache)[:, -1])
    assert max_diff(torch.stack(steps, 1), torch.stack(out.logits, 1)) <= TOL


def check_padded_generation(hf, model=None) -> None:
    """Prompts of 7, 3 and 5 tokens left-padded into one batch, with their attention mask: archlab's
    greedy continuation of each row, and its logits at every step, equal HF ``generate``'s on the same batch
    (``model`` as in ``check_greedy_generation``)."""
    prompts = [torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (7, 3, 5)]
    ids = torch.tensor([[0] * (7 - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (7 - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(
        ids, attention_mask=mask, max_new_tokens=12, do_sample=False, return_dict_in_generate=True, output_logits=True
    )
    model = from_hf(hf) if model is None else model
    got = generate(model, ids, max_new_tokens=12, attention_mask=mask)
    assert torch.equal(got, out.sequences)
    cache, steps = model.new_cache(3, 19), []
    with torch.no_grad():
        for start, end in [(0, 7), *((t, t + 1) for t in range(7, 18))]:
            steps.append(model(got[:, start:end], cache, torch.cat((mask, torch.ones(3, end - 7)), 1).long())[:, -1])
    assert max_diff(torch.stack(steps, 1), torch.stack(out.logits, 1)) <= TOL


def check_decoding_equals_hfs_full_forward_not_its_decoding(hf) -> None:
    """A 5-token prefill then one token at a time to 12: the logits through archlab's cache (``from_hf(hf)``)
    equal HF's full forward at every step, while HF's own cached decoding moves by more than 1e-2 (a
    Mamba-2 layer's ``time_step_limit``, which transformers' one-token step ignores)."""
    model = from_hf(hf)
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = hf(ids).logits
        cache, steps = model.new_cache(2, 12), []
        for start, end in [(0, 5), *((t, t + 1) for t in range(5, 12))]:
            steps.append(model(ids[:, start:end], cache))
        out = hf(ids[:, :5], use_cache=True)
        hf_cache, hf_steps = out.cache, [out.logits]
        for t in range(5, 12):
            out = hf(ids[:, t : t + 1], cache=hf_cache, use_cache=True)
            hf_cache = out.cache
            hf_steps.append(out.logits)
    assert max_diff(torch.cat(steps, 1), full) <= TOL
    assert max_diff(torch.cat(hf_steps, 1), full) > 1e-2


def changed_cfg(cfg, **fields):
    """A copy of archlab config ``cfg`` with ``fields`` set: ``attention__window=...`` on the model
    (``mlp__routing__top_k``: a sub-config's; a field the section has not is an error),
    ``kinds__nope__attention__qk_norm=...`` on (or added to) a layer kind (``kinds__nope__position__kind``:
    that option in place of the kind's section, as a kind naming another option swaps the part whole)."""
    cfg = copy.deepcopy(cfg)
    for key, value in fields.items():
        path = key.split("__")
        if path[0] == "kinds" and len(path) == 4 and path[-1] == "kind":
            cfg.layers.kinds[path[1]][path[2]] = {"kind": value}
        elif path[0] == "kinds":
            node = cfg.layers.kinds[path[1]]
            for name in path[2:-1]:
                node = node.setdefault(name, {})
            node[path[-1]] = value
        else:
            obj = cfg
            for name in path[:-1]:
                obj = getattr(obj, name)
            assert hasattr(obj, path[-1]), f"{key}: {type(obj).__name__} has no such field"
            setattr(obj, path[-1], value)
    return cfg


def hf_case(cases: dict[str, tuple], case: str, seed: int = 1, **impl: Any) -> Any:
    """The transformers model of ``cases[case]`` (model class, config class, config keys), built with the
    implementation settings ``impl`` and every parameter redrawn (``randomize``)."""
    import transformers

    model_class, config_class, keys = cases[case][:3]
    config = getattr(transformers, config_class)(**keys, **impl)
    return randomize(getattr(transformers, model_class)(config), seed)


def assert_same_tensors(model, other) -> None:
    """The two models hold the same tensor names, each bit for bit."""
    state, state_other = model.state_dict(), other.state_dict()
    assert state.keys() == state_other.keys()
    assert all(torch.equal(state[k], state_other[k]) for k in state)


def check_back_and_again(hf, model, **impl: Any):
    """archlab ``model`` (read from ``hf``) converts back to ``hf``'s class with the same logits, and from
    there to an archlab model with the same config and bit-identical tensors; gives the HF model back."""
    back = to_hf(model, **impl).eval()
    assert type(back) is type(hf)
    assert max_diff(logits(back), logits(model)) <= TOL
    again = from_hf(back)
    assert again.cfg == model.cfg
    assert_same_tensors(model, again)
    return back


def check_to_hf_and_back(model, expected_class: str, reference: Callable = lambda hf: hf, **impl: Any):
    """archlab ``model`` converts to HF class ``expected_class`` with the same logits (those of
    ``reference(hf)``), and back to archlab with every tensor bit for bit and the same counts; gives the HF
    model and the archlab model read back."""
    hf = to_hf(model, **impl).eval()
    assert type(hf).__name__ == expected_class
    assert max_diff(logits(model), logits(reference(hf))) <= TOL
    back = from_hf(hf)
    assert_same_tensors(model, back)
    assert count_params(back.cfg) == count_params(model.cfg)
    return hf, back


def check_directory_round_trip(
    hf, tmp_path: Path, loader: Any = None, edit: Callable[[Path], None] | None = None, **impl: Any
) -> None:
    """save_pretrained (then ``edit`` of the directory) -> load_hf_dir -> save_hf_dir -> ``loader``'s
    from_pretrained (by default transformers' AutoModelForCausalLM): ``hf``'s class and logits throughout."""
    import transformers

    hf.save_pretrained(tmp_path / "hf")
    if edit is not None:
        edit(tmp_path / "hf")
    model = load_hf_dir(tmp_path / "hf").eval()
    assert max_diff(logits(hf), logits(model)) <= TOL
    save_hf_dir(model, tmp_path / "again")
    loader = transformers.AutoModelForCausalLM if loader is None else loader
    back = loader.from_pretrained(tmp_path / "again", **impl).eval()
    assert type(back) is type(hf)
    assert max_diff(logits(hf), logits(back)) <= TOL


def check_changes_logits(model, cfg, what: str = "") -> None:
    """``model``'s weights in a model of config ``cfg`` (one part taken away) give other logits."""
    changed = build_model(cfg, device="meta")
    changed.load_state_dict(model.state_dict(), assign=True)
    assert max_diff(logits(changed.eval()), logits(model)) > 1e-3, what


def families_of_its_mixers(cfg) -> dict[str, Any]:
    """The families (by model_type) whose mixers hold every layer's of ``cfg``: the ones whose problems go
    beyond the mixer (a family of other mixers names the mixer alone)."""
    from archlab.interop.families import FAMILIES

    return {name: f for name, f in FAMILIES.items() if not f.mixer_problems(cfg)}


def families_holding(cfg, fields: set[str]) -> set[str]:
    """The families of ``cfg``'s mixers (``families_of_its_mixers``) whose problems with ``cfg`` name none of
    ``fields``: those that hold the part the fields set."""
    families = families_of_its_mixers(cfg)
    return {name for name, family in families.items() if not fields & {p.field for p in family.problems(cfg)}}


def hf_config(cases: dict[str, tuple], case: str, **changes: Any) -> Any:
    """The transformers config of ``cases[case]`` (model class, config class, config keys, ...), ``changes``
    set over its keys."""
    import transformers

    config_class, keys = cases[case][1:3]
    return getattr(transformers, config_class)(**{**keys, **changes})


def check_from_hf(hf, family: str | None = None, ids: tuple[torch.Tensor, ...] = (IDS,)):
    """``from_hf(hf)`` gives HF's logits (on each of ``ids``), and the layout it reads maps back to
    ``family`` (by default ``hf``'s own model_type); gives the archlab model."""
    model = from_hf(hf)
    for x in ids:
        assert max_diff(logits(hf, x), logits(model, x)) <= TOL
    assert hf_family(model.cfg) == (hf.config.model_type if family is None else family)
    return model


def check_generation(hf, model=None) -> None:
    """Greedy decoding after one prompt and of a left-padded batch (``check_greedy_generation``,
    ``check_padded_generation``) of one archlab model, by default ``from_hf(hf)``."""
    model = from_hf(hf) if model is None else model
    check_greedy_generation(hf, model)
    check_padded_generation(hf, model)


def check_exports(cfg, expected_class: str, family: str | None = None, seed: int = 3, **impl: Any):
    """A model of archlab config ``cfg``, every parameter redrawn, is held by ``family`` (where given) and
    converts to HF class ``expected_class`` and back (``check_to_hf_and_back``); gives the archlab model
    and the HF model."""
    model = randomize(build_model(cfg), seed)
    if family is not None:
        assert hf_family(model.cfg) == family
    hf, _ = check_to_hf_and_back(model, expected_class, **impl)
    return model, hf


def check_refuses(call: Callable[[], Any], field: str, *said: str) -> ConfigError:
    """``call()`` raises a ConfigError naming ``field``, its message saying each of ``said``; gives it."""
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field
    for words in said:
        assert words in str(err.value)
    return err.value


def check_family_refuses(family: str, cfg, field: str) -> None:
    """The record of ``family`` (its ``check``, which config_to_hf and archlab-export call) refuses ``cfg``
    naming ``field``, and names itself."""
    from archlab.interop.families import FAMILIES

    record = FAMILIES[family]
    check_refuses(lambda: record.check(cfg), field, f"Hugging Face {record.title}")


def record_to_hf(model, family: str, **impl: Any):
    """The transformers model that record ``family`` writes for archlab ``model`` (``to_hf``'s ``family``
    choice), whichever family the layout routes to; its config saying that family's model_type."""
    hf = to_hf(model, family, **impl).eval()
    assert hf.config.model_type == family
    return hf


def check_record_holds(hf, model, family: str, **impl: Any) -> None:
    """Record ``family`` holds archlab ``model`` (read from ``hf``) wherever its layout exports: it has no
    problem with it, and its own class (``record_to_hf``) is ``hf``'s, with the same logits, read back to
    the same config and every tensor bit for bit."""
    from archlab.interop.families import FAMILIES

    assert FAMILIES[family].problems(model.cfg) == []
    own = record_to_hf(model, family, **impl)
    assert type(own) is type(hf)
    assert max_diff(logits(own), logits(model)) <= TOL
    again = from_hf(own)
    assert again.cfg == model.cfg
    assert_same_tensors(model, again)


def check_directory_loads(hf, path: Path) -> None:
    """``hf``'s save_pretrained directory (its checkpoints' own tensor names) loads with load_hf_dir: the
    same logits."""
    hf.save_pretrained(path)
    assert max_diff(logits(hf), logits(load_hf_dir(path).eval())) <= TOL


def check_dense_layers_as_hf(hf, model) -> None:
    """archlab ``model`` (read from ``hf``) has a dense MLP on the layers where HF builds one (no experts)."""
    dense = [not hasattr(layer.mlp, "experts") for layer in hf.model.layers]
    assert [lc.mlp.kind != "moe" for lc in layer_configs(model.cfg)] == dense


def windows(cfg) -> list:
    """Each layer's sliding window (None: a global layer)."""
    return [lc.attention.window for lc in layer_configs(cfg)]


def layer_positions(cfg) -> list[tuple]:
    """Each layer's (window, position kind, RoPE base, RoPE scaling kind); NoPE: no base, no scaling."""

    def rope(position) -> tuple:
        return (position.theta, position.scaling.kind) if position.kind == "rope" else (None, None)

    return [(c.attention.window, c.position.kind, *rope(c.position)) for c in layer_configs(cfg)]


def check_layers_kept(cfg, other) -> None:
    """Configs ``cfg`` and ``other`` run every layer with the same window and position scheme."""
    assert [(c.attention.window, c.position) for c in layer_configs(other)] == [
        (c.attention.window, c.position) for c in layer_configs(cfg)
    ]


# a tiny LayerNorm, pre-norm, RoPE, tanh-GELU layout with every bias and a tied head (ModelConfig's defaults)
BASE = dict(vocab_size=V, context_length=CTX, n_layer=2, d_model=64, position={"kind": "rope"})
BASE |= dict(attention={"n_head": 4}, mlp={"d_ff": 96, "approximate": "tanh"})


def layout(*overrides: str) -> ModelConfig:
    """``BASE`` with ``overrides`` (``model.a.b=value``; ``model/mlp=swiglu`` sets the kind, as its option
    file, and its section keeps the fields swiglu has: GELU's approximate goes), validated; no Hydra
    composition, for speed."""
    dots = []
    for override in overrides:
        key, value = override.split("=", 1)
        if key.startswith("model/"):
            dots.append(f"{key.removeprefix('model/')}.kind={value}")
        else:
            dots.append(f"{key.removeprefix('model.')}={value}")
    data: Any = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(BASE), OmegaConf.from_dotlist(dots)))
    data["mlp"] = MLP_OPTIONS.own_fields(data["mlp"], data["mlp"].get("kind", "gelu"))
    return validate(to_model_config(data))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> ModelConfig:
    return compose_model(list(overrides))


def composed(*overrides: str) -> ModelConfig:
    """A copy of ``compose_model(overrides)``, which Hydra composes once per run of the tests (the slowest
    step of a refusal test)."""
    return copy.deepcopy(_composed(overrides))


def with_kinds(cfg: ModelConfig, **kinds: Any) -> ModelConfig:
    """``cfg`` (changed in place) with its layer kinds and its own fields changed: ``kinds`` maps a kind to
    {section: {field: value}} merged into it (or, naming a kind, replacing its section), ``model`` to
    sections of the model's own, ``first``/``pattern`` replace the layers'; ``global_`` is kind ``global``
    (a Python keyword)."""
    for kind, sections in kinds.items():
        kind = kind.rstrip("_")
        if kind in ("first", "pattern"):
            setattr(cfg.layers, kind, sections)
            continue
        for section, fields in sections.items():
            if kind == "model":
                for k, v in fields.items():
                    setattr(getattr(cfg, section), k, v)
            elif "kind" in fields:  # another option: its fields replace the kind's
                cfg.layers.kinds.setdefault(kind, {})[section] = dict(fields)
            else:
                cfg.layers.kinds.setdefault(kind, {}).setdefault(section, {}).update(fields)
    return cfg


def check_preset_is_published(preset: str) -> None:
    """config_to_hf of ``preset`` gives the published config's (tests/helpers/published.py LAYOUT_CONFIGS)
    layer types, windows and RoPE per layer, and the published config reads back into a layout with the
    preset's count and the same HF config."""
    import transformers

    from archlab.interop.hf import config_from_hf, config_to_hf
    from helpers.published import LAYOUT_CONFIGS, PUBLISHED

    _, config_class, keys, _ = LAYOUT_CONFIGS[preset]
    published = getattr(transformers, config_class)(**keys)
    ours = config_to_hf(compose_model([f"model={preset}"]))
    assert type(ours) is type(published)
    compared = ["layer_types", "sliding_window", "rope_parameters", "head_dim", "num_key_value_heads"]
    compared += ["hidden_size", "intermediate_size", "num_hidden_layers", "query_pre_attn_scalar", "no_rope_layers"]
    differ = {k: (getattr(published, k), getattr(ours, k)) for k in compared if hasattr(published, k)}
    assert {k: v for k, v in differ.items() if v[0] != v[1]} == {}
    cfg = config_from_hf(published)
    assert count_params(cfg)["total"] == PUBLISHED[preset]
    assert config_to_hf(cfg).to_dict() == ours.to_dict()


# ---------------------------------------------------------------- mixtures of experts


def mlp_kinds(cfg) -> list[str]:
    """Each layer's MLP kind: a dense layer is a layer kind setting it to the experts' kind."""
    return [lc.mlp.kind for lc in layer_configs(cfg)]


def moe_layers(hf, model, mlp: str = "mlp", router: str = "gate") -> list[tuple[torch.nn.Module, MoE]]:
    """(HF router, archlab MoE) of every MoE layer; HF's MLP and router by their names in its layers."""
    pairs = [(getattr(hf.model.layers[i], mlp), block.mlp) for i, block in enumerate(model.blocks)]
    return [(getattr(h, router), a) for h, a in pairs if isinstance(a, MoE)]


def by_expert(indices: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's chosen experts in ascending order, with their weights (DeepSeek's top-k is unsorted)."""
    order = indices.argsort(dim=-1)
    return indices.gather(-1, order), weights.gather(-1, order)


def check_routed_as_hf(hf, mlp: str = "mlp", router: str = "gate") -> None:
    """In every MoE layer of ``from_hf(hf)``, the experts archlab's forward chooses for every token (from
    its own hidden states) are HF's, and on HF's hidden states its router gives HF's weights (HF's MLP and
    router named as ``moe_layers`` takes them)."""
    model = from_hf(hf)
    layers = moe_layers(hf, model, mlp, router)
    assert layers and len(layers) == mlp_kinds(model.cfg).count("moe")
    seen_hf, seen_ours, hooks = {}, {}, []
    for n, (gate, moe) in enumerate(layers):
        hooks.append(gate.register_forward_hook(lambda m, args, out, n=n: seen_hf.__setitem__(n, (args[0], out))))
        hooks.append(moe.register_forward_pre_hook(lambda m, args, n=n: seen_ours.__setitem__(n, args[0])))
    logits(hf)
    logits(model)
    for h in hooks:
        h.remove()
    for n, (_, moe) in enumerate(layers):
        hf_input, (_, hf_weights, hf_indices) = seen_hf[n]
        hf_indices, hf_weights = by_expert(hf_indices, hf_weights)
        with torch.no_grad():
            _, _, ours = moe.route(seen_ours[n].reshape(-1, model.cfg.d_model))
            _, weights, indices = moe.route(hf_input.reshape(-1, model.cfg.d_model))
        assert torch.equal(ours.sort(dim=-1).values, hf_indices)  # all 24 tokens
        indices, weights = by_expert(indices, weights)
        assert torch.equal(indices, hf_indices)
        torch.testing.assert_close(weights, hf_weights, rtol=1e-6, atol=1e-7)


def check_correction_bias_moves_logits(model) -> None:
    """Zeroing the routers' correction bias in ``model`` moves its logits: the bias changes the experts
    chosen (the logits parity could not tell a dropped one)."""
    before = logits(model)
    with torch.no_grad():
        for block in model.blocks:
            if getattr(block.mlp, "router_bias", None) is not None:
                block.mlp.router_bias.zero_()
    assert max_diff(before, logits(model)) > 1e-3


def check_converts_both_ways(hf, path: Path, family: str | None = None, **impl: Any) -> None:
    """``from_hf(hf)`` gives HF's logits and its layout maps to ``family`` (by default ``hf``'s own
    model_type: ``check_from_hf``). Where that is ``hf``'s own family: archlab -> HF -> archlab bit for bit
    and a save_pretrained directory through load_hf_dir and save_hf_dir back; elsewhere (an alias, or a
    layout an earlier family holds) ``hf``'s own record still holds it (``check_record_holds``) and its
    save_pretrained directory, of its own tensor names, loads."""
    model = check_from_hf(hf, family)
    if family is None or family == hf.config.model_type:
        check_back_and_again(hf, model, **impl)
        check_directory_round_trip(hf, path, **impl)
    else:
        check_record_holds(hf, model, hf.config.model_type, **impl)
        check_directory_loads(hf, path)


def check_problem(family: str, cfg, field: str, **change: Any) -> None:
    """Record ``family`` holds ``cfg``, and names ``field`` among its problems with ``cfg`` changed
    (``changed_cfg``'s fields ``change``)."""
    from archlab.interop.families import FAMILIES

    assert not FAMILIES[family].problems(cfg)
    assert field in [p.field for p in FAMILIES[family].problems(changed_cfg(cfg, **change))]


def check_routed_family_refuses(family: str, cfg, field: str) -> None:
    """The dense layout ``cfg`` routes to ``family`` (``families.dense.dense_family``), which refuses it
    naming ``field`` (``check_family_refuses``)."""
    from archlab.interop.families.dense import dense_family

    assert dense_family(cfg).model_type == family
    check_family_refuses(family, cfg, field)


def check_per_layer_round_trip(hf, keys: dict[str, Any], **impl: Any) -> None:
    """``from_hf(hf)`` gives HF's logits; archlab -> HF gives ``hf``'s class, logits and per-layer
    description (layer_types, and each of no_rope_layers, moe_layers, sliding_window and
    attention_chunk_size that ``hf``'s config ``keys`` gave), -> archlab again the same config and
    bit-identical tensors."""
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    back = check_back_and_again(hf, model, **impl)  # the same class: the layout read maps back to the family
    for key in ("layer_types", "no_rope_layers", "moe_layers", "sliding_window", "attention_chunk_size"):
        if key in keys or key == "layer_types":
            assert getattr(back.config, key) == getattr(hf.config, key)


def check_each_part_changes_logits(model, parts: list[tuple[str, Any]]) -> None:
    """``model``'s weights with each part taken away in turn (``parts``: ``changed_cfg``'s field, the value
    that takes it away, on a layer kind or on every layer) give other logits (``check_changes_logits``)."""
    for field, value in parts:
        check_changes_logits(model, changed_cfg(model.cfg, **{field: value}), field)


def _over_cases(cases: dict | None, test: Callable, doc: str) -> Callable:
    """A new test calling ``test`` (whose arguments are ``case``, then tmp_path where it takes one), with
    docstring ``doc``: parametrized over ``cases``' names, or, with no cases, of no case (``case`` None)."""
    with_path = "tmp_path" in test.__code__.co_varnames[: test.__code__.co_argcount]
    if cases is None:

        def single(tmp_path):
            return test(None, tmp_path)

        def plain():
            return test(None)

        new = single if with_path else plain
    else:

        def single_case(case, tmp_path):
            return test(case, tmp_path)

        def plain_case(case):
            return test(case)

        new = pytest.mark.parametrize("case", list(cases))(single_case if with_path else plain_case)
    new.__doc__ = doc
    return new


def family_tests(
    hf_model: Callable,
    cases: dict[str, tuple] | None = None,
    presets: dict[str, tuple] | None = None,
    *,
    impl: dict | None = None,
    ids: tuple[torch.Tensor, ...] = (IDS,),
    generation_seed: int = 4,
    family: str | None = None,
    only: tuple[str, ...] | None = None,
) -> dict[str, Callable]:
    """The standard parity tests of one family file, by their names (a family file binds them:
    ``globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES))``; pytest collects a module's
    ``test_`` names, ids ``test_x[case]`` as if written there). ``hf_model``: the file's randomised HF model,
    ``hf_model(case, seed=...)`` over ``cases`` (HF_CASES: each test parametrized over its names) or, with no
    cases, ``hf_model(seed=...)`` of the file's one model; ``presets``: PRESET_CASES (case -> preset, HF
    class, sizes over TINY); ``impl``: the HF implementation settings (ATTN by default, EAGER for the MoE
    families); ``ids``: the inputs whose logits are compared; ``generation_seed``: the model's seed in
    test_generation_matches_hf_generate; ``family``: where the layout maps to another family than HF's own
    (check_converts_both_ways); ``only``: the names to give (all by default)."""
    impl = ATTN if impl is None else impl
    extra = () if family is None else (family,)

    def model(case, **seed):
        return hf_model(**seed) if cases is None else hf_model(case, **seed)

    def from_hf_logits(case):
        check_from_hf(model(case), ids=ids)

    def back_and_again(case):
        hf = model(case, seed=2)
        check_back_and_again(hf, from_hf(hf), **impl)

    def from_hf_and_back(case):
        hf = model(case)
        back = check_back_and_again(hf, check_from_hf(hf), **impl)
        if getattr(hf.config, "layer_types", None) is not None:
            assert back.config.layer_types == hf.config.layer_types

    def exports(case):
        preset, expected_class, sizes = presets[case]
        check_exports(compose_model([f"model={preset}", *TINY, *sizes]), expected_class, **impl)

    def greedy(case):
        check_greedy_generation(model(case, seed=4))

    def padded(case):
        check_padded_generation(model(case, seed=6))

    def generation(case):
        check_generation(model(case, seed=generation_seed))

    def directories(case, tmp_path):
        check_directory_round_trip(model(case, seed=7), tmp_path, **impl)

    def both_ways(case, tmp_path):
        check_converts_both_ways(model(case), tmp_path, *extra, **impl)

    def correction_bias(case):
        check_correction_bias_moves_logits(from_hf(model(case)))

    logits_doc = "HF -> archlab gives HF's logits, and the layout read maps back to the same family."
    both_ways_doc = """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for
    bit (through the record's own class where the layout maps to another family); a save_pretrained
    directory through load_hf_dir (and save_hf_dir back)."""
    tests = {
        "test_from_hf_gives_hf_logits": (from_hf_logits, logits_doc),
        "test_from_hf_gives_hf_logits_and_maps_back_to_the_family": (from_hf_logits, logits_doc),
        "test_hf_to_archlab_to_hf_and_back": (
            back_and_again,
            """The archlab model converts back to the same HF class with the same logits, and from there to an
    archlab model with the same config and bit-identical tensors (the correction biases included).""",
        ),
        "test_from_hf_gives_hf_logits_and_back": (
            from_hf_and_back,
            """HF -> archlab: the same logits, and the layout maps back to the family; archlab -> HF: the same
    class, logits and layer_types (where HF has them); -> archlab again: the same config and bit-identical
    tensors.""",
        ),
        "test_archlab_to_hf_to_archlab_is_bit_identical": (
            exports,
            """A shrunk preset converts to its family's HF class with the same logits (HF eager), and back to
    archlab with every tensor bit for bit.""",
        ),
        "test_greedy_generation_matches_hf_generate": (
            greedy,
            """20 new tokens after a 5-token prompt, past every window of 4: the same ids as HF ``generate``,
    and at every step archlab's logits through its KV cache equal the logits HF decoded with.""",
        ),
        "test_padded_batch_generation_matches_hf_generate": (
            padded,
            """Prompts of 7, 3 and 5 tokens left-padded into one batch, with their attention mask: archlab's
    greedy continuation of each row, and its logits at every step, equal HF ``generate``'s.""",
        ),
        "test_generation_matches_hf_generate": (
            generation,
            """Greedy decoding after one prompt, past every window of 4, and of left-padded prompts of 7, 3
    and 5 tokens in one batch: the same ids as HF ``generate`` and, at every step, archlab's logits
    through its KV cache equal the logits HF decoded with.""",
        ),
        "test_save_pretrained_directories_round_trip": (
            directories,
            """save_pretrained (each expert saved apart, in the MoE families) -> load_hf_dir -> save_hf_dir ->
    from_pretrained: the same logits throughout.""",
        ),
        "test_the_family_converts_both_ways": (both_ways, both_ways_doc),
        "test_from_hf_gives_hf_logits_maps_back_and_loads_saved": (both_ways, both_ways_doc),
        "test_correction_bias_changes_the_experts_chosen": (
            correction_bias,
            """Zeroing the routers' correction bias moves the logits: the bias changes the experts chosen.""",
        ),
    }
    names = (
        ["test_from_hf_gives_hf_logits", "test_hf_to_archlab_to_hf_and_back"]
        + ["test_archlab_to_hf_to_archlab_is_bit_identical"] * (presets is not None)
        + ["test_greedy_generation_matches_hf_generate", "test_padded_batch_generation_matches_hf_generate"]
        if only is None
        else only
    )
    over = {"test_archlab_to_hf_to_archlab_is_bit_identical": presets}
    return {name: _over_cases(over.get(name, cases), *tests[name]) for name in names}


# the sets of standard tests (family_tests' only) that several family files bind
ROUTED_MOE_TESTS = (
    "test_from_hf_gives_hf_logits_and_maps_back_to_the_family",
    "test_correction_bias_changes_the_experts_chosen",
    "test_hf_to_archlab_to_hf_and_back",
    "test_generation_matches_hf_generate",
    "test_save_pretrained_directories_round_trip",
)  # an MoE family of one model with router correction biases (Dots, GLM-4 MoE, MiniMax)
MAPPED_TESTS = (
    "test_from_hf_gives_hf_logits_and_maps_back_to_the_family",
    "test_hf_to_archlab_to_hf_and_back",
    "test_generation_matches_hf_generate",
    "test_save_pretrained_directories_round_trip",
)  # a family of one model read, round-tripped, generated and saved (Arcee, Nemotron)
ONE_MODEL_TESTS = (
    "test_from_hf_gives_hf_logits",
    "test_hf_to_archlab_to_hf_and_back",
    "test_greedy_generation_matches_hf_generate",
    "test_padded_batch_generation_matches_hf_generate",
    "test_save_pretrained_directories_round_trip",
)  # one model, the two generation checks apart (Cohere, Granite, OLMo, Mixtral)
AND_BACK_TESTS = (
    "test_from_hf_gives_hf_logits_and_back",
    "test_generation_matches_hf_generate",
)  # logits and round trip in one test, generation in one (ERNIE, GLM-4, HunYuan, Ministral)
BOTH_WAYS_TESTS = (
    "test_the_family_converts_both_ways",
    "test_generation_matches_hf_generate",
)  # check_converts_both_ways, and generation (Granite SWA, VaultGemma)
ROUND_TRIP_TESTS = (
    "test_from_hf_gives_hf_logits",
    "test_hf_to_archlab_to_hf_and_back",
)  # logits and the round trip alone (StableLM, StarCoder2, Phi-3)
