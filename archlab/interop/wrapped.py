"""The language model inside a vision-language (or other multimodal) wrapper: a transformers config whose own
``model_type`` no record holds but whose text config (``get_text_config(decoder=True)``) a record does
(Gemma 3's, Llama 4's, Qwen3.5's ...). ``from_hf`` and ``load_hf_dir`` read that language model alone, its
tensors found under the wrapper's prefix (``model.language_model.``, ``language_model.model.`` ...) and named
as the text-only class names them; what else the wrapper holds (its vision tower, projector) is left out,
said in one logged line. The model then exports as the text-only class, as any model of that family."""

from __future__ import annotations

import copy
import logging
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.interop.families import FAMILIES
from archlab.interop.families.base import Family

log = logging.getLogger("archlab.interop")

# what a wrapper's forward leaves unapplied of its text config, by the text model_type, as it runs: Gemma 3's
# (Gemma3ForConditionalGeneration) never caps its logits, whatever final_logit_softcapping says
UNAPPLIED: dict[str, dict[str, Any]] = {"gemma3_text": {"final_logit_softcapping": None}}


def text_config(hf_config: Any) -> Any | None:
    """The text config of a wrapper whose own ``model_type`` no record holds and whose text config's one does
    (tied as the wrapper ties its head, less what its forward leaves unapplied: ``UNAPPLIED``), else None."""
    text = getattr(hf_config, "get_text_config", lambda **_: hf_config)(decoder=True)
    if text is hf_config or getattr(hf_config, "model_type", None) in FAMILIES:
        return None
    if getattr(text, "model_type", None) not in FAMILIES:
        return None
    text = copy.deepcopy(text)
    text.tie_word_embeddings = getattr(hf_config, "tie_word_embeddings", False)  # as transformers ties it
    for key, value in UNAPPLIED.get(text.model_type, {}).items():
        setattr(text, key, value)
    return text


def _prefix(names: list[str], name: str) -> list[str]:
    """The prefixes under which ``name`` (dotted) ends one of ``names``."""
    return [n.removesuffix(name) for n in names if n == name or n.endswith("." + name)]


def language_model_state(record: Family, cfg: ModelConfig, state: dict[str, Tensor], wrapper: str) -> dict[str, Tensor]:
    """``state``'s tensors of the wrapper's language model (those under the prefix its embedding has, its
    head, and its multi-token prediction modules where its checkpoints keep them apart, Qwen3.5's ``mtp.*``),
    named as ``record``'s text-only class names them; logs, in one line, what is left out."""
    maps = record.tensors(cfg)
    embedding = next(n for m in maps if m.archlab == "tok_emb.weight" for n in m.hf)
    inner = embedding.removeprefix(record.prefix)
    found = _prefix(sorted(state), inner)
    if len(found) != 1:
        raise ValueError(
            f"{wrapper}: the language model's embedding ({inner}) is under {found or 'no prefix'}; expected one"
        )
    prefix, taken = found[0], set()
    out = {}
    for name, tensor in state.items():
        if name.startswith(prefix):
            out[record.prefix + name.removeprefix(prefix)] = tensor
            taken.add(name)
    heads = {n for m in maps for n in m.hf if not n.startswith(record.prefix)} | {"lm_head.weight"}  # tied too
    for head in sorted(heads):
        at = _prefix([n for n in state if n not in taken], head)
        if len(at) == 1:  # none where the head is tied to the embedding and not saved
            out[head] = state[at[0] + head]
            taken.add(at[0] + head)
    if record.mtp_keys and record.mtp_scheme == "mtp":  # Qwen3.5's modules: mtp.*, beside the wrapper's parts
        for name in [n for n in state if n.startswith("mtp.")]:
            out[name] = state[name]
            taken.add(name)
    left = sorted(state.keys() - taken)
    parts = sorted({_part(k, prefix) for k in left})
    log.warning(
        "%s: read its language model (%s, %s) alone; left out %d tensors (%s)",
        wrapper,
        record.title,
        record.model_class,
        len(left),
        ", ".join(parts) or "none",
    )
    return out


def _part(name: str, prefix: str) -> str:
    """The shortest dotted start of ``name`` that does not start ``prefix``: the wrapper's part it is in."""
    pieces = name.split(".")
    for i in range(1, len(pieces) + 1):
        start = ".".join(pieces[:i]) + "."
        if not prefix.startswith(start):
            return start.rstrip(".")
    return name
