"""One progress channel for every runner: a callable that takes one line of text.

In a notebook kernel the runners are handed :func:`kvstudy.report.notebook.progress`, whose lines
``make all`` forwards to the terminal; on the command line they get ``print``; tests pass
:func:`silent`. :class:`Tracker` counts a run's finished items and says, with each, how many are
done, the time so far and, from the mean so far, about how long the rest will take.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Progress = Callable[[str], None]


def silent(line: str) -> None:
    """A progress channel that says nothing."""


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Tracker:
    """Progress of ``total`` items (cells, configurations) of one run, told to ``say`` line by line."""

    def __init__(self, total: int, say: Progress, unit: str = "cell", clock: Callable[[], float] = time.monotonic):
        self.total, self.say, self.unit, self.clock = total, say, unit, clock
        self.done = 0
        self.started = clock()

    def note(self, text: str) -> None:
        """A line about the run itself (a server starting, a start that failed)."""
        self.say(f"{text} ({_duration(self.clock() - self.started)} so far)")

    def finished(self, item: str, state: str) -> None:
        """One more item done; the line says which, its state, and the time so far and left."""
        self.done += 1
        spent = self.clock() - self.started
        left = spent / self.done * (self.total - self.done)
        rest = f", about {_duration(left)} left" if self.done < self.total else ""
        self.say(f"{self.unit} {self.done}/{self.total} {item}: {state} ({_duration(spent)} so far{rest})")
