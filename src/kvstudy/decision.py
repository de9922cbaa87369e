"""The decision card: should this profile's model store its KV cache in FP8, and how sure is the study?

Each notebook states one structured verdict per topic (``kvstudy.notebook.verdict``: a state, a
sentence, the facts behind it, the step that would settle it); ``kvstudy render`` keeps them in
``reports/<profile>/status.json``. This module reads them back into a :class:`Card`, evaluates the
published usage guidance of vLLM's FP8 KV-cache update (seed 003's table) on this model (its layer
kinds, head size and the context the profile asks for), and writes one line of decision.

``kvstudy verdict PROFILE [--json]`` prints the card the index page shows.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvstudy.errors import StudyError
from kvstudy.io import REPO_ROOT, is_finite_number, read_json, type_name

# Topics in the order the card shows them, with the notebook that states each.
TOPICS = {
    "capacity": "01_capacity-math",
    "speed": "02_speed-sweep",
    "accuracy": "03_gsm8k-accuracy",
    "long-context accuracy": "06_retrieval-accuracy",
    "KV precision (simulated)": "07_kv-precision",
    "context scaling": "05_context-scaling",
    "scales": "04_scale-inspection",
}
# Seed 003 ("vLLM FP8 KV-Cache and Attention Quantization Update"), its usage table and the figures behind it.
PUBLISHED_BREAK_EVEN_TOKENS = {"H100": 7000, "B200": 4000}  # decode break-even, Llama-3.1-8B
ACCURACY_SHARE_TO_CALIBRATE = 0.95  # "persistent accuracy loss (< 95 %): calibrate"


@dataclass(frozen=True)
class CardLine:
    """One topic of the card: its state, the sentence, and what would settle it."""

    topic: str
    state: str  # one of kvstudy.notebook.VERDICT_STATES, or "reported": a finding without a structured verdict
    text: str
    report: str  # the notebook stem whose report holds the detail
    next_step: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    link: str | None = None  # the report page (its failed render for a notebook that stopped; none if unrendered)


@dataclass(frozen=True)
class Guidance:
    """One row of the published usage table, evaluated on this model."""

    scenario: str
    published: str  # the table's recommendation, restated
    applies: bool | None  # None: the study cannot tell
    why: str


@dataclass(frozen=True)
class Card:
    profile: str
    model: str | None
    decision: str
    lines: tuple[CardLine, ...]
    guidance: tuple[Guidance, ...]


def _verdict_records(status: dict[str, Any], stem: str) -> list[dict[str, Any]]:
    entry = status.get(stem) or {}
    return [v for v in entry.get("verdicts") or [] if isinstance(v, dict)]


def card_lines(status: dict[str, Any], stems: list[str]) -> list[CardLine]:
    """The verdicts of the profile's notebooks, topic by topic (:data:`TOPICS` first, then the rest in
    the profile's order); a notebook that did not render gives one line saying why and what to run."""
    topic_of = {stem: topic for topic, stem in TOPICS.items()}
    order = [s for s in TOPICS.values() if s in stems] + [s for s in stems if s not in TOPICS.values()]
    lines = []
    for stem in order:
        entry = status.get(stem) or {}
        if entry.get("error") or not entry:
            why = entry.get("error") or "not rendered yet for this profile"
            step = (
                f"run `{entry['needs']}`, then `make all`"
                if entry.get("needs")
                else ("see where the render stopped" if entry else "make all")
            )
            link = entry.get("failed_html") if entry else None
            lines.append(CardLine(topic_of.get(stem, stem), "not measured", f"no verdict: {why}", stem, step, {}, link))
            continue
        found = _verdict_records(status, stem)
        for v in found:
            state = str(v.get("state") or "measured")
            facts: dict[str, Any] = dict(v["facts"]) if isinstance(v.get("facts"), dict) else {}
            lines.append(
                CardLine(
                    str(v.get("topic") or stem),
                    state,
                    str(v.get("text", "")),
                    stem,
                    v.get("next_step"),
                    facts,
                    f"{stem}.html",
                )
            )
        if not found:
            text = str(entry.get("finding") or "the notebook stated no finding")
            lines.append(CardLine(topic_of.get(stem, stem), "reported", text, stem, None, {}, f"{stem}.html"))
    return lines


def evaluate_guidance(model: str | None, context_len: int | None, accuracy_share: float | None) -> list[Guidance]:
    """Seed 003's usage table on this model: which rows apply, and why (or why the study cannot tell)."""
    from kvstudy.model.capacity import load_layout

    if not model:
        return [Guidance("model layout", "(needs the model's config)", None, "no model named by the profile")]
    try:
        layout = load_layout(model)
    except StudyError as exc:
        return [Guidance("model layout", "(needs the model's config)", None, str(exc))]
    out = []
    windows = layout.sliding_windows
    out.append(
        Guidance(
            "hybrid attention (sliding-window layers)",
            "fp8 with --kv-cache-dtype-skip-layers sliding_window",
            bool(windows),
            f"{layout.count('sliding')} sliding-window layers (window {', '.join(map(str, windows))} tokens)"
            if windows
            else "no sliding-window layers in the config",
        )
    )
    heads = sorted({layer.head_size for layer in layout.layers if layer.head_size})
    out.append(
        Guidance(
            "head_dim 256 with prefill priority",
            "stay 16-bit (FP8 prefill about 1.6x slower at long contexts on H100), or validate",
            256 in heads,
            f"head size {', '.join(map(str, heads)) or 'none'}",
        )
    )
    h100 = PUBLISHED_BREAK_EVEN_TOKENS["H100"]
    out.append(
        Guidance(
            f"short contexts (below the published ~{h100:,}-token break-even)",
            "stay 16-bit: FP8's small fixed cost per step outweighs halved KV reads",
            None if context_len is None else context_len < h100,
            "no context length given"
            if context_len is None
            else f"the profile's context is {context_len:,} tokens (break-even published for Llama-3.1-8B on H100; "
            f"~{PUBLISHED_BREAK_EVEN_TOKENS['B200']:,} on B200)",
        )
    )
    out.append(
        Guidance(
            "decode-heavy, memory-bound serving",
            "fp8 (--kv-cache-dtype fp8): about twice the KV tokens per GiB",
            None,
            "the workload's shape (its decode share, whether the KV pool limits the batch) is not in the data: "
            "the capacity line gives the users each storage type fits",
        )
    )
    out.append(
        Guidance(
            f"accuracy below {ACCURACY_SHARE_TO_CALIBRATE:.0%} of 16-bit",
            "calibrate the KV scales (llm-compressor) or use per-head scales",
            None if accuracy_share is None else accuracy_share < ACCURACY_SHARE_TO_CALIBRATE,
            "FP8 accuracy not measured here"
            if accuracy_share is None
            else f"FP8 scored {accuracy_share:.1%} of the 16-bit score (measured)",
        )
    )
    return out


def decide(lines: list[CardLine], guidance: list[Guidance]) -> str:
    """One line: what FP8 buys, whether its costs were measured, and what would settle the rest."""
    by_topic = {line.topic: line for line in lines}
    parts = []
    cap = by_topic.get("capacity")
    if cap is not None and cap.state == "computed":
        parts.append(f"FP8 buys memory: {cap.facts.get('headline', cap.text)}")
    unmeasured = [t for t in ("speed", "accuracy", "long-context accuracy") if t in by_topic]
    measured = [t for t in unmeasured if by_topic[t].state == "measured"]
    open_ = [t for t in unmeasured if by_topic[t].state != "measured"]
    if measured:
        parts.append(
            "measured: " + "; ".join(f"{t}: {by_topic[t].facts.get('headline', by_topic[t].state)}" for t in measured)
        )
    if open_:
        parts.append(
            "not settled here: "
            + ", ".join(f"{t} ({by_topic[t].state})" for t in open_)
            + "; measure FP8 on the target GPU (a GPU profile, e.g. `make all PROFILE=l4-qwen3-8b`) before switching"
        )
    applies = [g for g in guidance if g.applies]
    if applies:
        parts.append("published guidance for this model: " + "; ".join(f"{g.scenario}: {g.published}" for g in applies))
    return " ".join(p[0].upper() + p[1:] + "." for p in parts) if parts else "No verdict yet: run `make all`."


def read_card(profile: str, root: Path = REPO_ROOT) -> Card:
    """The card of a rendered profile (``reports/<profile>/status.json``)."""
    from kvstudy.profiles import check_profile_name, load_profile

    check_profile_name(profile)
    data = load_profile(profile, root / "profiles")
    path = root / "reports" / profile / "status.json"
    if not path.is_file():
        raise StudyError(f"{path}: no rendered reports for profile {profile!r} (run `make all PROFILE={profile}`)")
    return card_from_status(profile, read_status(path), list(data["notebooks"]))


# The fields of a status entry a reader uses, and the JSON types each may have.
_ENTRY_TEXT = ("rendered", "error", "finding", "needs", "failed_html")
_VERDICT_TEXT = ("topic", "state", "text", "next_step")


def read_status(path: Path) -> dict[str, dict[str, Any]]:
    """``status.json`` as a render wrote it: an object of notebook -> entry, each entry an object whose
    texts are strings (or null), ``seconds`` a number and ``verdicts`` a list of objects; else one
    line naming the file and the field (the card and the index read nothing unchecked)."""
    status = read_json(path)
    if not isinstance(status, dict):
        raise StudyError(f"{path}: expected a JSON object (the render's status), got {type_name(status)}")
    for stem, entry in status.items():
        where = f"{path}: {str(stem)[:80]}"
        if not isinstance(entry, dict):
            raise StudyError(f"{where}: expected a status entry (a JSON object), got {type_name(entry)}")
        for key in _ENTRY_TEXT:
            if entry.get(key) is not None and not isinstance(entry[key], str):
                raise StudyError(f"{where}.{key}: expected a string or null, got {type_name(entry[key])}")
        seconds = entry.get("seconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
            raise StudyError(f"{where}.seconds: expected a number or null, got {type_name(seconds)}")
        verdicts = entry.get("verdicts")
        if verdicts is not None and not isinstance(verdicts, list):
            raise StudyError(f"{where}.verdicts: expected a list of verdicts, got {type_name(verdicts)}")
        for i, v in enumerate(verdicts or []):
            if not isinstance(v, dict):
                raise StudyError(f"{where}.verdicts[{i}]: expected a verdict (a JSON object), got {type_name(v)}")
            for key in _VERDICT_TEXT:
                if v.get(key) is not None and not isinstance(v[key], str):
                    raise StudyError(f"{where}.verdicts[{i}].{key}: expected a string, got {type_name(v[key])}")
            if v.get("facts") is not None and not isinstance(v["facts"], dict):
                raise StudyError(f"{where}.verdicts[{i}].facts: expected an object, got {type_name(v['facts'])}")
    return status


def card_from_status(profile: str, status: dict[str, Any], stems: list[str]) -> Card:
    """The card from a render's status entries (the index page builds it the same way)."""
    lines = card_lines(status, stems)
    facts = {k: v for line in lines for k, v in line.facts.items()}
    share = facts.get("fp8_accuracy_share")
    guidance = evaluate_guidance(
        facts.get("model"), facts.get("context_len"), share if isinstance(share, float) else None
    )
    return Card(profile, facts.get("model"), decide(lines, guidance), tuple(lines), tuple(guidance))


def _finite_or_null(data: Any) -> Any:
    """``data`` with every NaN or infinity replaced by null (JSON has no word for them)."""
    if isinstance(data, dict):
        return {k: _finite_or_null(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite_or_null(v) for v in data]
    return None if isinstance(data, float) and not is_finite_number(data) else data


def _cmd(args: argparse.Namespace) -> int:
    card = read_card(args.profile)
    if args.json:
        print(json.dumps(_finite_or_null(asdict(card)), indent=1, allow_nan=False))  # NaN is not JSON
        return 0
    print(f"profile {card.profile}, model {card.model or 'not named'}")
    print(f"decision: {card.decision}")
    for line in card.lines:
        step = f"  [next: {line.next_step}]" if line.next_step else ""
        print(f"- {line.topic} ({line.state}): {line.text}{step}")
    print("published guidance (seed 003's table) on this model:")
    for g in card.guidance:
        mark = {True: "applies", False: "does not apply", None: "cannot tell"}[g.applies]
        print(f"- {g.scenario}: {mark} ({g.why}) -> {g.published}")
    return 0


def register(subparsers: Any) -> None:
    """Add ``kvstudy verdict PROFILE [--json]``."""
    parser = subparsers.add_parser("verdict", help="the decision card of a rendered profile")
    parser.add_argument("profile", help="a profile in profiles/ whose reports were rendered (make all PROFILE=...)")
    parser.add_argument("--json", action="store_true", help="the card as JSON")
    parser.set_defaults(func=_cmd)
