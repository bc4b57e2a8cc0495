import pytest

from paratrain.errors import ConfigError
from paratrain.runtime.accumulation import Windows
from tests.support.training import max_abs_diff, train


def test_windows_and_short_last_window() -> None:
    windows = Windows(every=3)
    syncs: list[object] = []
    for i in range(7):
        window = windows.begin(1, last=i == 6)
        windows.end(1)
        syncs.append(window.sync)
        if window.sync:
            syncs.append(window.correction())
            window.stepped.add(0)
    assert syncs == [False, False, True, 1.0, False, False, True, 1.0, True, 3.0]


def test_each_model_has_its_own_window() -> None:
    windows = Windows(every=2)
    d, g = windows.begin(1, last=False), windows.begin(2, last=False)
    windows.end(1), windows.end(2)
    assert (d.sync, g.sync) == (False, False)
    d, g = windows.begin(1, last=False), windows.begin(2, last=False)
    assert (d.sync, g.sync) == (True, True)


def test_nested_blocks_of_one_model_are_refused() -> None:
    windows = Windows(every=2)
    windows.begin(1, last=False)
    windows.begin(2, last=False)  # another model may nest (D(G(z)))
    with pytest.raises(ConfigError, match="of the same model"):
        windows.begin(1, last=False)


def test_grad_accum_matches_the_large_batch_in_one_process() -> None:
    # 4 micro-batches of 4 == one batch of 16, including a short last window (36 = 2x16 + 4).
    for optimizer in ("sgd", "adamw"):
        accumulated = train(
            strategy="cpu", optimizer=optimizer, batch_size=4, grad_accum=4, n=36, epochs=2
        )
        large = train(strategy="cpu", optimizer=optimizer, batch_size=16, n=36, epochs=2)
        assert accumulated["steps"] == large["steps"] == 6
        assert max_abs_diff(accumulated["weights"], large["weights"]) <= 1e-6
