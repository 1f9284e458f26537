"""Every command's schema in Hydra's ConfigStore, so YAML files and overrides are type-checked against
them, a group option for each registered mixer and MLP without a YAML file of its own, and the resolvers
the YAML files use."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from archlab.config.commands import BenchConfig, CheckConfig, CoordConfig
from archlab.config.model import OPTIONS
from archlab.config.train import TrainConfig, sweep_dir_or, world_size


def _conf_dir() -> Path:
    """The directory of the package ``archlab.conf``: conf/ in a checkout (an editable install), archlab/conf/
    in an installed wheel. pyproject maps the package to conf/ (setuptools package-dir), which a type
    checker reading archlab/ cannot follow: hence the import by name."""
    conf = import_module("archlab.conf")
    if conf.__file__ is None:
        raise ImportError(f"archlab.conf has no __init__.py ({conf.__path__}): reinstall archlab")
    return Path(conf.__file__).parent


CONF_DIR = _conf_dir()
# the option classes register_configs last stored: a call that finds the same ones has nothing to do (each
# compose calls it, and building the schemas of every option takes about half a second)
_stored: tuple = ()


def register_configs() -> None:
    """Store ``check_schema``, ``bench_schema``, ``coord_schema`` and ``train_schema`` (each conf/<command>.yaml lists its
    schema first; a model's ``attention`` and ``mlp`` composed onto their options' ``schema``), a group
    option ``model/<section>=<kind>`` setting only the kind for every option no YAML file names, the ``archlab.world_size`` resolver the fsdp trainer sizes its mesh with and the
    ``archlab.sweep_dir_or`` one that puts a sweep's MLflow store in the sweep's directory."""
    global _stored
    options_now = tuple((section, tuple(options.classes.items())) for section, options in OPTIONS.items())
    if options_now == _stored:
        return
    cs = ConfigStore.instance()
    for name, schema in (
        ("check_schema", CheckConfig),
        ("bench_schema", BenchConfig),
        ("coord_schema", CoordConfig),
        ("train_schema", TrainConfig),
    ):
        node = OmegaConf.structured(schema)
        if OmegaConf.select(node, "model") is not None:  # any option's fields, the chosen one's kept
            for section, options in OPTIONS.items():
                node.model[section] = options.schema()
        cs.store(name=name, node=node)
    for section, options in OPTIONS.items():  # model/attention=<kind>: a registered option is selectable as it is
        for kind in options.classes:
            if not (CONF_DIR / "model" / section / f"{kind}.yaml").exists():  # a YAML sets more than the kind
                cs.store(group=f"model/{section}", name=kind, node={"kind": kind})
    OmegaConf.register_new_resolver("archlab.world_size", world_size, replace=True)
    OmegaConf.register_new_resolver("archlab.sweep_dir_or", sweep_dir_or, replace=True)
    _stored = options_now
