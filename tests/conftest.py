import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def _run_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Runs write to run_dir (default runs/paratrain): keep that out of the checkout."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(before)
