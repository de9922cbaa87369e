"""Start, wait for and stop one vLLM OpenAI-compatible server for one study configuration.

``VllmServer`` runs the command line of ``kvstudy.vllm.command`` as a subprocess in its own process
group (``kvstudy.vllm.process``), bound to 127.0.0.1 on a free port, its output piped to a thread
that writes it to a log file line by line, each line scrubbed of secrets first
(``kvstudy.redact.start_scrubbed_copy``: vLLM echoes its arguments, and no secret reaches the disk,
even if this process is SIGKILLed). It waits for ``GET /v1/models`` to answer, and stops the whole
process group (SIGTERM, then SIGKILL) when the ``with`` block ends, on errors, on Ctrl-C and at
interpreter exit, so no orphan keeps the port, the GPU or the memory.

A start that fails raises ``EngineStartError`` with the cause read from the log
(``kvstudy.vllm.startup_log``), advice where the cause is known, and the log's tail.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import check_write_target, log_tail
from kvstudy.machine import vllm_distribution
from kvstudy.redact import scrub_file, start_scrubbed_copy
from kvstudy.vllm.command import (
    HOST,
    ServerConfig,
    build_command,
    check_server_args,
    log_secrets,
    recorded_environment,
    server_environment,
)
from kvstudy.vllm.facts import API_KEY_ENV
from kvstudy.vllm.process import (
    PID_FILE_SUFFIX,
    STOP_GRACE_S,
    reap_pid_file,
    spawn,
    stop_process_group,
    write_pid_file,
)
from kvstudy.vllm.startup_log import RE_ENGINE_FAILED, StartupInfo, parse_startup_log

FAILED_EXIT_GRACE_S = 90.0  # after vLLM logs a fatal start error, how long it may take to exit
POLL_INTERVAL_S = 0.25
LOG_TAIL_LINES = 25
MAX_MODELS_BYTES = 1024 * 1024  # /v1/models of one served model is a few hundred bytes
LOG_COPY_JOIN_S = 10.0  # after the process group is stopped, how long the log copy may take to finish


class EngineStartError(StudyError):
    """A server did not become ready; the message holds the diagnosis and the log's tail."""

    def __init__(
        self, message: str, log_path: Path | None = None, info: StartupInfo | None = None, log_tail: str = ""
    ) -> None:
        super().__init__(message)
        self.log_path = log_path
        self.info = info
        self.log_tail = log_tail

    def __str__(self) -> str:  # StudyError folds the message onto one line; the tail stays readable
        tail = f"\n--- last lines of {self.log_path} ---\n{self.log_tail}" if self.log_tail else ""
        return f"{self.args[0]}{tail}"


def free_port(port: int = 0, host: str = HOST) -> int | None:
    """``port`` when it is free right now (0: one the OS picks), None when it is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return None
        return int(sock.getsockname()[1])


@functools.cache
def _say_api_key_kept_out() -> None:
    """One line on stderr, once per process, when the user's shell exports ``VLLM_API_KEY``."""
    print(
        f"kvstudy: {API_KEY_ENV} is set in this shell; the study's vLLM servers start without it "
        f"(they listen on {HOST} only for one run, and the study's clients send no key)",
        file=sys.stderr,
        flush=True,
    )


# ---- every live server, so atexit and signals can stop them ---------------------------------
_LIVE: set["VllmServer"] = set()
_LIVE_LOCK = threading.Lock()


def stop_all() -> None:
    """Stop every server this process started and has not stopped yet."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        server.stop()


def _on_signal(signum: int, frame: Any) -> None:
    stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@functools.cache
def _install_handlers() -> None:
    """atexit always; SIGTERM/SIGHUP only where nobody else handles them (never SIGINT: Ctrl-C
    arrives as KeyboardInterrupt and the ``with`` block or atexit stops the servers)."""
    atexit.register(stop_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_signal)


class VllmServer:
    """One vLLM server process: ``with VllmServer(cfg, log_path) as srv:`` starts it and waits."""

    def __init__(
        self, config: ServerConfig, log_path: str | Path, ready_timeout_s: float = 900.0, port: int | None = None
    ) -> None:
        self.config = config
        self.log_path = Path(log_path)
        self.ready_timeout_s = float(ready_timeout_s)
        self.requested_port = port
        self.port: int = port or 0
        self.pid: int | None = None
        self.model_name: str = config.served_model_name or config.model
        self.command: list[str] = []
        self.environment: dict[str, str] = {}
        self.started_at: float | None = None
        self.ready_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_copy: threading.Thread | None = None
        self._stopped = False
        self._probe_headers: dict[str, str] = {}
        self._version = (vllm_distribution() or ("", None))[1]

    @property
    def pid_path(self) -> Path:
        """The pid file beside the log: a run killed with SIGKILL leaves it for the next to reap."""
        return self.log_path.with_name(self.log_path.name + PID_FILE_SUFFIX)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"VllmServer(kv_cache_dtype={self.config.kv_cache_dtype!r}, port={self.port}, pid={self.pid})"

    # ---- start ----------------------------------------------------------------------------
    def _input_problem(self) -> str | None:
        """What makes a start impossible before any process runs (None: nothing)."""
        model, port = self.config.model, self.requested_port
        if not Path(model).exists() and (model.count("/") != 1 or model.startswith((".", "/", "~"))):  # nor a Hub id
            return f"{model}: model folder not found (expected a folder with config.json and weights)"
        if Path(model).is_dir() and not (Path(model) / "config.json").is_file():
            return f"{model}: no config.json in the model folder (expected a Hugging Face model folder)"
        if port is not None and free_port(port) is None:
            return f"port {port}: already in use on {HOST} (pass port=None to pick a free one)"
        if vllm_distribution() is None:
            return "vllm: not installed in this environment (run `make engine`)"
        try:
            check_server_args([str(a) for a in self.config.extra_args], "extra_args")
        except StudyError as exc:
            return str(exc)
        return None

    def start(self) -> "VllmServer":
        """Start the server and block until ``/v1/models`` answers; raises EngineStartError."""
        if self._proc is not None:
            raise StudyError(f"server on port {self.port}: already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if problem := self._input_problem():  # written to the log as well
            self.log_path.write_text(f"kvstudy.vllm.server: not started: {problem}\n", encoding="utf-8")
            raise EngineStartError(problem, self.log_path)
        port = self.requested_port or free_port()
        if port is None:  # binding to port 0 failed: no port to give the server
            raise EngineStartError(f"no free port on {HOST} to start the server on", self.log_path)
        self.port = port
        self.command = build_command(self.config, self.port, vllm_version=self._version)
        if API_KEY_ENV in os.environ:
            _say_api_key_kept_out()
        full_env = server_environment(self.config, vllm_version=self._version)
        if full_env.get(API_KEY_ENV):  # a key the spec's env sets on purpose: the probe sends it
            self._probe_headers = {"Authorization": f"Bearer {full_env[API_KEY_ENV]}"}
        self.environment = recorded_environment(full_env, self.config)
        reap_pid_file(self.pid_path)
        _install_handlers()
        try:
            self.pid = self._spawn(full_env).pid
            write_pid_file(self.pid_path, self.pid)
            self.started_at = time.monotonic()
            with _LIVE_LOCK:
                _LIVE.add(self)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, full_env: dict[str, str]) -> subprocess.Popen[bytes]:
        """The server process, its output copied to the log by a scrubbing thread. (A child that
        ignores SIGPIPE outlives a SIGKILLed parent: die_with_parent and the pid file stop it.)"""
        # never through a planted symlink; the copy thread closes it
        log = open(check_write_target(self.log_path), "wb")
        try:
            self._proc = proc = spawn(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env
            )
            assert proc.stdout is not None
            secrets = log_secrets(self.config, full_env)
            self._log_copy = start_scrubbed_copy(proc.stdout, log, secrets, f"kvstudy-log-{proc.pid}")
        except BaseException:
            if self._log_copy is None:
                log.close()
            raise
        return proc

    def _wait_ready(self) -> None:
        assert self._proc is not None and self.started_at is not None
        deadline = self.started_at + self.ready_timeout_s
        failure_seen_at: float | None = None
        next_log_check = 0.0
        while True:
            code = self._proc.poll()
            if code is not None:
                raise self._start_error(f"vLLM server exited with code {code} while starting")
            if self._models_answer():
                self.ready_s = time.monotonic() - self.started_at
                return
            now = time.monotonic()
            if now > deadline:
                raise self._start_error(f"vLLM server not ready after {self.ready_timeout_s:g} s (readiness timeout)")
            if failure_seen_at is None and now >= next_log_check:
                next_log_check = now + 2.0
                # vLLM's own fatal start message (not any traceback)
                failure_seen_at = now if RE_ENGINE_FAILED.search(log_tail(self.log_path, 10**6)) else None
            elif failure_seen_at is not None and now - failure_seen_at > FAILED_EXIT_GRACE_S:
                raise self._start_error(f"vLLM logged a failed start and did not exit within {FAILED_EXIT_GRACE_S:g} s")
            time.sleep(POLL_INTERVAL_S)

    def _models_answer(self) -> bool:
        request = urllib.request.Request(f"{self.base_url}/v1/models", headers=self._probe_headers)
        try:
            with urllib.request.urlopen(request, timeout=2.0) as resp:
                if resp.status != 200:
                    return False
                body = json.loads(resp.read(MAX_MODELS_BYTES).decode("utf-8"))
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):  # up, but asks for a key the probe lacks: waiting cannot help
                raise self._start_error(
                    f"vLLM server answered /v1/models with {exc.code}: it requires an API key ({API_KEY_ENV} "
                    "in the spec's env, or --api-key in its server arguments), which the study's clients "
                    "do not send; remove it"
                ) from None
            return False
        except (urllib.error.URLError, OSError, ValueError):
            return False
        if not isinstance(body, dict) or not isinstance(body.get("data", []), list):
            return False
        models = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)]
        if models:
            self.model_name = str(models[0])
        return True

    def _start_error(self, headline: str) -> EngineStartError:
        self.stop()  # stop first, so the log holds everything the server wrote
        info = parse_startup_log(self.log_path) if self.log_path.is_file() else None
        cause = f"; cause: {info.failure_cause}" if info and info.failure_cause else ""
        advice = f"; try: {' / '.join(info.advice)}" if info and info.advice else ""
        message = f"{headline} (kv_cache_dtype={self.config.kv_cache_dtype}, log {self.log_path}){cause}{advice}"
        return EngineStartError(message, self.log_path, info, log_tail(self.log_path, LOG_TAIL_LINES))

    # ---- stop -----------------------------------------------------------------------------
    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the whole process group, wait, then SIGKILL what is left; safe to call twice."""
        proc = self._proc
        if proc is None or self._stopped:
            return
        with _LIVE_LOCK:
            _LIVE.discard(self)
        stop_process_group(proc, STOP_GRACE_S)
        self._stopped = True
        if self._log_copy is not None:  # the rest of the output, up to end of file, into the log
            self._log_copy.join(timeout=LOG_COPY_JOIN_S)
        self.pid_path.unlink(missing_ok=True)
        scrub_file(self.log_path, log_secrets(self.config))
