"""Token mixers, one module each, registered in ``MIXERS`` (``base.py``: the interface, the KV cache or
state and the masks); their numerical forms live in ``ops/``. A new mixer is a module here: every module
of the package is imported below, so its registration needs no line elsewhere."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "ops"):
        importlib.import_module(f"{__name__}.{_module.name}")
