"""``paratrain verify-resume`` passes restart-safe scripts and fails their planted mutants.

    pytest -m e2e tests/restart_mutants         # 2 safe scripts and 3 mutants, 1 rank
    pytest -m mutants tests/restart_mutants     # every script at 1 and 2 ranks (about 1.5 h)
    make mutants-test                           # the same, as a table (TABLE.md)

A safe script must pass: exit code 0, every killed run matches. A mutant must fail for its
defect: exit code 1 with a killed run that DIFFERS (not a crash, not non-determinism), and the
first difference is the state its docstring names.
"""

from __future__ import annotations

import pytest

from tests.restart_mutants.table import SCRIPTS, Case, Result, cases, verify

SMALL = [
    Case(SCRIPTS / name, 1)
    for name in (
        "safe_while_loop.py",
        "safe_save_every_k.py",
        "mutant_untracked_counter.py",
        "mutant_random_instance.py",
        "mutant_enumerate_index.py",
    )
]


def check(result: Result) -> None:
    case = result.case
    detail = (
        f"{case.name} at {case.nproc} rank(s): {result.verdict} {result.first_difference}\n"
        f"{result.stderr[-3000:]}"
    )
    if case.kind == "safe":
        assert result.code == 0 and result.verdict == "safe", detail
        return
    assert result.code == 1 and result.verdict == "DIFFERS", detail
    assert result.report is not None and result.report["deterministic"] is True, detail
    assert result.difference_path == case.expected_difference(), detail


def name(case: Case) -> str:
    return case.id


@pytest.mark.dist
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", SMALL, ids=name)
@pytest.mark.e2e
def test_verify_resume_tells_safe_scripts_from_mutants(case: Case) -> None:
    check(verify(case))


@pytest.mark.mutants
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("case", cases(), ids=name)
def test_verify_resume_on_every_script(case: Case) -> None:
    check(verify(case))
