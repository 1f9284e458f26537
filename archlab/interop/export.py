"""``archlab-export``'s work: a run directory, a training checkpoint or a safetensors file written by
archlab, as a Hugging Face directory that ``AutoModelForCausalLM`` and ``AutoTokenizer`` load.

``plan_export`` reads and checks everything cheap first (the source, its model config and tokenizer, the
layout's Hugging Face class, the output directory), raising one ConfigError naming the field; only then
does ``export_hf`` load weights and write files. A run directory exports its ``model.safetensors``, the
final weights the run wrote (as ``archlab-generate`` reads them); a checkpoint, the weights it holds, with
the tokenizer of the run it belongs to. The export carries what evaluating it as the run needs: the EOS that
ended the run's documents (config.json's ``eos_token_id``) and archlab's own tokenizer (``TOKENIZER_FILE``),
the identity its shards record, beside the Hugging Face form of it.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from archlab import checks
from archlab.config import ModelConfig, recorded_model_config
from archlab.errors import ConfigError
from archlab.interop.families.base import bare
from archlab.interop.hf import export_family, exportability, to_hf, write_mtp
from archlab.interop.hf_tokenizer import to_hf_tokenizer
from archlab.nn.validation import validate
from archlab.run_files import EXPORT, HYDRA_FILES, SUMMARY, read_checkpoint, read_summary
from archlab.tokenizer import tokenizer_from_dict
from archlab.weights import CONFIG_KEY, TOKENIZER_KEY, load_weights, read_metadata, read_tokenizer

FORMATS = ("hf",)
SOURCES = "a run directory, a training checkpoint (.ckpt) or a safetensors file written by archlab"
TOKENIZER_FILE = "archlab_tokenizer.json"  # in an export: archlab's tokenizer as its to_dict, the shards' identity


@dataclass
class ExportPlan:
    """What an export reads and writes, every part checked: the weights file (safetensors or .ckpt), its
    model config, its tokenizer, the family (``model_type``) and Hugging Face class it becomes, the output
    directory and the EOS id of the run's data (None where none is known)."""

    weights: Path
    config: ModelConfig
    tokenizer: Any
    family: str
    model_class: str
    out: Path
    eos_id: Optional[int] = None


def run_of(ckpt: Path) -> Optional[Path]:
    """The run directory a checkpoint lies in: the nearest one above it holding a run's summary or export."""
    return next((d for d in ckpt.resolve().parents if (d / SUMMARY).is_file() or (d / EXPORT).is_file()), None)


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` where there is none."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def run_eos(run: Optional[Path]) -> Optional[int]:
    """The EOS id the run's data separated documents with: ``data.eos_id``, else its shards' meta.json (a
    data mixture's first source: the mixture refuses sources whose EOS differ)."""
    data = ((read_summary(run / SUMMARY) or {}).get("config") or {}).get("data") if run is not None else None
    if run is None or not isinstance(data, dict):
        return None
    if isinstance(data.get("eos_id"), int):
        return data["eos_id"]
    mixture = data.get("mixture")
    sources = mixture if isinstance(mixture, dict) else {}
    dirs = [data.get("dir"), *(s.get("dir") for s in sources.values() if isinstance(s, dict))]
    shards = next((d for d in dirs if d), None)
    found = read_json(_as_trained(run, str(shards)) / "meta.json").get("eos_id") if shards else None
    return found if isinstance(found, int) else None


def _as_trained(run: Path, path: str) -> Path:
    """``path`` as the run read it: a relative one against the directory training ran in (Hydra's record of it,
    ``hydra.runtime.cwd``), so a command run from elsewhere finds the same files."""
    hydra = run / HYDRA_FILES / "hydra.yaml"
    if Path(path).is_absolute() or not hydra.is_file():
        return Path(path)
    cwd = OmegaConf.select(OmegaConf.load(hydra), "hydra.runtime.cwd", default=None)
    return Path(str(cwd)) / path if cwd else Path(path)


def read_export_tokenizer(directory: Path, field: str) -> Any:
    """archlab's tokenizer an export carries (``TOKENIZER_FILE``); None where it carries none."""
    spec = read_json(directory / TOKENIZER_FILE)
    if not spec:
        return None
    try:
        return tokenizer_from_dict(spec)
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises a bare Exception for a spec it cannot read
        raise ConfigError(field, str(directory / TOKENIZER_FILE), f"a tokenizer archlab-export wrote ({err})") from None


def _run_tokenizer(ckpt: Path, field: str) -> Any:
    """The tokenizer of the run ``ckpt`` belongs to: the one its export carries, else its data's, the data
    settings its summary records read again (an unfinished run has no export yet); None where neither has one."""
    run = run_of(ckpt)
    if run is None:
        return None
    if (run / EXPORT).is_file():
        tokenizer = read_tokenizer(run / EXPORT, field)
        if tokenizer is not None:
            return tokenizer
    data = ((read_summary(run / SUMMARY) or {}).get("config") or {}).get("data")
    if not isinstance(data, dict) or "_target_" not in data:
        return None
    from archlab.training.instantiate import instantiate_node

    return getattr(instantiate_node(data, "data"), "tokenizer", None)


def read_source(source: str, field: str) -> tuple[Path, ModelConfig, Any]:
    """The weights file ``source`` names (a run directory, a checkpoint or a safetensors file), its model config
    and its tokenizer (None when it has none); ConfigError naming ``field`` for anything else."""
    path = Path(source).expanduser()
    if not path.exists():
        raise ConfigError(field, source, f"{SOURCES}; nothing is at this path")
    if path.suffix == ".ckpt":
        if path.is_dir():
            raise ConfigError(
                field, source, f"a checkpoint file; this is a sharded (FSDP) checkpoint: export its run's {EXPORT}"
            )
        saved = (read_checkpoint(path, field).get("hyper_parameters") or {}).get("model")
        if not isinstance(saved, dict):
            raise ConfigError(field, source, "a checkpoint written by archlab-train (it records no model config)")
        return path, recorded_model_config(saved), _run_tokenizer(path, field)
    if path.is_dir():
        if not (path / EXPORT).is_file():
            raise ConfigError(
                field,
                source,
                f"a run directory holding {EXPORT} (a run writes it when it completes; for an unfinished run give "
                "one of its checkpoints/*.ckpt)",
            )
        path = path / EXPORT
    elif path.suffix != ".safetensors":
        raise ConfigError(field, source, f"{SOURCES} (.safetensors)")
    config = recorded_model_config(json.loads(read_metadata(path, field)[CONFIG_KEY]))
    return path, config, read_tokenizer(path, field)


def plan_export(source: str, format: str, out: str, family: Optional[str] = None) -> ExportPlan:
    """Every check of an export, before any weights are read: ConfigError naming ``source``, ``format``,
    ``out``, ``family`` (where given, one of the families that hold the layout exactly) or the first model
    field that blocks the export (the others listed beside it)."""
    checks.choice("format", format, FORMATS)
    weights, config, tokenizer = read_source(source, "source")
    nearest, problems = exportability(validate(config))
    if problems:
        first, *rest = problems
        also = "".join(f"; also {p.field}={p.wants} (is {bare(p.value)})" for p in rest)
        raise ConfigError(
            first.field,
            first.value,
            f"{first.wants} to export {source} to {nearest.model_class}, the nearest Hugging Face class{first.why}{also}",
        )
    record = export_family(config, family)
    if tokenizer is None:
        raise ConfigError(
            "source",
            source,
            f"weights with a tokenizer ({TOKENIZER_KEY!r} metadata, which a run on text or prepared shards writes): "
            "Hugging Face's AutoTokenizer needs one, and this model has none",
        )
    if tokenizer.vocab_size > config.vocab_size:
        raise ConfigError(
            "source",
            source,
            f"a tokenizer within model.vocab_size={config.vocab_size}; this one has {tokenizer.vocab_size} ids",
        )
    if importlib.util.find_spec("transformers") is None:
        raise ConfigError("format", format, 'hf with transformers installed: pip install -e ".[hf]"')
    eos_id = run_eos(run_of(weights))
    if eos_id is not None and not 0 <= eos_id < config.vocab_size:
        raise ConfigError(
            "source",
            source,
            f"a run whose data's eos_id is within model.vocab_size={config.vocab_size} (it is {eos_id})",
        )
    path = checks.writable_dir("out", out)
    if path.is_dir() and any(path.iterdir()):
        held = ", ".join(sorted(p.name for p in path.iterdir())[:5])
        raise ConfigError("out", out, f"a new or empty directory (this one holds {held})")
    return ExportPlan(weights, config, tokenizer, record.model_type, record.model_class, path, eos_id)


def load_model(weights: Path, config: ModelConfig, field: str = "source") -> Any:
    """The archlab Decoder of a weights file ``read_source`` found, on the CPU, in its stored dtype."""
    if weights.suffix == ".safetensors":
        return load_weights(weights)
    from archlab.build import model_from_state

    state = read_checkpoint(weights, field)["state_dict"]
    return model_from_state(config, {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})


def export_hf(plan: ExportPlan) -> Path:
    """Write the plan's model and tokenizer as a Hugging Face directory (config.json and
    generation_config.json with the EOS id, model.safetensors, tokenizer.json, tokenizer_config.json) with
    archlab's tokenizer beside them (``TOKENIZER_FILE``); returns it."""
    from transformers.utils import logging

    logging.disable_progress_bar()  # one small directory: no "Writing model shards" bar
    model = load_model(plan.weights, plan.config).eval()
    hf_model = to_hf(model, plan.family, eos_token_id=plan.eos_id)
    hf_model.save_pretrained(str(plan.out))
    write_mtp(
        plan.out, model.cfg, model.state_dict(), plan.family
    )  # its multi-token prediction modules, beside the model
    to_hf_tokenizer(plan.tokenizer, plan.config.context_length, plan.eos_id).save_pretrained(str(plan.out))
    (plan.out / TOKENIZER_FILE).write_text(json.dumps(plan.tokenizer.to_dict()) + "\n", encoding="utf-8")
    return plan.out
