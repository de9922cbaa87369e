"""One exception type for bad input: its message is the single line a user sees."""

from __future__ import annotations


class StudyError(Exception):
    """Bad input or a failed step, with a one-line message naming the file or field at fault.

    The CLI prints ``kvstudy: error: <message>`` and exits non-zero without a traceback.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class MissingPrerequisite(StudyError):
    """Something a live step needs is not installed or built here, and one command provides it.

    The message names what is missing and ends with the command (``make engine``, ``make
    engine tiny-model``); the renderer reads the command back to tell the reader what to run.
    """

    def __init__(self, missing: str, command: str) -> None:
        self.missing, self.command = " ".join(missing.split()), command
        super().__init__(f"{self.missing}; run `{command}`")
