"""journal: a replay attempt's intents and its row in flight, read back per attempt."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_spark.errors import LedgerError
from rmq_spark.ledger.layout import TEMP_PREFIX
from rmq_spark.park.replay.journal import Journal, journal_dir, read_attempts


def key(position: int) -> tuple[str, str, str, int, str, str, str]:
    return ("dr", "/", "orders", position, "main", "/", "orders")


def test_each_attempt_is_read_back_with_what_it_intended_and_where_it_stopped(
    tmp_path: Path,
) -> None:
    killed = Journal(str(tmp_path), "r1", "park-1")
    killed.intend([key(0), key(1)])
    killed.intend([key(2), key(3)])
    stopped = Journal(str(tmp_path), "r1", "park-1")  # the same run id run again
    stopped.intend([key(2), key(3)])
    stopped.stopped(key(3))

    attempts = read_attempts(str(tmp_path), "park-1", skip_runs=())

    assert sorted((a.run_id, sorted(a.intended), a.stopped) for a in attempts) == sorted(
        [
            ("r1", [key(0), key(1), key(2), key(3)], None),
            ("r1", [key(2), key(3)], key(3)),
        ]
    )
    by_stop = {a.stopped: a.uncertain for a in attempts}
    assert by_stop == {None: {key(0), key(1), key(2), key(3)}, key(3): {key(3)}}


def test_finished_runs_and_a_torn_write_are_left_out(tmp_path: Path) -> None:
    Journal(str(tmp_path), "done", "park-1").intend([key(0)])
    Journal(str(tmp_path), "killed", "park-1").intend([key(1)])
    (journal_dir(str(tmp_path), "killed") / f"{TEMP_PREFIX}intent-x-000001.json").write_text("[[")

    attempts = read_attempts(str(tmp_path), "park-1", skip_runs={"done"})

    assert [(a.run_id, a.intended) for a in attempts] == [("killed", {key(1)})]
    assert read_attempts(str(tmp_path / "elsewhere"), "park-1", skip_runs=()) == []


def test_a_record_that_is_not_a_journal_is_one_error_naming_the_file(tmp_path: Path) -> None:
    Journal(str(tmp_path), "r1", "park-1").intend([key(0)])
    [record] = journal_dir(str(tmp_path), "r1").iterdir()
    record.write_text('{"not": "keys"}')

    with pytest.raises(LedgerError, match=rf"{record.name}: not a replay's journal record"):
        read_attempts(str(tmp_path), "park-1", skip_runs=())


def test_attempts_of_another_parked_runs_replay_are_left_out(tmp_path: Path) -> None:
    """A queue parked twice has positions 0, 1, ... twice: the same replay keys."""
    Journal(str(tmp_path), "replay-of-park-1", "park-1").intend([key(0), key(1)])
    Journal(str(tmp_path), "replay-of-park-2", "park-2").intend([key(0)])

    attempts = read_attempts(str(tmp_path), "park-2", skip_runs=())

    assert [(a.run_id, a.intended) for a in attempts] == [("replay-of-park-2", {key(0)})]
