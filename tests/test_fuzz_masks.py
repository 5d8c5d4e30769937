"""The differential mask fuzzer (`fuzz_masks.py`): a bounded run here, a long soak with `make fuzz`.

FUZZ_EXAMPLES sets the examples per test (default: a bounded run of the suite), FUZZ_MAX_SIZE the
largest size tried (default 300; the soak uses 2049 to reach float16's integer limit). Families the
sampling proof of `mask_subgraph` is known to get wrong run as xfail(strict=False): they flip to
passing when a symbolic proof replaces the sampling.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_masks
from fuzz_masks import KNOWN_UNSOUND_SAMPLING, check, mask_models, threshold_sizes

SOAK = "FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "14"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not SOAK, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


@st.composite
def cases(draw, families: str):
    case = draw(mask_models(families))
    sizes = threshold_sizes(case)
    pairs = draw(st.lists(st.tuples(st.sampled_from(sizes), st.sampled_from(sizes)), min_size=1,
                          max_size=6 if SOAK else 3))
    ks = draw(st.lists(st.sampled_from(fuzz_masks.HUGE_K + [3, -3]), min_size=1, max_size=3))
    return case, pairs, ks


@SETTINGS
@given(cases("sound"))
def test_lowered_masks_match_the_original(example):
    """Every target, with and without --exact, at sizes on every threshold: no wrong bit."""
    case, sizes, ks = example
    problems = check(case, sizes, ks)
    assert not problems, f"{case.description} ({case.family}):\n" + "\n".join(problems[:10])


@pytest.mark.xfail(strict=False, reason="KNOWN_UNSOUND_SAMPLING: mask_subgraph's sampling proof misses thresholds "
                   "past the sampled sizes (" + "; ".join(KNOWN_UNSOUND_SAMPLING.values()) + ")")
@SETTINGS
@given(cases("unsound"))
def test_known_unsound_sampling_families(example):
    case, sizes, ks = example
    problems = check(case, sizes, ks)
    assert not problems, f"{case.description} ({case.family}):\n" + "\n".join(problems[:10])
