"""What an installed archlab holds: every package pyproject.toml names, the Hydra configs from the top-level
conf/ inside the wheel as archlab.conf, and the commands finding them there."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_of_the_tree_is_listed():
    """pyproject.toml lists the packages by name (discovery cannot map conf/ to archlab.conf), archlab's
    Hydra plugins beside them: a new subpackage left out of the list would be missing from every install."""
    inits = [*(ROOT / "archlab").rglob("__init__.py"), *(ROOT / "hydra_plugins").rglob("__init__.py")]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in inits} | {"archlab.conf"}
    assert set(PYPROJECT["tool"]["setuptools"]["packages"]) == on_disk
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"archlab.conf": "conf"}


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="no setuptools to build a wheel with")
def test_the_wheel_carries_the_configs_inside_the_package(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(ROOT),
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("archlab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"archlab/conf/{p.relative_to(ROOT / 'conf')}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert len(expected) > 50 and expected <= names  # every preset, group option and command config
    assert "archlab/conf/__init__.py" in names and not any(n.startswith("conf/") for n in names)


def test_the_installed_package_reads_its_configs_from_conf():
    import archlab.conf
    from archlab.build import CONF_DIR, compose

    assert CONF_DIR == Path(archlab.conf.__file__).parent
    assert (CONF_DIR / "model" / "gpt2.yaml").read_text() == (ROOT / "conf" / "model" / "gpt2.yaml").read_text()
    assert compose("check", ["model=gpt2"]).model.d_model == 768


def test_readme_names_every_extra():
    """README's list of extras names each one pyproject.toml defines (the training docs send users to them)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sentence = readme[readme.index("The extras:") :].split("\n\n")[0]
    assert set(re.findall(r"`([\w-]+)`", sentence)) >= set(PYPROJECT["project"]["optional-dependencies"])
