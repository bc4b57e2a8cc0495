"""The ranks' tracebacks in torchrun's output: the rank that failed on its own comes first."""

from __future__ import annotations

from paratrain.commands.run.failure import exit_status, failure_message
from paratrain.commands.run.rank_output import RankTracebacks, raised_at

RANK0_LOST = [
    "[rank0]: Traceback (most recent call last):\n",
    '[rank0]:   File "/job/train.py", line 8, in <module>\n',
    "[rank0]:     run.step(opt)\n",
    "[rank0]:     ^^^^^^^^^^^^^\n",
    "[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1234.\n",
]
RANK1_OWN = [
    "[rank1]: Traceback (most recent call last):\n",
    '[rank1]:   File "/job/train.py", line 7, in <module>\n',
    "[rank1]:     load(batch)\n",
    '[rank1]:   File "/site-packages/lib.py", line 3, in load\n',
    "[rank1]:     raise ValueError('bad shape')\n",
    "[rank1]: ValueError: bad shape\n",
]
REPORT = (
    "Root Cause (first observed failure):\n[0]:\n  time      : t\n  host      : h\n"
    "  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 11)\n"
)


def _show(lines: list[str]) -> tuple[list[str], RankTracebacks]:
    ranks = RankTracebacks()
    shown = [out for line in lines for out in ranks.feed(line)]
    return shown + ranks.flush(), ranks


def test_a_peer_loss_is_one_line_and_the_own_failure_is_whole() -> None:
    interleaved = [RANK0_LOST[0], RANK1_OWN[0], *RANK0_LOST[1:], *RANK1_OWN[1:], "torchrun\n"]
    shown, ranks = _show(["hello\n", "[rank0]: step 1\n", *interleaved])
    assert shown[:2] == ["hello\n", "[rank0]: step 1\n"]
    assert shown[2].startswith("[rank0]: RuntimeError: Connection closed by peer (a peer failed")
    assert shown[3:] == [*RANK1_OWN, "torchrun\n"]
    assert ranks.own[1][-1] == "ValueError: bad shape\n" and 0 not in ranks.own


def test_peer_losses_are_shown_whole_when_no_rank_failed_on_its_own() -> None:
    shown, ranks = _show(RANK0_LOST)
    assert shown[0].startswith("[rank0]: RuntimeError: Connection closed")
    assert shown[1:] == RANK0_LOST and not ranks.own


def test_chained_exceptions_and_unfinished_tracebacks_are_not_lost() -> None:
    chained = [
        *RANK1_OWN,
        "[rank1]: \n",
        "[rank1]: During handling of the above exception, another exception occurred:\n",
        "[rank1]: \n",
        *RANK1_OWN[:3],
    ]
    shown, _ = _show(chained)
    assert shown == chained


def test_the_script_line_is_the_deepest_frame_outside_the_libraries() -> None:
    lines = [line.removeprefix("[rank1]: ") for line in RANK1_OWN]
    assert raised_at(lines, skip=("/site-packages",)) == (
        "ValueError: bad shape",
        "/job/train.py:7",
    )
    assert raised_at(lines) == ("ValueError: bad shape", "/site-packages/lib.py:3")
    assert raised_at(["ValueError: x\n"]) is None


def test_exit_codes_are_the_ranks_own_and_never_a_usage_error() -> None:
    from paratrain.commands.run.failure import RankExit

    assert exit_status(1, RankExit(1, 1, 5)) == 5
    assert exit_status(1, RankExit(1, 1, -9)) == 137
    assert exit_status(2, RankExit(0, 0, 2)) == 1  # a rank's own usage error is the job's failure
    assert exit_status(2, None) == 1 and exit_status(7, None) == 7
    # a rank that raised and was then stopped by torchrun (SIGTERM) failed with its exception
    assert exit_status(1, RankExit(0, 0, -15), raised={0}) == 1
    assert exit_status(1, RankExit(0, 0, -15), raised={1}) == 143


def test_the_message_names_what_the_rank_raised_and_advises_by_cause() -> None:
    own = {1: [line.removeprefix("[rank1]: ") for line in RANK1_OWN]}
    text = failure_message(1, REPORT, None, 0, tracebacks=own)
    assert "rank 1 raised ValueError: bad shape at /job/train.py:7" in text
    assert "a restart would raise it again" in text and "--max-restarts" not in text
    killed = failure_message(1, REPORT.replace("exitcode  : 1", "exitcode  : -9"), None, 0)
    assert "was killed by SIGKILL" in killed and "--max-restarts K" in killed


def test_the_preempted_exit_code_is_the_runtimes() -> None:
    from paratrain.commands.run.failure import PREEMPTED_EXIT
    from paratrain.runtime.preemption import PREEMPTED_EXIT as RUNTIME

    assert PREEMPTED_EXIT == RUNTIME == 75


def test_a_traceback_without_rank_prefixes_is_named_too() -> None:
    """One process, or an error before or inside pt.Run(): no process group, so no "[rankN]: "
    prefixes. The summary still names the exception and the script's line (not a frame of
    generated code, nor torchrun's own ChildFailedError)."""
    unprefixed = [line.removeprefix("[rank1]: ") for line in RANK1_OWN]
    generated = ['  File "<string>", line 50, in __init__\n', "    x\n"]
    agent = [
        "Traceback (most recent call last):\n",
        '  File "/site-packages/torch/distributed/run.py", line 9, in main\n',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
    ]
    lines = [*unprefixed[:4], *generated, *unprefixed[4:], *agent, REPORT]
    shown, ranks = _show(lines)
    assert shown == lines  # shown as they came
    assert ranks.unprefixed is not None and ranks.unprefixed[-1] == "ValueError: bad shape"
    text = failure_message(
        1, "".join(lines), None, 0, tracebacks=ranks.own, unprefixed=ranks.unprefixed
    )
    assert "rank 1 raised ValueError: bad shape at /job/train.py:7" in text
