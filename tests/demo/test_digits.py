"""The demo's data: scikit-learn's digits, read from its shipped file without importing it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from paratrain.commands.demo.digits import _digits_arrays, digits_datasets


def test_the_shipped_file_gives_what_load_digits_gives() -> None:
    datasets = pytest.importorskip("sklearn.datasets")
    bunch = datasets.load_digits()
    images, labels = _digits_arrays()
    assert images.shape == (1797, 8, 8)
    np.testing.assert_array_equal(images, bunch.images)
    np.testing.assert_array_equal(labels, bunch.target)


def test_the_split_is_fixed_and_scaled() -> None:
    train, test = digits_datasets()
    assert (len(train), len(test)) == (1438, 359)
    x, y = train.tensors
    assert x.shape[1:] == (1, 8, 8) and float(x.min()) >= 0.0 and float(x.max()) == 1.0
    assert sorted(set(y.tolist())) == list(range(10))
    again, _ = digits_datasets()
    assert bool((again.tensors[1] == y).all())


def test_loading_the_data_does_not_import_scikit_learn() -> None:
    code = (
        "import sys\n"
        "from paratrain.commands.demo.digits import digits_datasets\n"
        "digits_datasets()\n"
        "print('sklearn' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"
