"""A dim claim the original mask never reads needs no run-time guard (issue 25 item 4).

stored_tril_past_ts and trilu_past_ts name past_key's and past_value's length alike; their masks
read `Shape(present_key)` (past_key's length + the new keys) and the queries' length, never
past_value's. The guard `dmlgraph__past_sequence__same_in_past_value_2` cost 5-7 onnxruntime
kernels and refused a decode step onnxruntime runs (past_key empty, past_value 3 long, a 4-long
attention_mask: the scores broadcast against the padding). Now the guard covers only the claims
the mask's reads trace back to (`SizeBuilder._cone_reads`); where the names lie the lowered model
still errors exactly where the original does, and never differs where it runs.
"""
from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest

import dmlgraph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (sequence, past_key's length, past_value's length, attention_mask's length)
SETS = [(3, 0, 0, 3), (3, 4, 4, 7), (1, 5, 5, 6),  # the names hold
        (1, 0, 3, 4),  # they do not, and onnxruntime runs the original
        (3, 2, 4, 5), (1, 4, 2, 5), (2, 3, 1, 5), (1, 2, 0, 3)]  # they do not, and the original fails


def _feeds(s: int, pk: int, pv: int, a: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 * s + 10 * pk + pv)
    am = np.ones((2, a), np.int64)
    am[0, 0] = 0
    return {"input_ids": rng.integers(0, 5, (2, s)).astype(np.int64), "attention_mask": am,
            "past_key": rng.standard_normal((2, 1, pk, 16)).astype(np.float32),
            "past_value": rng.standard_normal((2, 1, pv, 16)).astype(np.float32)}


def _run(session: ort.InferenceSession, feeds: dict) -> list | Exception:
    try:
        return session.run(None, feeds)
    except Exception as e:  # noqa: BLE001 (onnxruntime's own error types)
        return e


@pytest.mark.parametrize("name", ["stored_tril_past_ts", "trilu_past_ts"])
def test_an_unread_claim_is_not_guarded_and_never_changes_a_result(name):
    path = os.path.join(ROOT, "models", f"{name}.onnx")
    result = dmlgraph.optimize(path, target="onnx", allow_growth=True)
    assert result.rewrites
    assert not [n for n in result.model.graph.node if "same_in" in "".join(n.output)]
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    original = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    lowered = ort.InferenceSession(result.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ran = 0
    for sizes in SETS:
        f = _feeds(*sizes)
        want, got = _run(original, f), _run(lowered, f)
        if isinstance(want, Exception):
            assert isinstance(got, Exception), sizes  # (an error, never a result the original has not)
            continue
        ran += 1
        assert not isinstance(got, Exception), (sizes, got)
        for w, g in zip(want, got):
            assert w.tobytes() == g.tobytes(), sizes  # bit-exact
    assert ran == 4
