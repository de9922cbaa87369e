"""The one progress channel: a tracker's lines count items, time so far and time left."""

from __future__ import annotations

from kvstudy.progress import Tracker, silent


def test_tracker_counts_and_estimates_from_the_mean_so_far() -> None:
    now = [100.0]
    lines: list[str] = []
    tracker = Tracker(3, lines.append, clock=lambda: now[0])
    now[0] = 130.0
    tracker.finished("a", "ok")
    tracker.note("starting the next server")
    now[0] = 220.0
    tracker.finished("b", "failed: no server")
    tracker.finished("c", "ok")
    assert lines == [
        "cell 1/3 a: ok (30s so far, about 1m00s left)",
        "starting the next server (30s so far)",
        "cell 2/3 b: failed: no server (2m00s so far, about 1m00s left)",
        "cell 3/3 c: ok (2m00s so far)",
    ]
    assert silent("anything") is None
