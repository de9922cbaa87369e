"""The one grid engine of every sweep: server starts (arm x seed, in the experiment's order), each
running its bench cells; an experiment supplies its spec (a :class:`GridSpec`) and how one cell runs,
the engine owns the rest. Also what the experiments share on it: the grid specs' bases, a capture's
spec and the notebook helpers.

A cell is done when ``cells/<cell>.json`` exists (``capture.needs_run``; failed ones rerun only with
``retry_failed``, earlier logs kept). A start that fails marks its cells failed with the reason and
the log tail, and the other starts go on. Per-request rows live in ``requests/<cell>.jsonl``.
:func:`read_capture` is the one reader of what the engine wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar

from pydantic import model_validator

from kvstudy import capture as capture_format
from kvstudy import io as atomic
from kvstudy.bench import client
from kvstudy.bench.result import RequestRecord, read_requests_jsonl, requests_from_result
from kvstudy.bench.spec import Arm, Cell, CellResult, Run, ServerSpec, Spec, ordered_runs
from kvstudy.bench.telemetry import ClockSample, Sampler, read_telemetry_jsonl
from kvstudy.errors import StudyError
from kvstudy.io import log_tail, read_json_object
from kvstudy.limits import MAX_GRID_CELLS
from kvstudy.model.config_fields import require_live
from kvstudy.progress import Progress, Tracker
from kvstudy.redact import resolve_env, scrub, secret_values
from kvstudy.vllm.command import ServerConfig

if TYPE_CHECKING:
    import pandas as pd

# --------------------------------------------------------------------------- files

CELLS, REQUESTS = capture_format.CELLS, capture_format.REQUESTS
RUNS, LOGS = "runs", "logs"


def write_record(path: Path, data: Any) -> None:
    """A capture's JSON record, atomically: NaN metrics kept (a cell without a second token has no
    TPOT), odd values shown as text."""
    atomic.write_json_atomic(path, data, indent=1, allow_nan=True, default=str)


def cell_record(capture: str | Path, cell_id: str) -> dict[str, Any] | None:
    """What ``cells/<cell>.json`` holds; None when it is absent or torn (the cell runs again)."""
    path = Path(capture) / CELLS / f"{cell_id}.json"
    if not path.is_file():
        return None
    try:
        return read_json_object(path)
    except StudyError as exc:
        if "malformed JSON" not in str(exc):
            raise
        return None  # a torn or hand-broken result: the cell runs again


def cell_status(capture: str | Path, cell_id: str) -> str:
    """'ok', 'failed' or 'missing'."""
    data = cell_record(capture, cell_id)
    return "missing" if data is None else str(data.get("status", "missing"))


def cells_to_run(capture: str | Path, cells: Iterable[Cell], retry_failed: bool = False) -> list[Cell]:
    """The cells without a result, and the failed ones only with ``retry_failed``: the one done rule."""
    return [c for c in cells if capture_format.needs_run(cell_status(capture, c.id), retry_failed)]


def item_states(capture: str | Path, cell_ids: Iterable[str]) -> dict[str, str]:
    """Each cell's status, in the order given."""
    return {c: cell_status(capture, c) for c in cell_ids}


def requests_path(capture: str | Path, cell_id: str) -> Path:
    return Path(capture) / REQUESTS / f"{cell_id}.jsonl"


def write_requests(capture: str | Path, cell_id: str, records: Sequence[RequestRecord]) -> None:
    """A cell's per-request records, one JSON line each, in ``requests/<cell>.jsonl``."""
    atomic.write_jsonl_atomic(requests_path(capture, cell_id), records)


def read_requests(capture: str | Path, cell_id: str) -> list[RequestRecord] | None:
    """A cell's per-request records; None when it has none (it failed before any request)."""
    path = requests_path(capture, cell_id)
    return read_requests_jsonl(path) if path.is_file() else None


def bench_cell(
    capture: Path,
    cell_id: str,
    settings: client.BenchSettings,
    server: Any,
    tokenizer: str | None,
    timeout_s: float,
    sampler: Sampler[Any] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], list[RequestRecord]]:
    """One cell's run of vLLM's client against ``server``, its output in ``logs/<cell>.bench.log``
    (BenchError when it fails), ``sampler`` running meanwhile (``mark_end()`` as the client exits; its
    samples kept either way in ``telemetry/<cell><suffix>.jsonl``). The result is kept in ``bench/<cell>.json``
    and its per-request records in ``requests/<cell>.jsonl``."""
    log = capture / LOGS / f"{cell_id}.bench.log"
    try:
        with sampler or nullcontext():
            result = client.run_bench(
                settings, server.base_url, server.model_name, tokenizer, log, timeout_s, on_line=on_line
            )
            if sampler is not None:
                sampler.mark_end()
    finally:
        if sampler is not None:
            atomic.write_jsonl_atomic(capture / "telemetry" / f"{cell_id}{sampler.suffix}.jsonl", sampler.samples)
    write_record(capture / "bench" / f"{cell_id}.json", result)
    records = requests_from_result(result, where=f"bench/{cell_id}.json")
    write_requests(capture, cell_id, records)
    return result, records


def update_manifest(capture: Path, manifest: dict[str, Any], cell_ids: Iterable[str]) -> None:
    capture_format.set_items(manifest, item_states(capture, cell_ids))
    capture_format.write_manifest(capture, manifest)


# --------------------------------------------------------------------------- reading a capture


@dataclass(frozen=True)
class Captured:
    """One record file of a capture (``runs/<run>.json``, ``cells/<cell>.json``): its id and contents,
    and a cell's per-request records (``requests/<cell>.jsonl``) and clock samples."""

    id: str
    data: Mapping[str, Any]
    requests: tuple[RequestRecord, ...] = ()
    telemetry: tuple[ClockSample, ...] = ()

    @property
    def status(self) -> str:
        return str(self.data.get("status", "missing"))

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def reason(self) -> str:
        return str(self.data.get("reason") or "")


@dataclass(frozen=True)
class GridCapture:
    """A grid capture read once: its manifest, cells (by id, in file order), server starts, and the
    fields every cell record holds (``keys``: what names a cell in the experiment's grid)."""

    path: Path
    manifest: Mapping[str, Any]
    cells: Mapping[str, Captured]
    runs: Mapping[str, Captured]
    keys: tuple[str, ...] = ()

    def to_frames(self) -> tuple[Any, Any, Any]:
        """(cells, requests, telemetry) as DataFrames: one row per cell (its ``metrics`` spread into
        columns), per request and per clock sample of the ok cells, each with its cell's ``keys``
        and ``t_rel_s``, the time from the cell's first measured request (``bench_window_s``, else
        its earliest time)."""
        import pandas as pd

        records = [dict(c.data) for c in self.cells.values()]
        cells = pd.DataFrame(records)
        if len(cells) and "metrics" in cells:
            metrics = pd.json_normalize([r.get("metrics") or {} for r in records])
            cells = pd.concat([cells.drop(columns=["metrics"]), metrics], axis=1)
        frames: dict[str, list[Any]] = {"start_time_s": [], "t_mono_s": []}
        for cell in (c for c in self.cells.values() if c.ok):
            t0 = (cell.data.get("bench_window_s") or [None])[0]
            for clock, rows in (("start_time_s", cell.requests), ("t_mono_s", cell.telemetry)):
                if rows:
                    frame = pd.DataFrame([asdict(r) for r in rows]).assign(**{k: cell.data[k] for k in self.keys})
                    times = pd.to_numeric(frame[clock], errors="coerce")
                    frames[clock].append(frame.assign(t_rel_s=times - (times.min() if t0 is None else t0)))
        requests, telemetry = (pd.concat(f, ignore_index=True) if f else pd.DataFrame() for f in frames.values())
        return cells, requests, telemetry


def read_capture(path: str | Path, kind: str | None = None, keys: Sequence[str] = ()) -> GridCapture:
    """Every cell and server start of a grid capture, each file read once through ``kvstudy.io``; a torn
    cell record is a cell not run, anything else the engine does not write is one line naming it."""
    path = Path(path)
    manifest = capture_format.read_manifest(path, kind)
    cells: dict[str, Captured] = {}
    for file in sorted((path / CELLS).glob("*.json")):
        data = cell_record(path, file.stem)
        if data is None:
            continue
        absent = [k for k in keys if k not in data]
        if absent:
            raise StudyError(f"{file}: no field {absent[0]!r}; expected a cell record with {', '.join(keys)}")
        if isinstance(data.get("requests"), list):
            raise StudyError(
                f"{file}: per-request rows inline, an older capture format; expected them in "
                f"{requests_path(path, file.stem)}"
            )
        requests = read_requests(path, file.stem)
        if requests is None and data.get("status") == "ok":
            raise StudyError(f"{requests_path(path, file.stem)}: missing (an ok cell keeps its per-request rows there)")
        samples = path / "telemetry" / f"{file.stem}.jsonl"
        telemetry = tuple(read_telemetry_jsonl(samples)) if samples.is_file() else ()
        cells[file.stem] = Captured(file.stem, data, tuple(requests or ()), telemetry)
    runs = {p.stem: Captured(p.stem, read_json_object(p)) for p in sorted((path / RUNS).glob("*.json"))}
    return GridCapture(path, manifest, cells, runs, tuple(keys))


# --------------------------------------------------------------------------- the experiments' grids

MANIFEST = capture_format.MANIFEST
RC = TypeVar("RC", bound=CellResult)
C = TypeVar("C")


class GridSpec(Spec):
    """A grid of arms x seeds x an axis, served from one model."""

    ARMS: ClassVar[str] = "arms"  # the field listing the arms
    AXIS: ClassVar[str]  # the field listing the third axis
    CELL_KEY: ClassVar[str]  # the key of a cell's third axis in its result record

    if TYPE_CHECKING:  # declared by each experiment (pydantic orders the fields as declared there)
        model: str
        seeds: list[int]
        server_env: dict[str, Any]
        ready_timeout_s: float

        def runs(self) -> list[Run]: ...

        def cells(self) -> list[Cell]: ...

        def server_config(self, run: Run) -> ServerConfig: ...

    @model_validator(mode="after")
    def _cells(self) -> Self:
        cells = len(self.arm_list()) * len(self.seeds) * len(getattr(self, self.AXIS))
        if cells > MAX_GRID_CELLS:
            raise ValueError(
                f"{cells:,} cells ({self.ARMS} x seeds x {self.AXIS}), expected at most {MAX_GRID_CELLS:,}"
            )
        return self

    def arm_list(self) -> list[Arm]:
        arms: list[Arm] = getattr(self, self.ARMS)
        return arms

    def arm(self, name: str) -> Arm:
        for a in self.arm_list():
            if a.name == name:
                return a
        raise StudyError(f"{self.ARMS}: {name!r} is not one of {[a.name for a in self.arm_list()]}")

    def scrub(self) -> Callable[[str], str]:
        """Text with secrets removed: by shape, and every secret value this process or the grid's
        environments hold."""
        values = set(secret_values())
        for env in [self.server_env, *(a.env for a in self.arm_list())]:
            with suppress(StudyError):  # a from_env variable that is not set holds no value to scrub
                values |= set(secret_values(resolve_env(dict(env))))
        ordered = sorted(values, key=len, reverse=True)
        return lambda text: scrub(text, ordered)

    def identity(self, cell: Cell) -> dict[str, Any]:
        """The fields naming ``cell`` in its result record, under this experiment's keys."""
        return {
            "cell_id": cell.id,
            self.ARMS.removesuffix("s"): cell.arm,
            "kv_cache_dtype": self.arm(cell.arm).kv_cache_dtype,
            "seed": cell.seed,
            self.CELL_KEY: cell.users,
        }


G = TypeVar("G", bound=GridSpec)


class UsersSpec(ServerSpec, GridSpec):
    """A grid of arms x seeds x a users axis, one fresh server per arm and seed."""

    if TYPE_CHECKING:
        input_len: int
        output_len: int
        max_model_len: int | None

    @model_validator(mode="after")
    def _lengths(self) -> Self:
        if self.max_model_len is not None and self.max_model_len < self.input_len + self.output_len:
            raise ValueError(
                f"max_model_len {self.max_model_len} is shorter than input_len + output_len = "
                f"{self.input_len + self.output_len}"
            )
        return self

    def aa_arms(self) -> list[str]:
        """Arms identical to the baseline but for their name: the A/A controls."""
        base = self.arm_list()[0].model_dump(exclude={"name"})
        return [a.name for a in self.arm_list()[1:] if a.model_dump(exclude={"name"}) == base]

    def runs(self) -> list[Run]:
        return ordered_runs([a.name for a in self.arm_list()], self.seeds, self.run_order)


S = TypeVar("S", bound=UsersSpec)


def load_spec(cls: type[G], kind: str, capture: Path, manifest: Mapping[str, Any] | None = None) -> G:
    """The grid a capture's manifest holds (``manifest``: already read)."""
    manifest = manifest if manifest is not None else capture_format.read_manifest(capture, kind)
    return cls.from_dict(manifest.get("spec") or {}, where=f"{capture}/{MANIFEST}: spec")


@dataclass
class UsersCapture(Generic[S]):
    """A users-axis capture read once (:func:`kvstudy.bench.grid.read_capture`) and its frames."""

    path: Path
    manifest: dict[str, Any]
    spec: S
    cells: pd.DataFrame  # one row per cell result (ok and failed), its metrics spread into columns
    requests: pd.DataFrame  # one row per measured request of ok cells
    telemetry: pd.DataFrame  # one row per clock sample
    grid: GridCapture  # the typed cells (per-request records) and server starts


def read_users_capture(
    read_spec: Callable[[Path, Mapping[str, Any]], S], kind: str, keys: Sequence[str], path: str | Path
) -> UsersCapture[S]:
    """A capture folder of ``kind`` (StudyError if it is not one); its cells named by ``keys``."""
    grid = read_capture(path, kind, keys)
    return UsersCapture(grid.path, dict(grid.manifest), read_spec(grid.path, grid.manifest), *grid.to_frames(), grid)


def prepare_capture(
    spec: GridSpec, capture: Path, kind: str, how: str, first: Callable[[], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Create the folder and manifest (with ``first()``'s keys), or check an existing one holds the same grid and model."""
    manifest, created = capture_format.create_or_resume(
        capture,
        kind,
        spec.to_dict(),
        how,
        capture_format.model_inputs(spec.model),
        lambda stored, where: type(spec).from_dict(stored, where=where).to_dict(),
    )
    if created and first is not None:  # a new manifest is rewritten only when it gains keys
        manifest.update(first())
        capture_format.write_manifest(capture, manifest)
    return manifest


def run_grid(
    spec: G,
    capture: str | Path,
    manifest: dict[str, Any],
    run_cell: Callable[[G, Path, Cell, Any, str | None], RC],
    failed_cell: Callable[[G, Cell, str, str], RC],
    retry_failed: bool = False,
    progress: Progress = print,
    on_cell_start: Callable[[Cell, Any], None] | None = None,
    max_servers: int | None = None,
    before_first_start: Callable[[], None] = lambda: None,
) -> list[RC]:
    """Run the cells of ``spec`` that ``capture`` lacks (and its failed ones with ``retry_failed``),
    at most ``max_servers`` server starts (``spec.runs()``, each running its cells in ``spec.cells()``
    order); return the results of the cells run now.

    ``run_cell(spec, capture, cell, server, tokenizer)`` runs one cell against a ready server, writes
    its own files (bench output, ``write_requests``) and returns its result without raising for a
    bench failure (a StudyError it raises fails the cell); ``failed_cell(spec, cell, reason,
    log_tail)`` is the result of a cell that could not run. When there is anything to run, the model
    is checked and ``before_first_start()`` runs (a bandwidth probe), before the session is recorded.
    """
    from kvstudy.run_record import server_record
    from kvstudy.vllm.server import EngineStartError, VllmServer

    capture = Path(capture)
    tokenizer = spec.model if Path(spec.model).is_dir() else None
    every = [c.id for c in spec.cells()]
    todo = {c.id for c in cells_to_run(capture, spec.cells(), retry_failed)}
    if todo:
        require_live(spec.model)
        before_first_start()
    session = capture_format.start_session(manifest, [c for c in every if c in todo])
    update_manifest(capture, manifest, every)
    results: list[RC] = []
    tracker = Tracker(len(todo), progress)
    scrub = spec.scrub()
    starts = 0

    def keep(cell: Cell, result: RC, said: str = "") -> None:
        write_record(capture / CELLS / f"{cell.id}.json", asdict(result))
        results.append(result)
        update_manifest(capture, manifest, every)
        tracker.finished(
            cell.id, said or ("ok" if result.status == "ok" else f"{result.status}: {result.reason[:160]}")
        )

    try:
        for run in spec.runs():
            cells = [c for c in spec.cells() if c.run == run and c.id in todo]
            if not cells:
                continue
            if max_servers is not None and starts >= max_servers:
                break
            starts += 1
            log_path = capture / LOGS / f"{run.id}.server.log"
            tracker.note(f"starting the server of {run.id} for {len(cells)} cell(s)")
            capture_format.keep_old_attempt(log_path)
            fields = {"run_id": run.id, "seed": run.seed, spec.ARMS.removesuffix("s"): run.arm}
            try:
                with VllmServer(spec.server_config(run), log_path, ready_timeout_s=spec.ready_timeout_s) as server:
                    ok = {"status": "ok", **fields}
                    try:
                        ok["record"] = server_record(server)
                    except Exception as exc:  # a record that cannot be built must not lose the measurements
                        ok.update(record={}, record_error=f"{type(exc).__name__}: {exc}")
                    write_record(capture / RUNS / f"{run.id}.json", ok)
                    for cell in cells:
                        if on_cell_start is not None:
                            on_cell_start(cell, server)
                        capture_format.keep_old_attempt(capture / LOGS / f"{cell.id}.bench.log")
                        if not server.is_alive():
                            why = "the server had stopped before this cell started"
                            keep(cell, failed_cell(spec, cell, why, log_tail(log_path)))
                            continue
                        try:
                            keep(cell, run_cell(spec, capture, cell, server, tokenizer))
                        except StudyError as exc:  # e.g. an unreadable client result
                            keep(cell, failed_cell(spec, cell, str(exc), log_tail(log_path)))
            except EngineStartError as exc:
                reason = " ".join(str(exc.args[0]).split())
                tail = scrub(getattr(exc, "log_tail", "") or "")
                tracker.note(f"{run.id}: the server did not start: {reason[:200]}")
                failed_run = {"status": "failed", **fields, "reason": scrub(reason), "log_tail": tail}
                write_record(capture / RUNS / f"{run.id}.json", failed_run)
                for cell in cells:  # no cell ran
                    result = failed_cell(spec, cell, f"server did not start: {reason}", tail)
                    keep(cell, result, f"failed: the server of {run.id} did not start")
    finally:
        capture_format.finish_session(session)
        update_manifest(capture, manifest, every)
    return results


# --------------------------------------------------------------------------- notebook helpers


def open_or_complete(
    cls: type[S],
    run: Callable[..., Sequence[CellResult]],
    read: Callable[[Path], C],
    absent: str,
    spec_data: dict[str, Any],
    capture: str | Path,
    run_missing: bool,
    how: str,
    progress: Progress,
) -> tuple[C | None, str]:
    """The capture to analyse (None: none), after running its missing cells when ``run_missing``; and
    a sentence saying what was done (``absent``: what is shown without a capture)."""
    path = Path(capture)
    if run_missing:
        spec = cls.from_params(**spec_data)  # None: the spec's default
        if cells_to_run(path, spec.cells()):
            results = run(spec, path, how=how, progress=progress)
            said = f"ran {len(results)} missing cell(s) into {path} ({sum(r.status != 'ok' for r in results)} failed)"
        else:
            said = f"the capture {path} was complete: analysis only, nothing run"
    elif not (path / MANIFEST).is_file():
        return None, f"no capture at {path} and run_missing is False: {absent}"
    else:
        said = f"analysing the capture {path} as it is (run_missing is False)"
    return read(path), said


def capture_settings(
    read_spec: Callable[[Path], UsersSpec], params: dict[str, Any], capture: str | Path
) -> tuple[dict[str, Any], set[str]]:
    """The parameters as the report ran them: a spec field left None is the capture's value (arms by
    name), and ``registered_runs_per_arm``, where given and left None, its seed count; with the names
    so filled."""
    path = Path(capture)
    if not (path / MANIFEST).is_file():
        return dict(params), set()
    spec = read_spec(path)
    stored = {**spec.to_dict(), "registered_runs_per_arm": len(spec.seeds)}
    read = {k for k in stored if k in params and params[k] is None}
    named = {k: [a["name"] for a in stored[k]] if k in ("arms", "configurations") else stored[k] for k in read}
    return {**params, **named}, read


def arm_colors(names: list[str]) -> dict[str, Any]:
    """Each arm's colour in the figures: matplotlib's colour cycle in arm order."""
    import matplotlib.pyplot as plt

    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {n: cycle[i % len(cycle)] for i, n in enumerate(names)}


def mark_no_run(ax: Any, x: float, color: Any, ms: float = 10) -> None:
    """An ``×`` at the foot of ``ax`` where an arm has no finished cell (the figure's note says why)."""
    ax.plot([x], [0], marker="x", ms=ms, mew=2, color=color, transform=ax.get_xaxis_transform(), clip_on=False)
