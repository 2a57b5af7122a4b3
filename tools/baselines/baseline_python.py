"""Where the baselines' venv is, and how a script moves itself into it.

tools/baselines/setup.sh puts the venv at $NANODDP_BASELINES_VENV, by default
${XDG_CACHE_HOME:-$HOME/.cache}/nanoddp-baselines/venv. A script that needs torch calls
reexec_unless_importable("torch", ...) before importing it: run with a Python that has the
modules, it goes on; run with one that lacks them (plain `python3`), it runs itself again,
same arguments, with the venv's Python; with no venv either, it stops and names the setup line.
"""

import importlib.util
import os
import sys

VENV_ENV = "NANODDP_BASELINES_VENV"
SETUP_LINE = "bash tools/baselines/setup.sh"
_GUARD = "NANODDP_BASELINES_REEXEC"


def venv_dir():
    """The venv folder setup.sh creates (whether or not it exists yet)."""
    if os.environ.get(VENV_ENV):
        return os.environ[VENV_ENV]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "nanoddp-baselines", "venv")


def venv_python():
    """The venv's Python executable (whether or not it exists yet)."""
    return os.path.join(venv_dir(), "bin", "python")


def reexec_unless_importable(*modules):
    """Return if every module imports here; else exec the venv's Python on this same command."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    python = venv_python()
    if os.environ.get(_GUARD) or not os.path.exists(python):
        sys.exit(f"error: {sys.executable} lacks {', '.join(missing)} and no baseline venv "
                 f"provides them ({python}): run `{SETUP_LINE}` (or set {VENV_ENV})")
    os.environ[_GUARD] = "1"
    os.execv(python, [python, os.path.abspath(sys.argv[0])] + sys.argv[1:])
