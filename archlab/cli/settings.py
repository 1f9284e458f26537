"""How the archlab commands read their arguments and answer ``--help``: ``key=value`` settings checked
against the command's schema (archlab/config/commands.py), and one help layout for the commands that parse
their own settings (``help_text``) and the Hydra apps (``hydra_help_text``) alike."""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import fields
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from archlab.config import OPTIONS
from archlab.config.fields import plain_dict
from archlab.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

HELP_FLAGS = ("-h", "--help")
T = TypeVar("T", bound="DataclassInstance")  # a command's schema: a dataclass


def wants_help(argv: Sequence[str]) -> bool:
    """Is ``-h`` or ``--help`` among the arguments (as a whole argument, not inside a value)?"""
    return any(arg in HELP_FLAGS for arg in argv)


def _type_name(hint: Any) -> str:
    """A field's type as an error message says it: ``int``, ``int or null``, ``list of int or null``."""
    args = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) is Union:
        return " or ".join(map(_type_name, args)) + " or null"
    if get_origin(hint) is list:
        return f"list of {_type_name(args[0])}"
    return getattr(hint, "__name__", str(hint))


def _is_text(hint: Any) -> bool:
    """A ``str`` or ``Optional[str]`` field: its value is taken verbatim, not read as YAML."""
    return hint is str or hint == Optional[str]


def parse(schema: type[T], argv: Sequence[str], bare: Optional[str] = None) -> T:
    """``key=value`` arguments -> a ``schema`` instance. Text fields take the value verbatim (commas,
    quotes, colons, ``${`` and all); other values are read as YAML (numbers, null, ``[1,2]``). One argument
    without ``=`` is the ``bare`` field's value. Raises one ConfigError naming the first bad argument."""
    hints = get_type_hints(schema)
    names = [f.name for f in fields(schema)]
    given: dict[str, str] = {}
    for arg in argv:
        key, sep, raw = arg.partition("=")
        if not sep and bare and not arg.startswith("-"):
            key, raw = bare, arg
        elif not sep or key not in names:
            also = f"; one argument without '=' is taken as {bare}" if bare else ""
            raise ConfigError(
                key if sep else "argument", raw if sep else arg, f"key=value with a key among {names}{also}"
            )
        if key in given:
            raise ConfigError(key, raw, f"one value for {key} (also given as {given[key]!r})")
        given[key] = raw
    values: dict[str, Any] = {}
    for key, raw in given.items():
        try:
            values[key] = raw if _is_text(hints[key]) else yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(key, raw, f"a value of type {_type_name(hints[key])}") from None
    cfg = OmegaConf.structured(schema)
    for key, value in values.items():
        try:
            cfg = OmegaConf.merge(cfg, {key: value})
        except OmegaConfBaseException:
            raise ConfigError(key, value, f"a value of type {_type_name(hints[key])}") from None
    for f in fields(schema):
        if OmegaConf.is_missing(cfg, f.name):
            raise ConfigError(f.name, None, f"a value (required): {f.metadata.get('help', '')}")
    # unresolved: a text value such as a prompt may hold "${...}", which is not an interpolation here
    return schema(**plain_dict(cfg))


def _settings_lines(schema: type, values: Mapping[str, Any], skip: Sequence[str] = ()) -> list[str]:
    """One line per field: name, what it is, and its default (or ``required``), as typed on the command line."""
    shown = [f for f in fields(schema) if f.name not in skip]
    width = max(len(f.name) for f in shown) + 2
    lines = []
    for f in shown:
        value = values.get(f.name)
        default = "required" if value == "???" else f"default {value if isinstance(value, str) else json.dumps(value)}"
        lines.append(f"  {f.name:<{width}}{f.metadata.get('help', '')} ({default})")
    return lines


def help_text(prog: str, doc: Optional[str], schema: type, bare: Optional[str] = None) -> str:
    """The ``--help`` of a command that parses its own ``key=value`` settings: usage, what it does (``doc``,
    the command module's docstring: None under ``python -OO``), and every setting with its description and
    default."""
    values = {f.name: f.default for f in fields(schema)}
    usage = f"usage: {prog} {f'[{bare}=]<path> ' if bare else ''}[key=value ...]"
    return "\n".join(
        [usage, "", textwrap.dedent(doc or "").strip(), "", "settings (key=value):", *_settings_lines(schema, values)]
    )


def hydra_help_text(prog: str, doc: Optional[str], config_name: str, schema: type) -> str:
    """The ``--help`` of a Hydra command: usage, what it does, its own settings with their composed
    defaults, and the config groups it composes (every option, the default marked)."""
    from archlab.build import CONF_DIR, compose

    cfg = compose(config_name, return_hydra_config=True)
    choices = {
        group: choice
        for group, choice in cfg.hydra.runtime.choices.items()
        if not group.startswith("hydra/") and "@" not in group and (CONF_DIR / group).is_dir()
    }
    values = plain_dict(cfg)
    lines = [
        f"usage: {prog} [key=value ...]   (Hydra overrides; also --cfg job, --hydra-help)",
        "",
        textwrap.dedent(doc or "").strip(),
        "",
        "settings (key=value):",
        *_settings_lines(schema, values, skip=[g.split("/")[0] for g in choices]),
        "",
        "config groups (group=option, then group.field=value for one field; * marks the default):",
    ]
    width = max(len(g) for g in choices) + 2
    for group, choice in sorted(choices.items()):
        options = sorted({p.stem for p in (CONF_DIR / group).glob("*.yaml")} | set(_stored(group)))
        listed = ", ".join(f"{o}*" if o == choice else o for o in options)
        lines += textwrap.wrap(listed, 110, initial_indent=f"  {group:<{width}}", subsequent_indent=" " * (width + 2))
    if "model" in values:
        lines += option_fields_lines()
    return "\n".join(lines)


def _stored(group: str) -> list[str]:
    """The options ``config.store`` holds in ``group`` (a registered mixer or MLP without a YAML file)."""
    from hydra.core.config_store import ConfigStore

    try:
        return [name.removesuffix(".yaml") for name in ConfigStore.instance().list(group)]
    except OSError:  # a group it holds nothing of
        return []


def option_fields_lines() -> list[str]:
    """Each mixer's, position scheme's and MLP's own fields (model.<section>.<field>), from its config
    class, a sub-config's as ``<sub>.<field>``: what ``--help`` and docs/models.md list."""
    lines = []
    for section, options in OPTIONS.items():
        noun = options.noun + ("es" if options.noun.endswith("x") else "s")
        lines += ["", f"{noun} (model.{section}.kind=<kind>; each has its own fields, model.{section}.<field>):"]
        width = max(len(kind) for kind in options.classes) + 2
        for kind, cls in sorted(options.classes.items()):
            listed = ", ".join(_field_names(cls, options.subs)) or "(no fields)"
            lines += textwrap.wrap(
                listed, 110, initial_indent=f"  {kind:<{width}}", subsequent_indent=" " * (width + 2)
            )
    return lines


def _field_names(cls: type, subs: dict[str, type]) -> list[str]:
    """``cls``'s fields but ``kind``, a sub-config's (``subs``: field -> its class) spelled ``<sub>.<field>``."""
    names = []
    for f in fields(cls):
        if f.name != "kind":
            names += [f"{f.name}.{g.name}" for g in fields(subs[f.name])] if f.name in subs else [f.name]
    return names


def settings_or_help(
    prog: str, doc: Optional[str], schema: type[T], argv: Sequence[str], bare: Optional[str] = None
) -> Optional[T]:
    """A command's parsed settings, or None once its ``--help`` is printed (when asked for)."""
    if wants_help(argv):
        print(help_text(prog, doc, schema, bare))
        return None
    return parse(schema, argv, bare)


def run_hydra_command(prog: str, doc: Optional[str], config_name: str, schema: type, app: Callable[[], Any]) -> None:
    """A Hydra command's console script: ``--help`` lists its own settings and groups (Hydra's lists
    every group of every command); anything else goes to the Hydra ``app``."""
    if wants_help(sys.argv[1:]):
        print(hydra_help_text(prog, doc, config_name, schema))
        return
    app()
