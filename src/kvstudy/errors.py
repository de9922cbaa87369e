"""One exception type for bad input: its message is the single line a user sees."""

from __future__ import annotations


class StudyError(Exception):
    """Bad input or a failed step, with a one-line message naming the file or field at fault.

    The CLI prints ``kvstudy: error: <message>`` and exits non-zero without a traceback.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
