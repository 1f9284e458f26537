"""The worked examples of docs/architecture.md ("add a variant"): the mixer's config class is the module's
own, as written; the position scheme runs as written (its class registers, counts and builds, and its bias
is the table entry of each distance)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).parents[1] / "docs" / "architecture.md"

SCRIPT = """
from dataclasses import dataclass
import torch
from torch import Tensor
from archlab.config import ModelConfig, PositionConfig, position_config
from archlab.nn.component import Role
from archlab.nn.positions import POSITIONS, Position, uninitialised_embedding
from archlab import build_model, compose_model, count_params
from archlab.training.parametrization import roles

{example}

base = compose_model(["model=gpt2"])
cfg = compose_model(["model=gpt2", "model/position=learned_bias"])
assert count_params(cfg)["total"] == count_params(base)["total"] - 1024 * 768 + 1024 * 12
small = compose_model(["model=nano", "model/position=learned_bias", "model.n_layer=1"])
model = build_model(small)  # checked against the closed form, then initialised
bias = model.position.bias(torch.arange(5), torch.arange(5))
table = model.position.table.weight
assert bias.shape == (4, 5, 5)
assert all(torch.equal(bias[h, i, j], table[i - j, h]) for h in range(4) for i in range(5) for j in range(i + 1))
assert roles(model)[id(table)] is Role.VECTOR  # param=mup can scale it
print("ok")
"""


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_the_mixer_example_is_the_modules_own_code():
    """The config class the differential-attention example shows is archlab/nn/mixers/differential.py's,
    line for line, and the files it names exist."""
    section = _section("## Add a variant: a token mixer")
    (example,) = re.findall(r"```python\n(.*?)```", section, re.S)
    root = DOC.parents[1]
    assert example in (root / "archlab" / "nn" / "mixers" / "differential.py").read_text()
    for path in re.findall(r"`((?:archlab|conf|tests)/[\w/.]+\.(?:py|yaml))`", section):
        assert (root / path).is_file(), path


def test_the_position_scheme_example_works_as_written():
    example = re.findall(r"```python\n(.*?)```", _section("## Add a variant: a position scheme"), re.S)[0]
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(example=example)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
