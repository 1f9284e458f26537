#!/usr/bin/env python3
"""The two-command start: ``python3 scripts/bootstrap.py train|test [args]`` (what ``make train`` and
``make test`` run) sets up ``.venv`` where it is missing or stale, then runs the command in it; ``explore``
(the property tests on new random draws), ``lint``, ``format`` and ``typecheck`` (``make explore`` ...) run
the same way, ``setup`` only sets up.

Standard library only, so it runs on a machine with nothing but Python >= 3.10 and a clone. Each call
reuses what an earlier one set up: torch is installed only where the venv lacks it, the project only
where it is not installed or pyproject.toml changed since (a stamp file in the venv records which).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = ".archlab-install"  # in the venv: what the project was last installed from
TORCH = "torch==2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INDEX_ENV = "ARCHLAB_TORCH_INDEX"  # a package index to take torch from, instead of the choice below
# an unreachable CPU index fails within seconds, leaving PyPI to try
FAST_FAIL = ["--timeout", "5", "--retries", "0"]
MIN_PYTHON = (3, 10)


def has_nvidia_gpu(which: Callable[[str], Optional[str]] = shutil.which) -> bool:
    """Whether this machine has an NVIDIA driver (``nvidia-smi`` on the PATH)."""
    return which("nvidia-smi") is not None


def torch_installs(env: Mapping[str, str], gpu: bool) -> list[list[str]]:
    """The ``pip install`` arguments to try in turn for torch: the index in ``ARCHLAB_TORCH_INDEX`` alone
    where set; with a GPU, PyPI's CUDA build; without, the CPU build from PyTorch's index (PyPI's Linux
    wheel carries gigabytes of CUDA libraries), then PyPI where that index cannot be reached."""
    index = env.get(INDEX_ENV, "").strip()
    if index:
        return [[TORCH, "--index-url", index]]
    if gpu:
        return [[TORCH]]
    return [[TORCH, "--index-url", CPU_INDEX, *FAST_FAIL], [TORCH]]


def stamp_text(root: Path) -> str:
    """What the project's install depends on: its location (an editable install points there) and the
    exact pyproject.toml (dependencies, extras, entry points)."""
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    return f"{root.resolve()}\n{digest}\n"


def needs_project_install(venv_dir: Path, root: Path, installed: bool) -> bool:
    """Install the project where it is not installed, or was installed from another checkout or another
    pyproject.toml than this one."""
    stamp = venv_dir / STAMP
    return not installed or not stamp.exists() or stamp.read_text() != stamp_text(root)


# the tests on every core (pytest-xdist), each test file on one worker: its module fixtures are built once
PYTEST = ["python", "-m", "pytest", "-q", "-n", "auto", "--dist", "loadfile", "--no-loadscope-reorder"]
LINT = [["ruff", "check", "."], ["ruff", "format", "--check", "."]]
FORMAT = [["ruff", "format", "."], ["ruff", "check", "--fix", "."]]
# [tool.basedpyright] of this pyproject.toml, not a pyrightconfig.json of a parent directory
TYPECHECK = [["basedpyright", "--project", "."]]
# the property tests under Hypothesis' "explore" profile (tests/conftest.py): new random draws on every run,
# more of them than make test's fixed ones; one worker per test
EXPLORE = ["python", "-m", "pytest", "-q", "-n", "3", "--hypothesis-profile=explore", "tests/test_properties.py"]


def suite_commands(extra: Sequence[str] = ()) -> list[list[str]]:
    """The project's test command, in order: lint, format check, type check, then the tests (``extra``
    goes to pytest)."""
    return [*LINT, *TYPECHECK, PYTEST + list(extra)]


# what each command runs in the venv once it is set up (train hands the terminal over, see main)
COMMANDS: dict[str, Callable[[Sequence[str]], list[list[str]]]] = {
    "setup": lambda extra: [],
    "test": suite_commands,
    "explore": lambda extra: [EXPLORE + list(extra)],
    "lint": lambda extra: LINT,
    "format": lambda extra: FORMAT,
    "typecheck": lambda extra: TYPECHECK,
}


def venv_bin(venv_dir: Path, name: str) -> Path:
    """An executable the venv installed (its python, pip, archlab-train, ruff)."""
    return venv_dir / "bin" / name


def _has(python: Path, probe: str) -> bool:
    """Run ``probe`` (exits 0 for yes) in the venv's Python, isolated: the checkout itself is not on its path."""
    done = subprocess.run(
        [str(python), "-I", "-c", probe], cwd=str(python.parent), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return done.returncode == 0


def _say(message: str) -> None:
    print(f"bootstrap: {message}", flush=True)


def _pip(python: Path, args: Sequence[str]) -> int:
    cmd = [str(python), "-m", "pip", "install", *args]
    _say(" ".join(["pip install", *args]))
    return subprocess.run(cmd, cwd=str(ROOT)).returncode


def _uv(python: Path, args: Sequence[str]) -> int:
    """``uv pip install`` into the venv of ``python`` (uv itself installed there by pip)."""
    _say(" ".join(["uv pip install", *args]))
    uv = str(python.parent / "uv")
    return subprocess.run([uv, "pip", "install", "--python", str(python), *args], cwd=str(ROOT)).returncode


def install_project(python: Path) -> int:
    """The project and its dev extras, keeping the torch already installed: through uv, which resolves
    and installs the hundred-odd packages in seconds where pip takes minutes, and with pip where uv cannot
    be had or fails. Both compile the packages' bytecode as they install them (uv only when asked): where
    PYTHONDONTWRITEBYTECODE is set, nothing else would, and every process (each test's subprocess) would
    compile lightning, torchmetrics and transformers from source again, seconds each."""
    if _pip(python, ["uv"]) == 0 and _uv(python, ["--compile-bytecode", "-e", ".[dev]"]) == 0:
        return 0
    _say("installing with pip instead")
    return _pip(python, ["-e", ".[dev]"])


def setup(venv_dir: Path = VENV, root: Path = ROOT) -> Path:
    """Make ``venv_dir`` ready to run the project; returns its Python."""
    python = venv_bin(venv_dir, "python")
    if not python.exists():
        _say(f"creating {venv_dir}")
        try:
            venv.EnvBuilder(with_pip=True, symlinks=True, clear=venv_dir.exists()).create(str(venv_dir))
        except (OSError, subprocess.CalledProcessError) as err:  # e.g. Debian's python3 without ensurepip
            sys.exit(f"bootstrap: could not create {venv_dir} ({err}); on Debian/Ubuntu: apt install python3-venv")
    if not _has(python, "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"):
        attempts = torch_installs(os.environ, has_nvidia_gpu())
        for i, args in enumerate(attempts):
            if _pip(python, args) == 0:
                break
            if i + 1 < len(attempts):
                _say("that failed; trying the next source")
        else:
            sys.exit(f"bootstrap: could not install {TORCH} (set {INDEX_ENV} to a package index that has it)")
    installed = _has(python, "import importlib.metadata as m; m.version('archlab')")
    if needs_project_install(venv_dir, root, installed):
        if install_project(python) != 0:
            sys.exit("bootstrap: could not install the project (pip install -e '.[dev]')")
        (venv_dir / STAMP).write_text(stamp_text(root))
    else:
        _say(f"{venv_dir} is up to date")
    return python


def _venv_env(venv_dir: Path) -> dict[str, str]:
    """This process's environment with the venv activated (its bin first on the PATH)."""
    env = {**os.environ, "VIRTUAL_ENV": str(venv_dir)}
    env["PATH"] = os.pathsep.join([str(venv_bin(venv_dir, "python").parent), env.get("PATH", "")])
    env.pop("PYTHONHOME", None)
    return env


def run_commands(commands: Sequence[Sequence[str]], venv_dir: Path = VENV) -> int:
    """Run each command with the venv's executable, in order; stop at the first that fails."""
    env = _venv_env(venv_dir)
    for cmd in commands:
        _say(" ".join(cmd))
        code = subprocess.run([str(venv_bin(venv_dir, cmd[0])), *cmd[1:]], cwd=str(ROOT), env=env).returncode
        if code != 0:
            return code
    return 0


def main(argv: Sequence[str]) -> int:
    usage = f"usage: python3 scripts/bootstrap.py {{{'|'.join(['train', *COMMANDS])}}} [arguments for archlab-train or pytest]"
    if sys.version_info < MIN_PYTHON:
        sys.exit(
            f"bootstrap: archlab needs Python >= {'.'.join(map(str, MIN_PYTHON))}; this is {sys.version.split()[0]}"
        )
    if not argv or (argv[0] != "train" and argv[0] not in COMMANDS):
        print(usage, file=sys.stderr)
        return 2
    command, extra = argv[0], list(argv[1:])
    setup()
    if command == "train":
        train = str(venv_bin(VENV, "archlab-train"))
        os.execve(train, [train, *extra], _venv_env(VENV))  # the run owns the terminal: its bar, Ctrl-C
    return run_commands(COMMANDS[command](extra))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
