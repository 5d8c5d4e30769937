"""The differential mask fuzzer (`fuzz_masks.py`): a bounded run here, a long soak with `make fuzz`.

FUZZ_EXAMPLES sets the examples per test (default: a bounded run of the suite), FUZZ_MAX_SIZE the
largest size tried (default 300; the soak uses 2049 to reach float16's integer limit). The families
the old sampling proof of `mask_subgraph` got wrong (KNOWN_UNSOUND_SAMPLING) are regression tests:
the symbolic proof either lowers them exactly or declines them, never a wrong bit.
"""
from __future__ import annotations

import dataclasses
import os

import fuzz_masks
import fuzz_opsets
import numpy as np
import pytest
from fuzz_masks import KNOWN_UNSOUND_SAMPLING, check, mask_models, threshold_sizes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T

SOAK = "FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "14"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not SOAK, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


@st.composite
def cases(draw, families: str):
    case = draw(mask_models(families))
    sizes = threshold_sizes(case)
    case = at_drawn_opset(draw(st.sampled_from(fuzz_opsets.OPSETS)), case, sizes)
    pairs = draw(st.lists(st.tuples(st.sampled_from(sizes), st.sampled_from(sizes)), min_size=1,
                          max_size=6 if SOAK else 3))
    # A run-time k of -2^63 is left out where onnx.reference is the oracle (Where over data): its
    # Trilu is numpy's triu, which computes k - 1 and wraps there (keeping nothing instead of all).
    ks = draw(st.lists(st.sampled_from([k for k in fuzz_masks.HUGE_K if k != -2**63] + [3, -3]), min_size=1,
                       max_size=3))
    return case, pairs, ks


@SETTINGS
@given(cases("sound"))
def test_lowered_masks_match_the_original(example):
    """Every target, with and without --exact, at sizes on every threshold: no wrong bit."""
    case, sizes, ks = example
    problems = check(case, sizes, ks)
    assert not problems, f"{case.description} ({case.family}):\n" + "\n".join(problems[:10])


@SETTINGS
@given(cases("unsound"))
def test_known_unsound_sampling_families(example):
    """Thresholds past any sampled size (float constants, products of constants, constants past
    2^31, indices through int8/float16): exact at every size tried."""
    case, sizes, ks = example
    problems = check(case, sizes, ks)
    assert not problems, f"{case.description} ({case.family}):\n" + "\n".join(problems[:10])


def at_drawn_opset(opset: int, case: fuzz_masks.Case, sizes: list[int]) -> fuzz_masks.Case:
    """`case` at `opset` (onnx's converter; a conversion discarded keeps opset 18)."""
    pairs = [case.static] if case.static else [(n, m) for n in sizes[:3] for m in sizes[:3]]
    k = [{"k": np.array(v, np.int64)} for v in (0, 3)] if any(i.name == "k" for i in case.model.graph.input) else [{}]
    feeds = [{"x": fuzz_masks.data(case, n, m, True, n + m), **f} for n, m in pairs for f in k]
    [model] = fuzz_opsets.at_opset([case.model], opset, feeds)
    return case if model is case.model else \
        dataclasses.replace(case, model=model, description=f"opset {opset}: {case.description}")


# ---- the known-unsound families, one concrete model each ---------------------------------------
def _grid_case(family: str, index_type: int, threshold) -> fuzz_masks.Case:
    """x [n, m] -> Where((cols <= rows) and (rows - cols < threshold), x, -inf): a causal mask with
    a window whose size only shows past the sizes the sampling proof tries."""
    b = fuzz_masks.CaseBuilder()
    shape = b.op("Shape", ["x"], "shape")
    grids = []
    for axis, i in ((1, 0), (0, 1)):
        dim = b.op("Gather", [shape, b.const(np.array(i, np.int64), "axis")], "dim", axis=0)
        r = b.op("Range", [b.const(np.array(0, np.int64)), dim, b.const(np.array(1, np.int64))], "range")
        r = r if index_type == T.INT64 else b.op("Cast", [r], "idx", to=index_type)
        grids.append(b.op("Unsqueeze", [r, b.const(np.array([axis], np.int64))], "grid"))
    rows, cols = grids
    np_t = fuzz_masks.NP[index_type]
    if family == "product_constant":
        limit = b.op("Mul", [b.const(np.array(8, np_t)), b.const(np.array(8, np_t))], "limit")
    else:
        limit = b.const(np.array(threshold, np_t), "limit")
    causal = b.op("LessOrEqual", [cols, rows], "causal")
    window = b.op("Less", [b.op("Sub", [rows, cols], "dist"), limit], "window")
    mask = b.op("And", [causal, window], "mask")
    y = b.op("Where", [mask, "x", b.const(np.array(-np.inf, np.float32))], "y")
    return fuzz_masks.finish_case(b, y, T.FLOAT, None, family, [], f"{family}: causal window {threshold}")


UNSOUND_CASES = {
    "product_constant": (T.INT64, 64, [(70, 70)]),
    "float_constant": (T.FLOAT, 7.5, [(12, 12)]),
    "past_int32": (T.INT64, 2**31 + 3, [(5, 5)]),
    "int8_index": (T.INT8, 4, [(200, 200)]),
    "float16_index": (T.FLOAT16, 4, [(2050, 2050)]),
}


@pytest.mark.parametrize("family", sorted(UNSOUND_CASES))
def test_known_unsound_sampling_example(family):
    assert family in KNOWN_UNSOUND_SAMPLING
    index_type, threshold, sizes = UNSOUND_CASES[family]
    problems = check(_grid_case(family, index_type, threshold), sizes)
    assert not problems, "\n".join(problems[:5])


def test_runtime_k_trilu_where_keeps_every_bit():
    """Found by the fuzzer: Where(Trilu(ones, k), x, c) with a run-time k lowered through
    Where(ones, x, c), whose onnxruntime kernel turned x's -0.0 into +0.0; off the band the
    application now reads x itself."""
    b = fuzz_masks.CaseBuilder()
    b.inputs.append(fuzz_masks.h.make_tensor_value_info("k", T.INT64, []))
    ones = b.op("ConstantOfShape", [b.op("Shape", ["x"], "shape")], "ones",
                value=fuzz_masks.numpy_helper.from_array(np.ones(1, np.bool_)))
    band = b.op("Trilu", [ones, "k"], "band", upper=1)
    y = b.op("Where", [band, "x", b.const(np.array(0.0, np.float32), "fill")], "y")
    case = fuzz_masks.finish_case(b, y, T.FLOAT, None, "runtime_k_trilu_where", [0], "trilu k=input -> where_x_c")
    problems = check(case, [(1, 1), (3, 3), (3, 4)], [0, 1, -1])
    assert not problems, "\n".join(problems[:5])


def teardown_module(module):
    if SOAK:
        print("\nfuzz_masks:", fuzz_opsets.line())
