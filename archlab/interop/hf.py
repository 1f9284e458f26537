"""Hugging Face transformers <-> archlab: configs and weights, both ways, of GPT-2, GPT-J, GPT-NeoX
(Pythia), Phi, LLaMA (RoPE scaling included), Mistral, Qwen2, Qwen3, Gemma, Gemma 2 and OLMo 2, of
the mixtures of experts Mixtral, Qwen3-MoE, DeepSeek-V2 and DeepSeek-V3, and of the dense families whose
layers differ, Gemma 3, SmolLM3, Cohere2, EXAONE 4 and OLMo 3.

Each family is one record in ``archlab.interop.families`` (a module per group of families): its config
mapping both ways, its tensor names and layouts. ``from_hf`` picks the record from the HF config's
``model_type``; ``to_hf`` from the archlab layout (``hf_family``). Anything a family cannot hold
exactly is refused with a ConfigError naming the field. ``transformers`` is an optional extra
(``pip install -e ".[hf]"``), imported only inside these functions.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from archlab.build import model_from_state
from archlab.config import ModelConfig, to_model_config
from archlab.errors import ConfigError
from archlab.interop.families import FAMILIES, refusals
from archlab.interop.families.base import Family, Problem
from archlab.interop.families.dense import dense_family
from archlab.interop.families.experts import unstack_experts
from archlab.interop.families.moe import sparse_family
from archlab.interop.families.mtp import checkpoint_depth, mtp_maps, take
from archlab.interop.families.mtp import copies as mtp_copies
from archlab.interop.families.refused import NOT_DECODER
from archlab.interop.families.tensors import TensorMap, join, split
from archlab.interop.nearest import nearest
from archlab.interop.wrapped import language_model_state, text_config
from archlab.nn.model import Decoder
from archlab.nn.validation import validate

# Buffers that older checkpoints carry: causal masks (GPT-2, GPT-J, GPT-NeoX) and rotary frequencies; and
# those a transformers model computes from its config and saves: MiniMax's lightning-attention decays.
_BUFFERS = (".attn.bias", ".attn.masked_bias", ".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")
_BUFFERS += tuple(f".self_attn.{name}" for name in ("slope_rate", "query_decay", "key_decay", "diagonal_decay"))
_BUFFERS += (".act_fn.beta", ".act_fn.eps")  # xIELU's constants (Apertus), at the defaults its record requires


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError('Hugging Face interop needs transformers: pip install -e ".[hf]"') from e
    return transformers


ROUTED_MIXERS = ("causal", "mla", "dsa")  # the mixers the layout tables (families.dense, families.moe) route by


def _routed(cfg: ModelConfig) -> Family:
    """``families.moe.sparse_family`` for a moe MLP or mla or dsa attention, ``families.dense.dense_family``
    otherwise (each lists its choices), as ``FAMILIES`` holds it (``families.layered``'s record where one
    replaces it); a model of another mixer has no route (the families that hold one say so)."""
    if cfg.attention.kind not in ROUTED_MIXERS:
        raise ConfigError(
            "model.attention.kind", cfg.attention.kind, "causal, mla or dsa for a family the layout table routes to"
        )
    latent = cfg.attention.kind in ("mla", "dsa")
    routed = sparse_family(cfg) if cfg.mlp.kind == "moe" or latent else dense_family(cfg)
    return FAMILIES[routed.model_type]


def family_of(cfg: ModelConfig) -> Family:
    """The family an archlab layout maps to: the one its parts route to (``_routed``) where that holds it
    exactly, else the first family in ``FAMILIES`` that does (families a table cannot route to, such as
    those whose layers differ), else the routed one, whose ``check`` names what blocks it; where the
    routed one holds no per-layer layout that ``cfg`` has, or no table routes the layout's mixer, the one
    with the fewest problems (as ``exportability`` picks), so a layout is refused for what its nearest
    family lacks (a differential attention's ``scale``, not its kind)."""
    try:
        routed = _routed(cfg)
    except ConfigError:
        routed = None
    if routed is not None and not routed.problems(cfg):
        return routed
    holding = next((f for f in FAMILIES.values() if not f.problems(cfg)), None)
    if holding is not None:
        return holding
    if routed is None and cfg.attention.kind in ROUTED_MIXERS:
        return _routed(cfg)  # raises, naming the field the table routes by
    if routed is None or any(p.field.startswith("model.layers.") for p in routed.problems(cfg)):
        # no table routes the mixer, or the routed family holds no per-layer layout: the nearest names them
        return min(
            FAMILIES.values(), key=lambda f: (bool(f.mixer_problems(cfg)), len(f.problems(cfg)), f is not routed)
        )
    return routed


def hf_family(cfg: Any) -> str:
    """The ``model_type`` of the Hugging Face family this layout maps to (``family_of`` lists the
    choices); raises naming the field that no family holds."""
    return family_of(validate(to_model_config(cfg))).model_type


def exportability(cfg: Any) -> tuple[Family, list[Problem]]:
    """The family a layout exports to, with no problems; or, where it cannot export, the nearest family
    (``nearest.nearest``: one that keeps the layout's mixers and per-layer parts first) and every change
    that makes it hold the layout. Reads the family records alone: transformers need not be installed."""
    cfg = validate(to_model_config(cfg))
    try:
        routed: Family | None = _routed(cfg)
    except ConfigError:  # a block or position kind that no family's layout has: every family lists it
        routed = None
    holding = next((f for f in FAMILIES.values() if not f.problems(cfg)), None)
    if holding is not None:
        return family_of(cfg), []
    found = nearest(list(FAMILIES.values()), cfg, routed)
    return found.family, found.problems


def _family(name: str | None, cfg: ModelConfig) -> Family:
    return FAMILIES[name] if name is not None else family_of(cfg)


def holding_families(cfg: Any) -> list[Family]:
    """Every family that holds ``cfg`` exactly, in ``FAMILIES``' order."""
    cfg = validate(to_model_config(cfg))
    return [f for f in FAMILIES.values() if not f.problems(cfg)]


def export_family(cfg: ModelConfig, name: str | None, field: str = "family") -> Family:
    """The family ``cfg`` exports to: ``family_of``'s, or the one ``name`` gives where several hold the same
    layout (Qwen3.5-MoE's text model is Qwen3-Next's, Seed-OSS's Emu3's); ConfigError naming ``field``
    unless that family holds ``cfg`` exactly, listing those that do."""
    if name is None:
        return family_of(cfg)
    record = FAMILIES.get(name)
    problems = None if record is None else record.problems(cfg)
    if record is not None and not problems:
        return record
    holding = [f.model_type for f in holding_families(cfg)]  # for the message alone
    why = f" ({problems[0].field} is not {record.title}'s)" if record is not None and problems else ""
    allowed = ", ".join(holding) or "none: no family holds this layout (archlab-check names what blocks it)"
    raise ConfigError(field, name, f"a family that holds this layout exactly{why}: {allowed}")


# ---------------------------------------------------------------- configs


def config_to_hf(cfg: Any, family: str | None = None, **hf_kwargs: Any) -> Any:
    """The transformers config of the family that holds ``cfg`` exactly (``export_family``: ``family``'s where
    given); ``hf_kwargs`` are passed on (archlab configs carry no special tokens, so bos/eos/pad ids default
    to None, but where a family's config class takes an int: Step-3.5's pad id). A key the family writes from
    the model (Qwen4-Exp's eos_token_id, its n-gram inputs' document end) keeps its value: another is refused,
    naming it, as it would describe another model; None leaves it."""
    cfg = validate(to_model_config(cfg))
    record = export_family(cfg, family)
    record.check(cfg)
    written = record.to_hf(cfg)
    for key, value in hf_kwargs.items():
        if key in written and value is not None and not _same(value, written[key]):
            why = f" ({record.title}'s config writes it from the model: another value describes another model)"
            raise ConfigError(key, value, f"{written[key]!r} or None{why}")
    given = {k: v for k, v in hf_kwargs.items() if k not in written}
    kwargs = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **written, **given}
    return getattr(_transformers(), record.config_class)(**kwargs)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON holds them: a tuple as a list, 1 as 1.0."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def reads_as(config: dict[str, Any]) -> list[Family]:
    """The families that read the config dict ``config`` into a valid archlab layout and write back every key
    they write with its value there: what a fine-tune registered under a new ``model_type`` is."""
    transformers, found = _transformers(), []
    keys = {k: v for k, v in config.items() if k != "model_type"}
    for family in FAMILIES.values():
        try:
            read = getattr(transformers, family.config_class).from_dict(copy.deepcopy(keys))  # from_dict may pop keys
            written = family.to_hf(validate(family.from_hf(read)))
        except Exception:  # noqa: BLE001 - any failure to read (a missing key, a refused or mistyped value) is "not this one"
            continue
        if all(k in keys and _same(keys[k], v) for k, v in written.items()):
            found.append(family)
    return found


def _unsupported(model_type: Any, config: dict[str, Any]) -> str:
    """What a refusal of ``model_type`` allows, and why it is refused: the part archlab lacks for a
    family it knows, else the families the config reads as, else the types it converts."""
    listed = "a model_type archlab converts (archlab-interop lists them)"
    refused = refusals()
    if model_type in refused:
        r = refused[model_type]
        return f"{listed}; {r.title} ({r.model_class}) needs what archlab lacks: {r.missing}"
    if model_type in NOT_DECODER:
        return f"{listed}; {model_type} is not a decoder-only language model"
    like = reads_as(config)
    if like:
        names = " or ".join(f"{f.title} (family={f.model_type!r})" for f in like)
        return f"{listed}; this config reads as {names}: pass that family= to from_hf or load_hf_dir"
    return f"one of {sorted(FAMILIES)}"


def config_from_hf(hf_config: Any, family: str | None = None) -> ModelConfig:
    """The archlab config (validated) of a transformers config of any family in ``FAMILIES`` (of a wrapper's
    text config, ``wrapped.text_config``); ``family`` (a ``model_type``) reads a config registered under
    another name as that family's."""
    text = text_config(hf_config) if family is None else None
    if text is not None:  # a wrapper (vision-language ...): its language model's
        hf_config = text
    model_type = family if family is not None else getattr(hf_config, "model_type", None)
    if model_type not in FAMILIES:
        field = "family" if family is not None else "model_type"
        config = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(vars(hf_config))
        raise ConfigError(field, model_type, _unsupported(model_type, config))
    return validate(FAMILIES[model_type].from_hf(hf_config))


def read_hf_config(path: str | os.PathLike, family: str | None = None) -> Any:
    """The transformers config in a checkpoint directory or config.json: by its own ``model_type``, or by
    ``family``'s config class. A ``model_type`` transformers does not know is refused with what
    ``_unsupported`` says of it."""
    path, transformers = Path(path), _transformers()
    file = path if path.is_file() else path / "config.json"
    if not file.exists():
        raise FileNotFoundError(f"{path}: no config.json; expected a Hugging Face save_pretrained directory")
    if family is not None:
        if family not in FAMILIES:
            raise ConfigError("family", family, f"one of {sorted(FAMILIES)}")
        return getattr(transformers, FAMILIES[family].config_class).from_json_file(str(file))
    config = json.loads(file.read_text())
    model_type = config.get("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise ConfigError("model_type", model_type, _unsupported(model_type, config))
    return transformers.AutoConfig.from_pretrained(str(file), local_files_only=True)


# ---------------------------------------------------------------- weights


def hf_state_to_archlab(
    cfg: Any, hf_state: dict[str, Tensor], copy: bool = True, family: str | None = None
) -> dict[str, Tensor]:
    """archlab's state dict from a transformers state dict of ``family`` (a model_type; by default the
    family ``cfg``'s layout maps to). Raises naming every HF tensor that is missing or left unconverted
    (``_BUFFERS`` excepted)."""
    cfg = validate(to_model_config(cfg))
    record = _family(family, cfg)
    maps = record.tensors(cfg) + mtp_maps(record, cfg)  # the multi-token prediction modules' beside the model's
    needed = {name for m in maps for name in m.hf}
    ignored = {record.tied_head} if cfg.head.tied else set()  # the tied head is the embedding
    missing = sorted(needed - hf_state.keys())
    extra = sorted(k for k in hf_state.keys() - needed - ignored if not k.endswith(_BUFFERS))
    if missing or extra:
        raise ValueError(f"Hugging Face weights do not fit the config: missing {missing[:8]}, unexpected {extra[:8]}")
    out = {m.archlab: join(m, [hf_state[name] for name in m.hf], copy) for m in maps}
    if cfg.head.tied:
        out["head.weight"] = out["tok_emb.weight"]
    return out


def archlab_state_to_hf(cfg: Any, state: dict[str, Tensor], family: str | None = None) -> dict[str, Tensor]:
    """The transformers state dict of an archlab state dict, for ``family`` (a model_type; by default
    the family ``cfg``'s layout maps to): fused tensors are split into copies, others laid out as HF
    stores them."""
    cfg = validate(to_model_config(cfg))
    record = _family(family, cfg)
    return record.to_hf_weights(cfg, _split_all(record.tensors(cfg), state))


def _split_all(maps: list[TensorMap], state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The HF tensors of ``maps`` from archlab's ``state``: each map's tensor split as its layout says."""
    out = {}
    for m in maps:
        out.update(zip(m.hf, split(m, state[m.archlab], tuple(state[name] for name in m.others))))
    return out


def mtp_state_to_hf(cfg: Any, state: dict[str, Tensor], family: str | None = None) -> dict[str, Tensor]:
    """The checkpoint tensors of ``cfg``'s multi-token prediction modules (none without them), from an
    archlab state dict: named and laid out as the family's checkpoints store them (experts one tensor per
    expert), with the copies of the embedding and the head DeepSeek-V3's checkpoints hold."""
    cfg = validate(to_model_config(cfg))
    record = _family(family, cfg)
    out = _split_all(mtp_maps(record, cfg), state)
    if not out:
        return out
    main = {m.hf[0]: state[m.archlab] for m in record.tensors(cfg) if m.archlab in ("tok_emb.weight", "head.weight")}
    matrices = getattr(record, "expert_matrices", ("gate_proj", "up_proj", "down_proj"))
    return {**(out if record.mtp_stacked else unstack_experts(out, matrices)), **mtp_copies(record, cfg, main)}


def write_mtp(path: Path, cfg: Any, state: dict[str, Tensor], family: str | None = None) -> None:
    """Add the multi-token prediction modules' tensors (``mtp_state_to_hf``) to a directory
    ``save_pretrained`` wrote: into its ``model.safetensors``, or as a file of their own that its index
    names; nothing for a model without modules."""
    from safetensors.torch import load_file, save_file

    tensors = {k: v.detach().to("cpu").clone().contiguous() for k, v in mtp_state_to_hf(cfg, state, family).items()}
    if not tensors:
        return
    index = path / "model.safetensors.index.json"
    if index.exists():
        save_file(tensors, str(path / "model-mtp.safetensors"), metadata={"format": "pt"})
        data = json.loads(index.read_text())
        data["weight_map"].update(dict.fromkeys(tensors, "model-mtp.safetensors"))
        index.write_text(json.dumps(data, indent=2))
        return
    file = path / "model.safetensors"
    save_file({**load_file(str(file)), **tensors}, str(file), metadata={"format": "pt"})


def _hf_weights(family: Family, hf_config: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """transformers' tensors as archlab's layout of ``family`` holds them, given the HF config: a scale that
    archlab folds into a weight (Cohere2's logit_scale, into the final norm; Falcon-H1's key, MLP and
    in-projection multipliers) applied; else unchanged."""
    return family.hf_weights(hf_config, state)


def from_hf(hf_model: Any, family: str | None = None) -> Decoder:
    """An archlab Decoder with a copy of the weights of a transformers causal LM of any family in
    ``FAMILIES`` (GPT2LMHeadModel, LlamaForCausalLM, Gemma2ForCausalLM ...), in the same dtype, device
    and train/eval mode; ``family`` (a ``model_type``) reads a model registered under another name (a
    fine-tune's own class) as that family's, its tensors by that family's names. Of a vision-language
    wrapper whose text config a family holds (Gemma3ForConditionalGeneration ...), its language model alone
    (``wrapped``: the rest left out, said in one logged line)."""
    cfg = config_from_hf(hf_model.config, family)
    text = text_config(hf_model.config) if family is None else None
    hf_config = hf_model.config if text is None else text
    family_record = FAMILIES[family if family is not None else hf_config.model_type]
    hf_state = hf_model.state_dict()
    if text is not None:  # a wrapper: its language model alone
        hf_state = language_model_state(family_record, cfg, hf_state, type(hf_model).__name__)
    elif family is None and type(hf_model).__name__ != family_record.model_class:
        raise TypeError(
            f"from_hf takes a {family_record.model_class} for a {family_record.model_type} config, "
            f"got {type(hf_model).__name__}"
        )
    hf_state = _hf_weights(family_record, hf_config, hf_state)
    state = hf_state_to_archlab(cfg, hf_state, copy=True, family=family_record.model_type)
    return model_from_state(cfg, state).train(hf_model.training)


def to_hf(model: Decoder, family: str | None = None, **hf_kwargs: Any) -> Any:
    """The transformers model of the family ``model``'s layout maps to (``hf_family``; ``family``'s where
    given, ``export_family``), with a copy of its weights, in the same dtype, device and train/eval mode;
    ``hf_kwargs`` go to its config."""
    cfg = model.cfg
    family_record = export_family(validate(to_model_config(cfg)), family)
    name = family_record.model_type
    p = model.tok_emb.weight
    hf_model = family_record.hf_class(_transformers())(config_to_hf(cfg, name, **hf_kwargs))
    hf_model = hf_model.to(device=p.device, dtype=p.dtype)
    result = hf_model.load_state_dict(archlab_state_to_hf(cfg, model.state_dict(), name), strict=False)
    allowed_missing = {family_record.tied_head} if cfg.head.tied else set()
    if {k for k in result.missing_keys if not k.endswith(_BUFFERS)} - allowed_missing or result.unexpected_keys:
        raise RuntimeError(f"conversion to {type(hf_model).__name__} left {result}")
    return hf_model.train(model.training)


# ---------------------------------------------------------------- files


def _read_safetensors_dir(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    if not (path / files[0]).exists():
        raise FileNotFoundError(
            f"{path}: no model.safetensors or model.safetensors.index.json (only safetensors checkpoints are read)"
        )
    state: dict[str, Tensor] = {}
    for name in files:
        state.update(load_file(str(path / name)))
    return state


def load_hf_dir(path: str | os.PathLike, dtype: torch.dtype | None = None, family: str | None = None) -> Decoder:
    """An archlab Decoder from a local Hugging Face checkpoint directory (``save_pretrained`` output:
    config.json + safetensors), in the stored dtype unless ``dtype`` is given; ``family`` and a
    vision-language wrapper's checkpoint as in ``from_hf``."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a directory; expected a Hugging Face save_pretrained directory")
    hf_config = read_hf_config(path, family)
    cfg = config_from_hf(hf_config, family)
    text = text_config(hf_config) if family is None else None
    wrapper = (getattr(hf_config, "architectures", None) or [hf_config.model_type])[0]
    hf_config = hf_config if text is None else text
    family_record = FAMILIES[family if family is not None else hf_config.model_type]
    state = _read_safetensors_dir(path)
    if text is not None:  # a wrapper's checkpoint: its language model alone
        state = language_model_state(family_record, cfg, state, wrapper)
    for old, new in family_record.renames.items():  # names older checkpoints use
        state = {new + k.removeprefix(old) if k.startswith(old) else k: v for k, v in state.items()}
    if not any(k.startswith(family_record.prefix) for k in state):  # saved from the base model: names lack its prefix
        state = {k if k.startswith("lm_head.") else family_record.prefix + k: v for k, v in state.items()}
    depth = checkpoint_depth(family_record, hf_config, state)  # multi-token prediction modules it holds
    modules: dict[str, Tensor] = {}
    if depth:
        cfg = validate(family_record.with_mtp(cfg, hf_config, depth))
        modules, state = take(family_record, cfg, state)  # read apart: the family's reading drops them
    state = _hf_weights(family_record, hf_config, {**family_record.from_checkpoint(cfg, state), **modules})
    state = hf_state_to_archlab(cfg, state, copy=False, family=family_record.model_type)
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
        if cfg.head.tied:
            state["head.weight"] = state["tok_emb.weight"]
    return model_from_state(cfg, state)


def save_hf_dir(model: Decoder, path: str | os.PathLike, family: str | None = None, **hf_kwargs: Any) -> Path:
    """Write ``model`` as a Hugging Face checkpoint directory (config.json + model.safetensors) of its
    family (``family``'s where given, ``export_family``), with any multi-token prediction modules beside the
    model's tensors (``write_mtp``)."""
    to_hf(model, family, **hf_kwargs).save_pretrained(str(path))
    write_mtp(Path(path), model.cfg, model.state_dict(), family)
    return Path(path)
