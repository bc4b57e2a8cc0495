import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
if "PYTEST_XDIST_WORKER" in os.environ:
    # xdist's workers start with COLUMNS=80 and LINES set; the tests of piped output expect the
    # environment of a pipe, which has neither
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


@pytest.fixture(autouse=True, scope="session")
def _run_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Runs write to run_dir (default runs/paratrain): keep that out of the checkout."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(before)
