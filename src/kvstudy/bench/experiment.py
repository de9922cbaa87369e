"""What the experiments share on the grid engine (:mod:`kvstudy.bench.grid`): the grid specs'
bases, a capture's spec, the plan and run, and the notebook helpers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar

from pydantic import model_validator

from kvstudy import capture as capture_format
from kvstudy.bench.grid import GridCapture, GridPlan, cells_to_run, read_capture, run_grid
from kvstudy.bench.spec import Arm, Cell, CellResult, Run, ServerSpec, Spec, ordered_runs
from kvstudy.errors import StudyError
from kvstudy.limits import MAX_GRID_CELLS
from kvstudy.model.config_fields import require_live
from kvstudy.progress import Progress
from kvstudy.redact import resolve_env, scrub, secret_values
from kvstudy.vllm.command import ServerConfig

if TYPE_CHECKING:
    import pandas as pd

MANIFEST = capture_format.MANIFEST
R = TypeVar("R", bound=CellResult)
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


def run_cells(
    spec: G,
    capture: Path,
    manifest: dict[str, Any],
    run_cell: Callable[[G, Path, Cell, Any, str | None], R],
    failed_cell: Callable[[G, Cell, str, str], R],
    retry_failed: bool,
    progress: Progress,
    on_cell_start: Callable[[Cell, Any], None] | None = None,
    max_servers: int | None = None,
    before_first_start: Callable[[], None] = lambda: None,
) -> list[R]:
    """Run the cells ``capture`` lacks on the grid engine, at most ``max_servers`` server starts,
    ``before_first_start()`` after the model check; the results of the cells run now."""
    tokenizer = spec.model if Path(spec.model).is_dir() else None

    def before() -> None:
        require_live(spec.model)
        before_first_start()

    plan = GridPlan(
        runs=spec.runs(),
        cells=spec.cells(),
        server_config=spec.server_config,
        ready_timeout_s=spec.ready_timeout_s,
        run_cell=lambda cell, server: run_cell(spec, capture, cell, server, tokenizer),
        failed_cell=lambda cell, reason, tail, _start_failed: failed_cell(spec, cell, reason, tail),
        record=asdict,
        run_fields=lambda run, _cells: {spec.ARMS.removesuffix("s"): run.arm},
        scrub=spec.scrub(),
    )
    return run_grid(
        plan,
        capture,
        manifest,
        retry_failed=retry_failed,
        progress=progress,
        on_cell_start=on_cell_start,
        max_servers=max_servers,
        before_first_start=before,
    )


# --------------------------------------------------------------------------- notebook helpers


def open_or_complete(
    cls: type[S],
    run: Callable[..., list[R]],
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
