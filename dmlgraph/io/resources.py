"""Where the bundled models are: package data when installed, the checkout's models/ otherwise.

The wheel installs the repository's models/ folder (the demo model and the corpus models the
benchmarks run) as the package `dmlgraph.models` (pyproject.toml maps it), so `dmlgraph demo` and
`python -m benchmarks` work from any folder.
"""
from __future__ import annotations

import importlib.resources
import os

_CHECKOUT_MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "models")


def models_dir() -> str:
    """The folder holding the bundled models."""
    try:
        found = importlib.resources.files("dmlgraph.models")
    except ModuleNotFoundError:  # a checkout on sys.path, not installed: the repository's folder
        return _CHECKOUT_MODELS
    return os.fspath(found)  # type: ignore[call-overload]  # (a real folder: setuptools installs files)


def bundled_model(relpath: str) -> str:
    """The path of a bundled model, e.g. "synthetic/causal_attention.onnx"."""
    return os.path.join(models_dir(), *relpath.split("/"))


DEMO_MODEL = "synthetic/causal_attention.onnx"
