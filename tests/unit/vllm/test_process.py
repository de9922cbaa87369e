"""A child process group: a pid file lets the next run reap what a killed one left, and a child
started with die_with_parent goes with its parent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvstudy.vllm.process import reap_pid_file, write_pid_file


def test_pid_file_reaps_a_left_process_group(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        write_pid_file(tmp_path / "server.log.pids", child.pid)
        assert reap_pid_file(tmp_path / "server.log.pids")
        child.wait(timeout=60)  # generous: fails only if the sleeper survived (600 s)
        assert not (tmp_path / "server.log.pids").exists()
    finally:
        if child.poll() is None:
            child.kill()


def test_stale_or_broken_pid_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "x.pids").write_text(json.dumps({"pgid": os.getpid(), "create_time": 1.0}))
    assert not reap_pid_file(tmp_path / "x.pids")  # our own pid, another start time: not ours to kill
    (tmp_path / "y.pids").write_text("[1]")
    assert not reap_pid_file(tmp_path / "y.pids")


def test_child_dies_with_its_parent(tmp_path: Path) -> None:
    """A middle process starts a sleeper with die_with_parent and is SIGKILLed: the sleeper goes."""
    script = (
        "import subprocess, sys, time\nfrom kvstudy.vllm.process import die_with_parent\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], preexec_fn=die_with_parent)\n"
        "print(p.pid, flush=True)\ntime.sleep(600)\n"
    )
    middle = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    import psutil

    grandchild = psutil.Process(int(middle.stdout.readline()))
    middle.kill()
    middle.wait(timeout=60)
    gone, _ = psutil.wait_procs([grandchild], timeout=60)  # generous: catches only a survivor
    assert gone
