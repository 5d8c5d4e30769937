"""The differential fuzzer of size arithmetic (`fuzz_sizes.py`): a bounded run here, a soak with
FUZZ_EXAMPLES (examples), FUZZ_SEED (hypothesis seed) and FUZZ_COLLECT=1 (record every failing
example and keep going, printing the counts at the end, instead of stopping at the first)."""
from __future__ import annotations

import dataclasses
import os

import fuzz_opsets
import fuzz_sizes
from fuzz_sizes import check_sizes, size_models, size_sets, size_values
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

SOAK = "FUZZ_EXAMPLES" in os.environ
COLLECT = os.environ.get("FUZZ_COLLECT") == "1"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not SOAK, print_blob=True,
                    **({"database": None} if COLLECT or not SOAK else {}),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


@st.composite
def cases(draw):
    case = draw(size_models())
    opset = draw(st.sampled_from(fuzz_opsets.OPSETS))  # (onnx's converter; one discarded keeps 18)
    small = [v for v in size_values(case) if v][:4]
    sets = size_sets(case, [(s, t, t) for s in small for t in small])
    [model] = fuzz_opsets.at_opset([case.model], opset, [fuzz_sizes._feeds(case, d, True, 0) for d in sets])
    if model is not case.model:
        case = dataclasses.replace(case, model=model, description=case.description.replace(":", f" opset {opset}:", 1))
    values = size_values(case)
    picks = draw(st.lists(st.tuples(st.sampled_from(values), st.sampled_from(values), st.sampled_from(values)),
                          min_size=1, max_size=8 if SOAK else 3))
    return case, size_sets(case, picks)


def _test(example):
    case, sets = example
    problems = check_sizes(case, sets, census=True)
    if problems and COLLECT:
        fuzz_sizes.FAILURES.append(f"{case.description}\n  " + "\n  ".join(problems[:6]) + "\n  model: " +
                                   case.model.SerializeToString().hex())
        return
    assert not problems, f"{case.description}:\n" + "\n".join(problems[:10])


test_size_chains_lower_to_the_original = SETTINGS(given(cases())(_test))
if "FUZZ_SEED" in os.environ:
    test_size_chains_lower_to_the_original = seed(int(os.environ["FUZZ_SEED"]))(test_size_chains_lower_to_the_original)


def teardown_module(module):
    if SOAK:
        print("\nfuzz_sizes:", fuzz_sizes.describe_stats())
        print(fuzz_opsets.line())
        for f in fuzz_sizes.FAILURES:
            print("FAIL", f)
    # (FUZZ_COLLECT=1 records failures instead of stopping: the soak still fails if there were any)
    assert not fuzz_sizes.FAILURES, f"{len(fuzz_sizes.FAILURES)} failing examples (listed above)"
