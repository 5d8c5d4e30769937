"""A pytest plugin: the sha256 of every model `pipeline.lower` writes, per test and call.

The corpus holds no If/Loop/Scan body and no local function, so the corpus hashes (`hash_corpus.py`) cannot
show that a restructure of bodies left the written models alone; the body tests build hundreds
of such models. Run them twice (before/after) and compare the two files:

    PYTHONPATH=tests HASH_LOWERINGS=/tmp/before.json .venv/bin/pytest -p hash_lowerings \
        tests/test_nested.py tests/test_nested_together.py tests/test_outer_reads.py \
        tests/test_body_reuse.py tests/test_inference_scopes.py

Hypothesis runs derandomized (no database) under it, so two runs make the same models.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any, Iterator

import pytest

RECORD: dict[str, str] = {}
_test = {"id": "", "calls": 0}


def pytest_configure(config: pytest.Config) -> None:
    from hypothesis import settings

    settings.register_profile("hash_lowerings", derandomize=True, database=None)
    settings.load_profile("hash_lowerings")
    import dmlgraph.pipeline as pipeline

    lower = pipeline.lower

    def hashed(*args: Any, **kwargs: Any) -> Any:
        result = lower(*args, **kwargs)
        RECORD[f"{_test['id']}#{_test['calls']}"] = hashlib.sha256(
            result.model.SerializeToString(deterministic=True)).hexdigest()
        _test["calls"] += 1
        return result

    for name, module in list(sys.modules.items()):  # (every module that took `lower` by name)
        if name.startswith("dmlgraph") and getattr(module, "lower", None) is lower:
            module.lower = hashed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _test["id"], _test["calls"] = item.nodeid, 0
    yield


def pytest_unconfigure(config: pytest.Config) -> None:
    out = os.environ.get("HASH_LOWERINGS")
    if out:
        with open(out, "w") as f:
            json.dump(RECORD, f, indent=0, sort_keys=True)
