from paratrain.accumulation import Accumulation
from tests.support.training import max_abs_diff, train


def test_windows_and_short_last_window() -> None:
    acc = Accumulation(every=3)
    syncs = []
    for i in range(7):
        syncs.append(acc.begin(last_batch=i == 6))
        if acc.sync:
            syncs.append(acc.correction())
            acc.reset()
    assert syncs == [False, False, True, 1.0, False, False, True, 1.0, True, 3.0]


def test_grad_accum_matches_the_large_batch_in_one_process() -> None:
    # 4 micro-batches of 4 == one batch of 16, including a short last window (36 = 2x16 + 4).
    for optimizer in ("sgd", "adamw"):
        accumulated = train(
            strategy="cpu", optimizer=optimizer, batch_size=4, grad_accum=4, n=36, epochs=2
        )
        large = train(strategy="cpu", optimizer=optimizer, batch_size=16, n=36, epochs=2)
        assert accumulated["steps"] == large["steps"] == 6
        assert max_abs_diff(accumulated["weights"], large["weights"]) <= 1e-6
