"""Every command's schema in Hydra's ConfigStore, so YAML files and overrides are type-checked against
them, and the resolvers the YAML files use."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from archlab.config.commands import BenchConfig, CheckConfig, CoordConfig
from archlab.config.model import OPTIONS
from archlab.config.train import TrainConfig, sweep_dir_or, world_size


def register_configs() -> None:
    """Store ``check_schema``, ``bench_schema``, ``coord_schema`` and ``train_schema`` (each conf/<command>.yaml lists its
    schema first; a model's ``attention`` and ``mlp`` composed onto their options' ``schema``), the ``archlab.world_size`` resolver the fsdp trainer sizes its mesh with and the
    ``archlab.sweep_dir_or`` one that puts a sweep's MLflow store in the sweep's directory."""
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
    OmegaConf.register_new_resolver("archlab.world_size", world_size, replace=True)
    OmegaConf.register_new_resolver("archlab.sweep_dir_or", sweep_dir_or, replace=True)
