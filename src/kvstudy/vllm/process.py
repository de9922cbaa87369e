"""A child process group that never outlives its run: it dies with its parent, it is stopped as a
whole, and a pid file lets the next run reap what a killed one left behind.

``spawn`` starts such a group; ``die_with_parent`` is its ``preexec_fn`` (Linux asks the kernel to
SIGTERM the child when its parent dies, SIGKILL included); ``stop_process_group`` stops a session
leader, its group and its descendants (SIGTERM, then SIGKILL); ``write_pid_file`` / ``reap_pid_file``
record a started group and stop it later, leaving a reused pid alone.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from typing import Any

import psutil

from kvstudy.errors import StudyError
from kvstudy.io import read_json, write_text_atomic

STOP_GRACE_S = 20.0  # after SIGTERM, how long a process group may take before SIGKILL
PID_FILE_SUFFIX = ".pids"
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM this child when the thread that started it dies (also on
    SIGKILL of the parent); elsewhere nothing (the pid file lets the next run reap it)."""
    if not sys.platform.startswith("linux"):
        return
    with suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)


def spawn(cmd: list[str], **popen: Any) -> subprocess.Popen[Any]:
    """``cmd`` as the leader of its own process group, which dies with this process (the one way the
    study starts a child it must be able to stop: a server, the bench client, a vLLM builder)."""
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=die_with_parent, **popen)


def write_pid_file(path: Path, pid: int) -> None:
    """Record a started process group (pid = pgid) and its start time, for ``reap_pid_file``."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        return
    write_text_atomic(path, json.dumps({"pgid": pid, "create_time": created}) + "\n")


def reap_pid_file(path: Path) -> bool:
    """Stop a process group a killed earlier run left behind (from its pid file), then remove the
    file; True if something was stopped. A pid reused by another process is left alone."""
    if not path.is_file():
        return False
    try:
        data = read_json(path, limit=4096)
        leader = psutil.Process(int(data["pgid"]))
        alive = leader.create_time() == float(data["create_time"])
    except (StudyError, KeyError, TypeError, ValueError, psutil.Error):
        alive = False
    if alive:
        stop_process_group(leader)
    path.unlink(missing_ok=True)
    return alive


def stop_process_group(proc: subprocess.Popen[Any] | psutil.Process, grace_s: float = STOP_GRACE_S) -> None:
    """Stop ``proc`` (a session leader: our child, or one a pid file names) and every process of its
    group and its descendants."""
    pgid = proc.pid
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired, psutil.Error):
        proc.wait(timeout=grace_s)
    _, alive = psutil.wait_procs(descendants, timeout=max(1.0, grace_s / 4))
    group = []
    for member in psutil.process_iter(["pid"]):
        with suppress(ProcessLookupError, PermissionError, psutil.Error):
            if os.getpgid(member.pid) == pgid:
                group.append(member)
    leftovers = {p.pid: p for p in alive + group}
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    for p in [*leftovers.values(), proc]:
        with suppress(psutil.Error):  # a Popen that has ended ignores kill()
            p.kill()
    proc.wait()
    psutil.wait_procs(list(leftovers.values()), timeout=5)
