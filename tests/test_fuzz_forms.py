"""The fuzzer of mask forms (`fuzz_forms.py`): a bounded run here, a long soak with `make fuzz`.

FUZZ_EXAMPLES sets the examples (default: a bounded run of the suite). Each generated model must
optimize and inspect without a crash, give onnxruntime's outputs on both targets, and have every
band tensor the oracle finds lowered or declined with a reason. The soak prints the share lowered.
"""
from __future__ import annotations

import os

import fuzz_forms
from fuzz_forms import Stats, check, form_models
from hypothesis import HealthCheck, given, settings

SOAK = "FUZZ_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "10"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not SOAK, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])
TOTAL = Stats()


@SETTINGS
@given(form_models())
def test_forms_lower_or_decline_and_match_onnxruntime(case):
    stats, problems = check(case)
    TOTAL.add(stats)
    assert not problems, f"{case.description}:\n" + "\n".join(problems[:10])


def test_report_share_lowered():
    """(Runs after the fuzz test in file order: prints what it saw; `make fuzz` shows it with -s.)"""
    print(f"\nfuzz_forms: {TOTAL.line()}")
    for reason, n in sorted(TOTAL.reasons.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  declined {n}x  {reason}")
    assert TOTAL.wrong == 0 and TOTAL.crashes == 0 and fuzz_forms is not None
