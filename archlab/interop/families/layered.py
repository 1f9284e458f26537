"""The dense Hugging Face families whose layers differ: Gemma 2, Qwen2 and Qwen3 (some layers sliding),
Gemma 3 (text), SmolLM3, Cohere2, EXAONE 4 and OLMo 3, one record each, in the table ``LAYERED`` (by
``model_type``; ``families.FAMILIES`` joins it, the first three in place of ``llama``'s records).

Each of them describes its layers per layer in its config: ``layer_types`` (sliding or full attention),
RoPE parameters per layer type (Gemma 3, OLMo 3), ``no_rope_layers`` (SmolLM3), or no position encoding on
the full-attention layers (Cohere2; EXAONE 4 when it has a sliding window). A record reads that into an
archlab ``model.layers`` layout of named kinds (``local``/``global`` where layers differ in their window,
``rope``/``nope`` where they differ only in their position encoding), the first layers in ``first`` and the
rest in a cycled ``pattern``, the shortest pair that gives every layer its kind. The other way it reads
each layer's config (``archlab.config.layers.layer_configs``) and refuses, naming the field (a layer kind's
own, ``model.layers.kinds.<kind>.attention.window``, where the kind sets it), what the family cannot
express: parts that differ between layers beyond the window and the position encoding, windows of two
sizes, RoPE that differs where the family has one set, NoPE where the family has RoPE.

Nothing here imports transformers: records read configs by attribute, as in ``base``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from torch import Tensor

from archlab.config import (
    BlockConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    n_kv_head,
)
from archlab.config.layers import layer_configs, layer_kind
from archlab.config.model import LayersConfig, shortest_layout
from archlab.errors import ConfigError
from archlab.interop.families.base import (
    GATED_TO_HF,
    NO_HEAD_BIAS,
    Family,
    Problem,
    Rule,
    TensorMap,
    Tensors,
    bare,
    config_head_dim,
    gated_activation,
    kind_field,
    out_bias,
    refuse_hf,
)
from archlab.interop.families.llama import LLAMA_KEYS, Gemma2, Llama, Olmo2, Qwen2, Qwen3
from archlab.interop.families.rope import rope_from_hf, rope_to_hf
from archlab.interop.families.windows import FULL, SLIDING, checked_types, layer_types, sliding_to_hf, sliding_window
from archlab.nn.mixers.attention import AttentionConfig
from archlab.nn.mixers.base import head_dim
from archlab.nn.mlp import d_ff

LAYERS = frozenset({"model.layers.first", "model.layers.pattern"})


class Layer(NamedTuple):
    """What differs between the layers of these families: the sliding window (None: full attention) and
    the position scheme (kind ``rope`` with its parameters, or ``none``)."""

    window: int | None
    position: PositionConfig


class _View:
    """A transformers config with some attributes replaced (a parent family's reader then sees one set of
    RoPE parameters, or no windows)."""

    def __init__(self, c: Any, changes: dict[str, Any]):
        self.__dict__.update(_c=c, _changes=changes)

    def __getattr__(self, name: str) -> Any:
        changes = self.__dict__["_changes"]
        return changes[name] if name in changes else getattr(self.__dict__["_c"], name)


def view(c: Any, **changes: Any) -> Any:
    """``c`` with ``changes``, under the class name of ``c``, so that a refusal names its config class."""
    return type(type(c).__name__, (_View,), {})(c, changes)


def rope_of(c: Any, params: Any, hd: int, where: str | None = None, partial: bool = False) -> PositionConfig:
    """archlab's RoPE of one set of transformers rope parameters (``where``: its layer type, named in a
    refusal: ``rope_parameters.full_attention.rope_type``). Half-paired, over whole heads unless ``partial``."""
    try:
        return rope_from_hf(view(c, rope_parameters=params), hd, partial=partial)
    except ConfigError as err:
        if where is None:
            raise
        field = err.field.replace(".rope_parameters", f".rope_parameters.{where}", 1)
        raise ConfigError(field, err.value, err.allowed) from None


def per_type_rope(c: Any, types: list[str], hd: int) -> dict[str, PositionConfig]:
    """The RoPE of each layer type present (Gemma 3, OLMo 3: ``rope_parameters`` keyed by layer type)."""
    params = getattr(c, "rope_parameters", None) or {}
    out = {}
    for t in sorted(set(types)):
        if not isinstance(params.get(t), dict):
            refuse_hf(c, f"rope_parameters.{t}", f"the RoPE parameters of the {t} layers", params.get(t))
        out[t] = rope_of(c, params[t], hd, t)
    return out


def _differing(a: Any, b: Any) -> dict[str, Any]:
    """The fields of dataclass ``a`` whose values differ from ``b``'s."""
    return {f.name: getattr(a, f.name) for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)}


def laid_out(cfg: ModelConfig, layers: list[Layer]) -> ModelConfig:
    """``cfg`` with each layer's window and position scheme: the model's own parts are those of the
    full-attention layers with RoPE (else of any full-attention layer, else of any layer with RoPE), and
    layers that differ from them get a kind that overrides what differs. Kinds are named by what varies:
    ``local``/``global`` by the window, ``rope``/``nope`` by the position scheme (both joined where both
    vary apart, SmolLM3 can: ``local_nope``)."""
    full = [x for x in layers if x.window is None]
    base_window = None if full else layers[0].window
    roped = [x for x in full if x.position.kind == "rope"] or [x for x in layers if x.position.kind == "rope"]
    base_position = (roped or full or layers)[0].position
    cfg.attention.window, cfg.position = base_window, base_position
    by_window = {x.window is not None for x in layers}
    by_rope = {x.position.kind for x in layers}
    rope_follows_window = all(
        len({x.position.kind for x in layers if (x.window is not None) == s}) == 1 for s in by_window
    )

    def name(x: Layer) -> str:
        parts = ["local" if x.window is not None else "global"] if len(by_window) > 1 else []
        if len(by_rope) > 1 and not (parts and rope_follows_window):
            parts.append("rope" if x.position.kind == "rope" else "nope")
        return "_".join(parts)

    if len(by_window) == 1 and len(set(map(_key, layers))) == 1:
        cfg.attention.window, cfg.position = layers[0].window, layers[0].position
        return cfg
    kinds: dict[str, dict[str, Any]] = {}
    for x in layers:
        overrides: dict[str, Any] = {}
        if x.window != base_window:
            overrides["attention"] = {"window": x.window}
        position = _differing(x.position, base_position)
        if position:
            overrides["position"] = position
        kinds.setdefault(name(x), overrides)
    first, pattern = shortest_layout([name(x) for x in layers])
    cfg.layers = LayersConfig(kinds=kinds, first=first, pattern=pattern)
    return cfg


def _key(x: Layer) -> tuple:
    return (x.window, tuple(sorted(dataclasses.asdict(x.position).items())))


# the fields whose value is resolved by a rule where they are null, compared resolved
_RESOLVED_ATTENTION = {"n_kv_head": n_kv_head, "head_dim": head_dim}
_WIDTH_RULE = {"d_ff", "multiplier", "ffn_dim_multiplier", "multiple_of"}


def _uniform_values(lc: ModelConfig) -> dict[str, Any]:
    """The fields of a layer's attention and MLP that these families give every layer alike (all but the
    window), with head counts, head sizes and the MLP width resolved."""
    out = {f"model.attention.{k}": v for k, v in dataclasses.asdict(lc.attention).items() if k != "window"}
    out.update({f"model.attention.{k}": fn(lc) for k, fn in _RESOLVED_ATTENTION.items()})
    out.update({f"model.mlp.{k}": v for k, v in dataclasses.asdict(lc.mlp).items() if k not in _WIDTH_RULE})
    out["model.mlp.d_ff"] = d_ff(lc)
    return out


class LayeredFamily(Family):
    """A family whose layers differ in their window and position scheme, each layer described by
    transformers' config (``hf_layers``) and by archlab's ``layer_configs``. Subclasses name the parent
    family whose every other part they share (as the second base), and say which layers may go without
    position encoding (``nope``) and whether RoPE parameters are per layer type (``rope_per_type``)."""

    nope = False  # some layers may have no position encoding
    rope_per_type = False  # RoPE parameters per layer type (else one set for every layer with RoPE)
    layout_why = ""  # what the family's layer types give, appended to a refusal of a layer's position

    # ---- Hugging Face -> archlab

    def hf_layers(self, c: Any) -> list[Layer]:
        """Each layer's window and position scheme, read from transformers' config ``c``."""
        raise NotImplementedError

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        """archlab's config of every part the layers share (the parent family's reader, on a view of ``c``
        with no windows and one set of RoPE parameters)."""
        raise NotImplementedError

    def from_hf(self, c: Any) -> ModelConfig:
        layers = self.hf_layers(c)
        return laid_out(self.uniform_from_hf(c), layers)

    def hf_weights(self, c: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """transformers' tensors (named as the model holds them) as archlab's layout holds them, given the
        config ``c``: the same, but for a scale archlab folds into a weight (Cohere2's logit_scale)."""
        return state

    # ---- archlab -> Hugging Face

    def layer_problems(self, lcs: list[ModelConfig]) -> list[tuple[int, Problem]]:
        """The family's rules on which layers slide and which have RoPE: (layer, problem) pairs."""
        return []

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        """The transformers config keys that describe the layers (layer_types, windows, RoPE per layer)."""
        raise NotImplementedError

    def base_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        """The keys of the parts every layer shares, from one layer's config ``rep`` (one with RoPE if any)."""
        return super().to_hf(rep)

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        lcs = layer_configs(cfg)
        rep = next((lc for lc in lcs if lc.position.kind == "rope"), lcs[0])
        return {**self.base_to_hf(rep), **self.layers_to_hf(cfg, lcs)}

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        """The parent family's problems on each layer's config (a NoPE layer passes where ``nope``), named
        as the layer's kind sets the field; then what differs between layers that the family cannot
        express: parts beyond the window and position, two window sizes, RoPE that differs where the family
        has one set (per layer type: Gemma 3, OLMo 3), and the family's rules on NoPE layers."""
        lcs = layer_configs(cfg)
        found: dict[str, Problem] = {}
        checked: set[str | None] = set()
        for i, lc in enumerate(lcs):
            kind = layer_kind(cfg, i)
            if kind in checked:
                continue
            checked.add(kind)
            for p in super().part_problems(lc):
                if self.nope and p.field == "model.position.kind" and p.value == "none":
                    continue
                name = kind_field(cfg, layer_kind(cfg, i), p.field)
                found.setdefault(name, p._replace(field=name))
        if found:
            return list(found.values())
        return [
            p._replace(field=kind_field(cfg, layer_kind(cfg, i), p.field)) for i, p in self._layout_problems(cfg, lcs)
        ][:1]

    def _layout_problems(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> list[tuple[int, Problem]]:
        first = _uniform_values(lcs[0])
        for i, lc in enumerate(lcs):
            for field, value in _uniform_values(lc).items():
                if value != first[field]:
                    why = f" ({self.title} gives every layer the same parts but for its window and position encoding)"
                    if (
                        kind_field(cfg, layer_kind(cfg, i), field)
                        == field
                        != kind_field(cfg, layer_kind(cfg, 0), field)
                    ):  # layer 0's kind sets it
                        return [(0, Problem(field, first[field], bare(value), why))]
                    return [(i, Problem(field, value, bare(first[field]), why))]
        windows = [(i, lc.attention.window) for i, lc in enumerate(lcs) if lc.attention.window is not None]
        for i, w in windows:
            if w != windows[0][1]:
                why = f" ({self.title} has one sliding_window for all its sliding layers)"
                return [(i, Problem("model.attention.window", w, f"{windows[0][1]} or null", why))]
        groups: dict[Any, ModelConfig] = {}
        for i, lc in enumerate(lcs):
            if lc.position.kind != "rope":
                continue
            group = (lc.attention.window is None) if self.rope_per_type else None
            ref = groups.setdefault(group, lc)
            differ = _differing(lc.position, ref.position)
            if differ:
                field, value = next(iter(differ.items()))
                where = "layers of its type" if self.rope_per_type else "layers with RoPE"
                why = f" ({self.title} has one set of RoPE parameters for all its {where})"
                return [(i, Problem(f"model.position.{field}", value, bare(getattr(ref.position, field)), why))]
        return self.layer_problems(lcs)


def rope_per_type_to_hf(lcs: list[ModelConfig]) -> dict[str, Any]:
    """rope_parameters by layer type (Gemma 3, OLMo 3): each type's RoPE, the other type's where no layer
    has it (transformers reads only the types its layers have)."""
    by_type = {t: rope_to_hf(lc) for t, lc in zip(layer_types(lcs), lcs)}
    return {t: by_type.get(t, next(iter(by_type.values()))) for t in (SLIDING, FULL)}


def rule_problems(lcs: list[ModelConfig], want: Any, why: str) -> list[tuple[int, Problem]]:
    """Where a layer's position kind differs from ``want(i, lc)``: (layer, problem)."""
    for i, lc in enumerate(lcs):
        wanted = want(i, lc)
        if lc.position.kind != wanted:
            return [(i, Problem("model.position.kind", lc.position.kind, wanted, why))]
    return []


# ---- Gemma 2, Qwen2, Qwen3: one RoPE, some layers sliding


class _Windowed(LayeredFamily):
    """A family whose layers slide or not as ``layer_types`` says, with one ``sliding_window`` and one RoPE
    for every layer: its parent record (the second base, in ``llama``) reads and writes the rest, a
    window on every layer or none."""

    def hf_layers(self, c: Any) -> list[Layer]:
        rope = self.uniform_from_hf(c).position
        return [Layer(c.sliding_window if t == SLIDING else None, rope) for t in checked_types(c)]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        return super(LayeredFamily, self).from_hf(view(c, layer_types=None, sliding_window=None))


class LayeredGemma2(_Windowed, Gemma2):
    """Gemma2ForCausalLM with sliding windows on some layers (the published models: layers 0, 2, ...,
    kinds ``local`` and ``global``); ``llama.Gemma2`` holds the rest."""

    features = Gemma2.features | LAYERS

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return sliding_to_hf(cfg, lcs)


class _LayeredQwen(_Windowed):
    """Qwen2 and Qwen3 with sliding windows on some layers, written as ``layer_types`` (every layer of
    the window's, ``max_window_layers`` 0, where some layer slides)."""

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        window = next((lc.attention.window for lc in lcs if lc.attention.window is not None), None)
        return dict(
            use_sliding_window=window is not None,
            sliding_window=window,
            max_window_layers=0 if window is not None else cfg.n_layer,
            layer_types=layer_types(lcs),
        )


class LayeredQwen2(_LayeredQwen, Qwen2):
    """Qwen2ForCausalLM with sliding windows on some layers; ``llama.Qwen2`` holds the rest."""

    features = Qwen2.features | LAYERS


class LayeredQwen3(_LayeredQwen, Qwen3):
    """Qwen3ForCausalLM with sliding windows on some layers; ``llama.Qwen3`` holds the rest."""

    features = Qwen3.features | LAYERS


# ---- Gemma 3


class Gemma3(LayeredFamily, Gemma2):
    """Gemma3ForCausalLM (text, ``gemma3_text``): Gemma 2's sandwich block, (1 + w) RMSNorms, scaled
    embeddings, tanh-GeGLU and query_pre_attn_scalar, with a (1 + w) RMSNorm of q and k per head before
    RoPE, RoPE parameters per layer type (local base 10⁴, global 10⁶ and a scaling in the published
    models), sliding windows by ``layer_types``, and no attention soft-capping (transformers' Gemma 3
    attention does not apply ``attn_logit_softcapping``); the final logits may be soft-capped."""

    parts = "Gemma 2's parts with QK RMSNorm, local/global layers each with their own RoPE"

    model_type, title, model_class, config_class = "gemma3_text", "Gemma 3", "Gemma3ForCausalLM", "Gemma3TextConfig"
    features = (Gemma2.features - {"model.attention.softcap"}) | {
        "model.attention.qk_norm",
        *LAYERS,
    }
    rope_per_type = True

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)")]

    def hf_layers(self, c: Any) -> list[Layer]:
        types = checked_types(c)
        ropes = per_type_rope(c, types, c.head_dim)
        return [Layer(c.sliding_window if t == SLIDING else None, ropes[t]) for t in types]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        if getattr(c, "attn_logit_softcapping", None) is not None:
            refuse_hf(c, "attn_logit_softcapping", "null (transformers' Gemma 3 attention does not apply it)")
        n = c.num_hidden_layers
        full = (c.rope_parameters or {}).get(FULL)
        cfg = Gemma2.from_hf(self, view(c, layer_types=[FULL] * n, sliding_window=None, rope_parameters=full))
        cfg.attention.qk_norm = "head"
        return cfg

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return dict(
            **sliding_to_hf(cfg, lcs),
            rope_parameters=rope_per_type_to_hf(lcs),
        )


# ---- OLMo 3


class Olmo3(LayeredFamily, Olmo2):
    """Olmo3ForCausalLM: OLMo 2's layers (post-sublayer RMSNorms, q and k RMSNormed over the whole
    projection) with sliding windows by ``layer_types`` (three of four layers in the published models) and
    RoPE parameters per layer type (the published long-context models scale the global layers' only)."""

    parts = "OLMo 2's parts with local/global layers, RoPE per layer type"

    model_type, title, model_class, config_class = "olmo3", "OLMo 3", "Olmo3ForCausalLM", "Olmo3Config"
    features = Olmo2.features | {"model.attention.window", *LAYERS}
    rope_per_type = True

    def hf_layers(self, c: Any) -> list[Layer]:
        types = checked_types(c)
        hd = c.hidden_size // c.num_attention_heads
        ropes = per_type_rope(c, types, getattr(c, "head_dim", None) or hd)
        return [Layer(c.sliding_window if t == SLIDING else None, ropes[t]) for t in types]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        full = (c.rope_parameters or {}).get(FULL)
        return Olmo2.from_hf(self, view(c, rope_parameters=full))

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return dict(
            **sliding_to_hf(cfg, lcs),
            rope_parameters=rope_per_type_to_hf(lcs),
        )


# ---- EXAONE 4


class Exaone4(LayeredFamily, Olmo2):
    """Exaone4ForCausalLM: OLMo 2's post-sublayer RMSNorms with q and k RMSNormed per head before RoPE, no
    biases; with a ``sliding_window``, the sliding layers (``layer_types``) have RoPE and the full ones none
    (the published hybrid models: three local layers, then a global NoPE one); without one, every layer is
    full with RoPE."""

    parts = "OLMo 2's block with per-head QK-norm, local RoPE and global NoPE layers"

    model_type, title, model_class, config_class = "exaone4", "EXAONE 4", "Exaone4ForCausalLM", "Exaone4Config"
    features = frozenset({"model.position.scaling", "model.attention.qk_norm", "model.attention.window", *LAYERS})
    nope = True
    layout_why = " (with a sliding window, EXAONE 4's sliding layers have RoPE and its full layers none; without one, every layer has RoPE)"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super(Olmo2, self).rules(cfg) + [
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)")
        ]

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qkv_bias", (False,), " (EXAONE 4 has no attention biases)"),
            out_bias(False, " (EXAONE 4 has no attention biases)"),
            ("model.mlp.bias", (False,), ""),
        ]

    def hf_layers(self, c: Any) -> list[Layer]:
        types = checked_types(c)
        hd = config_head_dim(c)
        rope = rope_of(c, c.rope_parameters, hd)
        hybrid = c.sliding_window is not None
        return [
            Layer(
                c.sliding_window if t == SLIDING else None,
                rope if not hybrid or t == SLIDING else dataclasses.replace(rope, kind="none"),
            )
            for t in types
        ]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        cfg = Olmo2.from_hf(self, c)
        cfg.attention.qk_norm = "head"
        return cfg

    def layer_problems(self, lcs: list[ModelConfig]) -> list[tuple[int, Problem]]:
        if any(lc.attention.window is not None for lc in lcs):
            return rule_problems(lcs, lambda i, lc: "none" if lc.attention.window is None else "rope", self.layout_why)
        return rule_problems(lcs, lambda i, lc: lcs[0].position.kind, self.layout_why)

    def base_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        kwargs = super().base_to_hf(rep)
        del kwargs["attention_bias"]  # Exaone4Config has none
        return kwargs

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        types = layer_types(lcs)
        hybrid = SLIDING in types or lcs[0].position.kind == "none"  # NoPE full layers need a window set
        period = types.index(FULL) + 1 if FULL in types else None
        regular = period is not None and types == [SLIDING if (i + 1) % period else FULL for i in range(len(types))]
        return dict(
            layer_types=types,
            sliding_window=sliding_window(cfg, lcs) if hybrid else None,
            sliding_window_pattern=period if hybrid and regular else None,
        )


# ---- SmolLM3


class SmolLM3(LayeredFamily, Llama):
    """SmolLM3ForCausalLM: LLaMA's layers (biases by ``attention_bias`` and ``mlp_bias``), RoPE on the
    layers ``no_rope_layers`` marks 1 and none on those it marks 0 (every 4th in the published model), and
    sliding windows where ``layer_types`` says (with ``use_sliding_window``; none in the published model)."""

    parts = "LLaMA's layers with NoPE on chosen layers (model.layers)"

    model_type, title, model_class, config_class = "smollm3", "SmolLM3", "SmolLM3ForCausalLM", "SmolLM3Config"
    features = Llama.features | {"model.attention.window", *LAYERS}
    nope = True

    def hf_layers(self, c: Any) -> list[Layer]:
        n = c.num_hidden_layers
        types = checked_types(c)
        if SLIDING in types and not c.use_sliding_window:
            refuse_hf(
                c,
                "use_sliding_window",
                "true where layer_types has sliding_attention layers (else transformers' attention kernels differ "
                "on which layers slide)",
            )
        flags = list(c.no_rope_layers or [])
        if len(flags) < n or set(flags[:n]) - {0, 1}:
            refuse_hf(c, "no_rope_layers", f"at least {n} entries, each 1 (RoPE) or 0 (NoPE)", flags)
        hd = config_head_dim(c)
        rope = rope_of(c, c.rope_parameters, hd)
        nope = dataclasses.replace(rope, kind="none")
        return [Layer(c.sliding_window if t == SLIDING else None, rope if f else nope) for t, f in zip(types, flags)]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        return Llama.from_hf(self, c)

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        types = layer_types(lcs)
        sliding = SLIDING in types
        return dict(
            layer_types=types,
            no_rope_layers=[int(lc.position.kind == "rope") for lc in lcs],
            use_sliding_window=sliding,
            sliding_window=sliding_window(cfg, lcs) if sliding else None,
        )


# ---- Cohere2


class Cohere2(LayeredFamily):
    """Cohere2ForCausalLM (Command R7B, Command A): a parallel block with one LayerNorm without bias feeding
    attention and MLP, interleaved RoPE on the sliding layers and none on the full ones, q/k/v and output
    biases together (``attention_bias``), a gated MLP without biases, head_dim = hidden_size / heads, and
    the logits times ``logit_scale``. archlab has no logit scale: it is folded into the final LayerNorm's
    scale (the norm has no bias, so norm(h)·w·s = norm(h)·(w·s), and the head is linear), which is exact in
    any float format when the scale is a power of two (the published 0.25 and 0.0625); other scales are
    refused. An archlab model exports with logit_scale 1."""

    parts = "parallel block, bias-free LayerNorm, interleaved RoPE on local layers, global NoPE, logit scale"

    model_type, title, model_class, config_class = "cohere2", "Cohere2", "Cohere2ForCausalLM", "Cohere2Config"
    prefix = "model."
    keys = {**LLAMA_KEYS, "layer_norm_eps": "norm.eps"}
    features = frozenset({"model.position.scaling", "model.attention.window", *LAYERS})
    nope = True
    layout_why = " (Cohere2's sliding layers have RoPE and its full layers none)"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        H, d = cfg.attention.n_head, cfg.d_model
        return [
            ("model.norm.kind", ("layernorm",), ""),
            ("model.norm.bias", (False,), " (Cohere2's LayerNorm has no bias)"),
            ("model.block.kind", ("parallel",), ""),
            ("model.block.shared_norm", (True,), " (one input_layernorm feeds attention and MLP)"),
            ("model.position.pairing", ("interleaved",), ""),
            ("model.attention.head_dim", (None, d // H), " (Cohere2 sets head_dim = hidden_size / heads)"),
            out_bias(cfg.attention.qkv_bias, " (one attention_bias flag sets both)"),
            ("model.mlp.kind", ("swiglu", "geglu"), ""),
            ("model.mlp.bias", (False,), ""),
            NO_HEAD_BIAS,
        ]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        return found or self.full_rotary(cfg)

    def layer_problems(self, lcs: list[ModelConfig]) -> list[tuple[int, Problem]]:
        return rule_problems(lcs, lambda i, lc: "none" if lc.attention.window is None else "rope", self.layout_why)

    def base_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        a = rep.attention
        return dict(
            self.keys_to_hf(rep),
            intermediate_size=d_ff(rep),
            num_key_value_heads=n_kv_head(rep),
            hidden_act=GATED_TO_HF[(rep.mlp.kind, rep.mlp.approximate)],
            rope_parameters=rope_to_hf(rep),
            attention_bias=a.qkv_bias,
            attention_dropout=a.dropout,
            logit_scale=1.0,
        )

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return sliding_to_hf(cfg, lcs)

    def hf_layers(self, c: Any) -> list[Layer]:
        types = checked_types(c)
        rope = dataclasses.replace(
            rope_of(c, c.rope_parameters, c.hidden_size // c.num_attention_heads), pairing="interleaved"
        )
        nope = dataclasses.replace(rope, kind="none")
        return [Layer(c.sliding_window, rope) if t == SLIDING else Layer(None, nope) for t in types]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        scale = c.logit_scale
        if not (scale > 0 and math.frexp(scale)[0] == 0.5):
            refuse_hf(c, "logit_scale", "a power of two (folded exactly into the final norm's scale)")
        kind, approximate = gated_activation(c)
        bias = bool(c.attention_bias)
        cfg = ModelConfig(
            dropout=0.0,
            norm=NormConfig(kind="layernorm", bias=False),
            block=BlockConfig(kind="parallel", shared_norm=True),
            attention=AttentionConfig(
                n_kv_head=c.num_key_value_heads,
                qkv_bias=bias,
                out_bias=bias,
                dropout=float(c.attention_dropout),
            ),
            mlp=MLPConfig(kind=kind, d_ff=c.intermediate_size, bias=False, approximate=approximate),
        )
        return self.keys_from_hf(c, cfg)

    def hf_weights(self, c: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        if c.logit_scale == 1.0:
            return state
        return {**state, "model.norm.weight": state["model.norm.weight"] * c.logit_scale}

    def tensors(self, cfg: ModelConfig) -> list[TensorMap]:
        t, bias = Tensors(cfg), cfg.attention.qkv_bias
        t.add("tok_emb", "model.embed_tokens")
        for i in range(cfg.n_layer):
            b, h = f"blocks.{i}", f"model.layers.{i}"
            t.add(f"{b}.attn_norm", f"{h}.input_layernorm")
            t.qkv(f"{b}.attn.qkv", f"{h}.self_attn", bias)
            t.add(f"{b}.attn.proj", f"{h}.self_attn.o_proj", bias)
            t.gate_up(f"{b}.mlp.gate_up", f"{h}.mlp", False)
            t.add(f"{b}.mlp.down", f"{h}.mlp.down_proj")
        t.add("final_norm", "model.norm")
        return t.head()


# the first three are the records of their model_type (llama's Gemma2, Qwen2, Qwen3 are their parts)
RECORDS: tuple[Family, ...] = (
    LayeredGemma2(),
    LayeredQwen2(),
    LayeredQwen3(),
    Gemma3(),
    SmolLM3(),
    Cohere2(),
    Exaone4(),
    Olmo3(),
)
