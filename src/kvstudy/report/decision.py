"""The decision card: should this profile's model store its KV cache in FP8, and on what evidence?

Each notebook states structured verdicts (``kvstudy.report.notebook.verdict``: a state, a sentence, plain
facts, the step that would settle it); ``kvstudy render`` keeps them in ``reports/<profile>/status.json``.
This module reads them back (:func:`read_status`, the one checked reader of ``status.json``, also the
render's; a verdict that is absent is "not measured") into the inputs of the one rule
(:mod:`kvstudy.decision_rule`), and lays out the card: the answer and its main reason, a 16-bit | FP8 |
change | how-known table, what would change the answer, the per-topic verdicts, and the published usage
guidance where it holds for this model and GPU.

``kvstudy verdict PROFILE [--json]`` prints the card the index page shows.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from kvstudy import decision_rule as rule
from kvstudy.bench.spec import one_line
from kvstudy.errors import StudyError
from kvstudy.formats import MISSING, finite
from kvstudy.io import REPO_ROOT, read_json
from kvstudy.model.capacity import SLIDING, kv_footprint, load_layout
from kvstudy.model.plan import advised_skip_layers
from kvstudy.profiles import load_profile
from kvstudy.report.design import accuracy_design, need_sentence, runs_design

# The notebooks in the order the card lists their topics: the topic each states, its report as the card names it.
TOPICS = {
    "01_capacity-math": ("capacity", "capacity report"),
    "08_load-at-equal-memory": ("load at equal memory", "load report"),
    "02_speed-sweep": ("speed", "speed report"),
    "03_gsm8k-accuracy": ("accuracy", "accuracy report"),
    "06_retrieval-accuracy": ("long-context accuracy", "long-context report"),
    "07_kv-precision": ("KV precision (simulated)", "precision report"),
    "05_context-scaling": ("context scaling", "context report"),
    "04_scale-inspection": ("scales", "scales report"),
}


@dataclass(frozen=True)
class CardLine:
    """One topic of the card: its state, the sentence, and what would settle it."""

    topic: str
    state: str  # one of kvstudy.decision_rule.VERDICT_STATES, or "reported": a finding without a structured verdict
    text: str
    report: str  # the notebook stem whose report holds the detail
    next_step: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    link: str | None = None  # the report page (its failed render for a notebook that stopped; none if unrendered)


@dataclass(frozen=True)
class Row:
    quantity: str
    baseline: str
    fp8: str
    change: str
    how: str  # how it is known, and which report holds it
    state: str


@dataclass(frozen=True)
class Card:
    profile: str
    model: str | None
    headline: str  # the answer and its main reason, at most 30 words
    decision: rule.Decision
    rows: tuple[Row, ...]
    changes: tuple[str, ...]  # what would change this answer
    missing: tuple[dict[str, str], ...]  # each missing measurement: what, and the command with its cost
    inputs: dict[str, Any]  # every input of the rule: state, source, values
    thresholds: dict[str, Any]
    lines: tuple[CardLine, ...]
    guidance: tuple[Guidance, ...]


# --------------------------------------------------------------------------- published usage guidance
# vLLM's FP8 KV-cache update publishes a usage table: hybrid sliding-window models keep those layers
# 16-bit, head size 256 with prefill priority stays 16-bit, and contexts below a decode break-even stay
# 16-bit. That break-even was measured on H100 and B200 (Llama-3.1-8B); for any other GPU the card says
# "not published for this GPU", and on an L4 adds what the vLLM documentation's L4 table suggests,
# labelled as a suggestion.
PUBLISHED_BREAK_EVEN_TOKENS = {"H100": 7000, "B200": 4000}
DOCS_L4_TABLE = "data/published/vllm-docs-l4-qwen3-4b.json"
DOCS_L4_MODEL = "data/models/Qwen3-4B"


@dataclass(frozen=True)
class Guidance:
    """One row of the published usage table, evaluated on this model and GPU."""

    scenario: str
    published: str  # the table's recommendation, restated
    applies: bool | None  # None: the study cannot tell
    why: str


def docs_l4_crossing(layout: Any, root: Path = REPO_ROOT) -> float | None:
    """The context from which the vLLM documentation's L4 table (Qwen3-4B, FP8 vs BF16 throughput)
    suggests FP8 is faster, for a model of ``layout``'s KV bytes per token: the line through the table's
    two shortest contexts, where it crosses 0 %, scaled by Qwen3-4B's KV bytes per token over this
    model's (a model with more KV per token reads as much at a shorter context). A suggestion from
    published figures, not a measured break-even; None when the table or config is unreadable."""
    try:
        table = read_json(root / DOCS_L4_TABLE)
        points = sorted((float(r["context_tokens"]), float(r["fp8_throughput_change_pct"])) for r in table["rows"])[:2]
        (x1, y1), (x2, y2) = points
        crossing = x1 - y1 * (x2 - x1) / (y2 - y1)
        ratio = (
            kv_footprint(load_layout(root / DOCS_L4_MODEL), "auto", 4096).bytes_per_token
            / kv_footprint(layout, "auto", 4096).bytes_per_token
        )
    except (StudyError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return crossing * ratio if math.isfinite(crossing) and crossing > 0 else None


def evaluate_guidance(model: str | None, context_len: int | None, gpu: str | None = None) -> list[Guidance]:
    """vLLM's published usage table on this model and GPU: which rows apply, and why (or why the study cannot tell)."""
    try:
        if not model:
            raise StudyError("no model named by the profile")
        layout = load_layout(model)
    except StudyError as exc:
        return [Guidance("model layout", "(needs the model's config)", None, str(exc))]
    sliding = layout.count(SLIDING)
    windows = ", ".join(f"{w:,}" for w in layout.sliding_windows)
    hybrid = advised_skip_layers(layout) is not None
    heads = sorted({layer.head_size for layer in layout.layers if layer.head_size})
    key = (gpu or "").upper().replace(" ", "").replace("-", "")
    family = next((name for name in PUBLISHED_BREAK_EVEN_TOKENS if key.startswith(name)), None)
    even = PUBLISHED_BREAK_EVEN_TOKENS.get(family or "", 0)
    crossing = docs_l4_crossing(layout) if family is None and gpu and gpu.upper().startswith("L4") else None
    suggestion = (
        f"; the vLLM documentation's L4 throughput table (Qwen3-4B, users not published) suggests FP8 is "
        f"faster from about {crossing:,.0f} tokens for this model's KV size (a suggestion, not a measurement)"
        if crossing
        else ""
    )
    return [
        Guidance(
            "hybrid attention (sliding-window and full-attention layers)",
            "FP8 with the sliding-window layers kept 16-bit (--kv-cache-dtype-skip-layers sliding_window)",
            hybrid,
            f"{sliding} of {len(layout.layers)} layers slide (window {windows} tokens); the card counts FP8 this way"
            if hybrid
            else f"all {sliding} layers slide (window {windows} tokens): not hybrid, FP8 stores every layer"
            if sliding
            else "no sliding-window layers",
        ),
        Guidance(
            "head size 256, prefill first",
            "stay 16-bit (FP8 prefill about 1.6x slower at long contexts, measured on H100), or validate",
            256 in heads,
            f"head size {', '.join(map(str, heads)) or 'none'}",
        ),
        Guidance(
            f"contexts below the {family} break-even (about {even:,} tokens, Llama-3.1-8B)",
            "stay 16-bit: FP8's fixed cost per step outweighs the halved KV reads",
            None if context_len is None else context_len < even,
            "no context length given" if context_len is None else f"the profile's context is {context_len:,} tokens",
        )
        if family
        else Guidance(
            "short contexts (below a break-even)",
            "stay 16-bit below the break-even",
            None,
            f"not published for {gpu or 'this GPU'} (only for H100 and B200){suggestion}",
        ),
    ]


# --------------------------------------------------------------------------- reading the verdicts


class _Verdict(TypedDict, total=False):
    topic: str | None
    state: str | None
    text: str | None
    next_step: str | None
    facts: dict[str, Any] | None


class _Entry(TypedDict, total=False):
    """The fields of a status entry a reader uses (others are kept as they are)."""

    rendered: str | None
    error: str | None
    finding: str | None
    needs: str | None
    failed_html: str | None
    seconds: float | None
    verdicts: list[_Verdict] | None


_STATUS = TypeAdapter(dict[str, _Entry])


def read_status(path: Path) -> dict[str, dict[str, Any]]:
    """``status.json`` as a render wrote it (its finding, error and verdicts per notebook), each field
    of an entry and of its verdicts of its type (strict: a number is not a string), else one line
    naming the file and the field."""
    status: dict[str, dict[str, Any]] = read_json(path)
    try:
        _STATUS.validate_python(status, strict=True)
    except ValidationError as exc:
        raise StudyError(f"{path}: {one_line(exc)}") from None
    return status


def card_lines(status: dict[str, Any], stems: list[str]) -> list[CardLine]:
    """The verdicts of the profile's notebooks (status entries as :func:`read_status` checks them), topic
    by topic (:data:`TOPICS` first, then the rest in the profile's order); a notebook that did not
    render gives one line saying why and what to run."""
    lines = []
    for stem in [s for s in TOPICS if s in stems] + [s for s in stems if s not in TOPICS]:
        entry, topic = status.get(stem) or {}, TOPICS.get(stem, (stem,))[0]
        if entry.get("error") or not entry:
            why = entry.get("error") or "not rendered yet for this profile"
            needs = entry.get("needs")
            step = (
                f"run `{needs}`, then `make all`" if needs else "see where the render stopped" if entry else "make all"
            )
            lines.append(
                CardLine(topic, "not measured", f"no verdict: {why}", stem, step, {}, entry.get("failed_html"))
            )
            continue
        for v in entry.get("verdicts") or []:
            topic, state, text = v.get("topic") or stem, v.get("state") or "measured", v.get("text") or ""
            lines.append(CardLine(topic, state, text, stem, v.get("next_step"), v.get("facts") or {}, f"{stem}.html"))
        if not entry.get("verdicts"):
            text = entry.get("finding") or "the notebook stated no finding"
            lines.append(CardLine(topic, "reported", text, stem, None, {}, f"{stem}.html"))
    return lines


def _input(line: CardLine | None, prefix: str = "") -> rule.Input:
    """A topic's line as the rule's input: its facts as the notebook stated them (those named
    ``prefix...``, without it); absent where it states no ``prefix`` ratio."""
    if line is None or (prefix and line.facts.get(f"{prefix}ratio") is None):
        return rule.ABSENT
    known = rule.DECISIVE | {rule.PUBLISHED, rule.SIMULATED, rule.NO_CLAIM}
    state = line.state if line.state in known else rule.NOT_MEASURED
    state = rule.SIMULATED if line.facts.get("simulated") is True else state
    facts = {k.removeprefix(prefix): v for k, v in line.facts.items() if k.startswith(prefix)}
    return rule.Input(state, f"{line.report} ({line.topic})", facts)


def evidence(lines: list[CardLine]) -> rule.Evidence:
    """The rule's inputs from the card's lines (a topic absent or without facts: not measured)."""
    by_topic = {line.topic: line for line in lines}
    return rule.Evidence(
        capacity=_input(by_topic.get("capacity")),
        load=_input(by_topic.get("load at equal memory")),
        screen=_input(by_topic.get("engine screen")),
        accuracy=tuple(_input(by_topic[t]) for t in ("accuracy", "long-context accuracy") if t in by_topic),
        tpot=_input(by_topic.get("speed"), "tpot_"),
        scales=_input(by_topic.get("scales")),
    )


# --------------------------------------------------------------------------- the table


def _int(n: float | None) -> str:
    return MISSING if n is None else f"{n:,.0f}"


def _how(inp: rule.Input, detail: str = "") -> str:
    if inp == rule.ABSENT:
        return "not measured"
    stem = inp.source.split(" ")[0]
    where = TOPICS.get(stem, (stem, stem))[1]
    return f"{inp.state}{', ' + detail if detail else ''} ({where})"


def _ratio_text(inp: rule.Input, key: str) -> str:
    r, lo, hi = inp.num(key), inp.num(f"{key}_low"), inp.num(f"{key}_high")
    if r is None:
        return MISSING
    return f"{r:.2f}x" + (f" ({lo:.2f} to {hi:.2f})" if lo is not None and hi is not None else " (no interval)")


def _load_detail(load: rule.Input) -> str:
    """What the load row held equal: the target, the KV memory and the context, where 08 states them."""
    target, gib, tokens = load.get("latency_target"), load.num("kv_memory_gib"), load.num("context_tokens")
    number = load.num("latency_target")
    parts = [f"target {target}" if isinstance(target, str) else f"target {number:g}" if number else ""]
    memory = "" if not gib else f"{gib:,.1f} GiB KV" if gib >= 1 else f"{gib * 1024:,.2f} MiB KV"
    parts += [memory, f"{tokens:,.0f} tokens" if tokens else ""]
    shown = ", ".join(p for p in parts if p)
    return f" ({shown})" if shown else ""


def _row(quantity: str, baseline: str, fp8: str, change: str, inp: rule.Input, detail: str = "") -> Row:
    return Row(quantity, baseline, fp8, change, _how(inp, detail), inp.state)


def card_rows(ev: rule.Evidence) -> list[Row]:
    """The 16-bit | FP8 | change | how-known table (at most 8 rows)."""
    cap = ev.capacity
    tb, tf = cap.num("tokens_per_gib_baseline"), cap.num("tokens_per_gib_fp8")
    skip = " (sliding-window layers kept 16-bit, as published advice says)" if cap.get("skip_layers") else ""
    ratio = f"{tf / tb:.2f}x" if tb and tf else MISSING
    rows = [_row("KV tokens per GiB", _int(tb), _int(tf), ratio, cap, "from the model's config" + skip)]
    ctx, gpu, tp = cap.num("context_len"), cap.get("gpu"), cap.num("tp")
    u16, u8 = cap.num("users_baseline"), cap.num("users_fp8")
    where = f" on {gpu}" if isinstance(gpu, str) else ""
    at = f" at {ctx:,.0f} tokens" if ctx else ""
    if cap.get("fits") is False:
        change = f"does not fit up to TP {tp:.0f}" if tp else "does not fit"
    else:
        change = f"{u8 / u16:.2f}x" if u16 and u8 is not None else MISSING
    users = f"Users that fit{at}{where}" + (f", TP {tp:.0f}" if tp else "")
    rows.append(
        _row(users, _int(u16), _int(u8), change, cap, "overhead assumed" if u16 is not None else "weights unknown")
    )
    load = ev.load
    quantity = "Users within the latency target at equal memory" + _load_detail(load)
    u16, u8 = load.num("users_baseline"), load.num("users_fp8")
    rows.append(_row(quantity, _int(u16), _int(u8), _ratio_text(load, "users_ratio"), load))
    tpot = ev.tpot
    b, f, users_n, prompt = (tpot.num(k) for k in ("baseline_ms", "fp8_ms", "users", "prompt_tokens"))
    machine = tpot.get("machine")
    quantity = (
        "Time per output token"
        + (f" at {users_n:,.0f} user{'s' if users_n != 1 else ''}" if users_n else "")
        + (f", {prompt:,.0f}-token prompts" if prompt else "")
        + " (ms)"
    )
    base, fp8 = (MISSING if v is None else f"{v:.2f}" for v in (b, f))
    rows.append(
        _row(quantity, base, fp8, _ratio_text(tpot, "ratio"), tpot, f"on {machine}" if isinstance(machine, str) else "")
    )
    for acc in ev.accuracy or (rule.ABSENT,):
        task, n = acc.get("task"), acc.num("n")
        c, lo, hi, det = (acc.num(k) for k in ("change_points", "change_low", "change_high", "detectable_loss_points"))
        topic = "Long-context accuracy" if "long-context" in acc.source else "Accuracy"
        label = topic + (f", {task}" if isinstance(task, str) else "") + (f", {n:,.0f} items" if n else "")
        interval = f" ({lo:+.1f} to {hi:+.1f})" if lo is not None and hi is not None else ""
        change = MISSING if c is None else f"{c:+.1f} points{interval}"
        detail = "its verdict states no interval" if c is None and acc != rule.ABSENT else ""
        detail = f"could detect a loss of {det:.1f} points" if det is not None else detail
        rows.append(_row(label, MISSING, MISSING, change, acc, detail))
    scr = ev.screen
    kl, upper, margin = scr.num("kl_mean"), scr.num("kl_upper"), scr.num("margin_kl")
    upper_text = f" (upper {upper * 1000:.2f})" if upper is not None else ""
    if margin is not None:
        change = f"{scr.get('equivalence')} the margin {margin * 1000:.2f} ({scr.get('margin_state')})"
    else:
        change = f"{scr.get('equivalence')}: no margin ({scr.get('margin_state')})" if scr != rule.ABSENT else MISSING
    quantity = "Engine screen: KL divergence, FP8 vs 16-bit (millinats)"
    source = f"margin {scr.get('margin_source')}" if scr.get("margin_source") else ""
    rows.append(_row(quantity, MISSING, MISSING if kl is None else f"{kl * 1000:.2f}{upper_text}", change, scr, source))
    rows.append(_scales_row(ev.scales))
    return rows[:8]


def _scales_row(scales: rule.Input) -> Row:
    """What the checkpoints' KV scales are; none read is "not measured", not "0 of 0 measured"."""
    n = scales.num("checkpoints")
    if not n:
        how = "not measured (0 checkpoints read)"
        return Row("KV scales in the checkpoints", MISSING, MISSING, MISSING, how, rule.NOT_MEASURED)
    dropped, logs = scales.num("dropped"), scales.num("logs_checked")
    text = f"{_int(scales.num('with_scales'))} carry scales; {_int(scales.num('unit_scale'))} run at 1.0"
    if logs:
        text += f"; {_int(dropped)} of {logs:,.0f} logs dropped"
    return _row(f"KV scales ({n:,.0f} checkpoints)", MISSING, text, MISSING, scales)


# --------------------------------------------------------------------------- what is missing, what would change it


def _run(profile: str, stem: str, stems: list[str]) -> str:
    """The make command that renders ``stem``, adding it to the profile first where it is not there."""
    add = "" if stem in stems else f"add notebook {stem} to profiles/{profile}.yaml, then "
    return f"{add}`make all PROFILE={profile} ONLY={stem}`"


def _missing_step(missing: rule.Missing, profile: str, th: rule.Thresholds, stems: list[str]) -> str:
    """The command that gets a missing measurement, with its cost (the reports' own next steps stay in
    the topic table)."""
    if missing.what == "capacity":
        return (
            f"{_run(profile, '01_capacity-math', stems)} (seconds, no GPU; give weights_gib if the weights are unknown)"
        )
    if missing.what == "load":
        pct = th.min_users_gain_pct
        need = runs_design("speed", (pct,))[0].runs_per_arm  # assumed noise: one row
        blocks = f"; about {need} seed blocks per arm for a {pct:g} % change, assumed noise, `kvstudy design speed`"
        return (
            f"{_run(profile, '08_load-at-equal-memory', stems)} on the target GPU (both arms at equal KV memory"
            f"{blocks if need else ''}), or state `kv_bound: true` under `decision:` in the profile"
        )
    sentence = need_sentence(accuracy_design((th.accuracy_margin_points,)))
    return (
        f"`kvstudy kv-screen` against a 16-bit and an FP8 server of the model, or "
        f"{_run(profile, '03_gsm8k-accuracy', stems)} with both arms on the target GPU: {sentence}"
    )


def what_would_change(decision: rule.Decision, th: rule.Thresholds, guidance: list[Guidance]) -> list[str]:
    if decision.answer == rule.UNDECIDED:
        out = [
            "Each measurement above (To decide, measure), once its interval lies past its threshold (the rule in the README)."
        ]
    elif decision.answer == rule.TURN_ON:
        out = [
            f"Accuracy measured beyond {rule.points(th.accuracy_margin_points)} on the engine's own FP8 arm.",
            "Fewer users within the latency target at equal memory, measured on the target GPU.",
            f"A per-token slowdown beyond {th.tpot_cost_pct:g} % that the extra users do not repay.",
        ]
    else:
        out = [
            "A profile whose FP8 stores most of the KV bytes, with accuracy within the margin and more users "
            "within the latency target measured."
        ]
    out += [
        f"Published guidance for this model, if its scenario is yours: {g.scenario}: {g.published}."
        for g in guidance
        if g.applies
    ]
    return out


def _headline(decision: rule.Decision, ev: rule.Evidence) -> str:
    """The answer and its main reason, at most 30 words."""
    if decision.answer == rule.UNDECIDED:
        names = {"capacity": "the users that fit", "load": "users within the latency target", "accuracy": "accuracy"}
        open_ = [names[m.what] for m in decision.missing]
        listed = open_[0] if len(open_) == 1 else ", ".join(open_[:-1]) + " and " + open_[-1]
        u16, u8 = ev.capacity.num("users_baseline"), ev.capacity.num("users_fp8")
        gain = (
            f"FP8 fits {u8 / u16:.1f}x the users, but "
            if u16 and u8 and "capacity" not in [m.what for m in decision.missing]
            else ""
        )
        text = f"{decision.answer}: {gain}{listed} {'is' if len(open_) == 1 else 'are'} not settled yet (not measured, or no claim)."
    else:
        text = f"{decision.answer}: {decision.reason}."
    words = text.split()
    return text if len(words) <= 30 else " ".join(words[:29]) + " …"


# --------------------------------------------------------------------------- the card


def card_from_status(profile: str, status: dict[str, Any], stems: list[str], decision_settings: Any = None) -> Card:
    """The card from a render's status entries (the index page builds it the same way);
    ``decision_settings``: the profile's ``decision:`` mapping (thresholds)."""
    th = rule.Thresholds.from_dict(decision_settings or {}, "decision")
    lines = card_lines(status, stems)
    ev = evidence(lines)
    model, gpu, context = (ev.capacity.get(k) for k in ("model", "gpu", "context_len"))
    model, gpu = (v if isinstance(v, str) else None for v in (model, gpu))
    guidance = evaluate_guidance(model, int(context) if isinstance(context, int) else None, gpu)
    decision = rule.decide(ev, th)
    stated = rule.STATED if th.kv_bound is not None else rule.NOT_MEASURED
    kv_bound = rule.Input(stated, "profile's decision: mapping", {"kv_bound": th.kv_bound})
    return Card(
        profile,
        model,
        _headline(decision, ev),
        decision,
        tuple(card_rows(ev)),
        tuple(what_would_change(decision, th, guidance)),
        tuple({"what": m.step, "run": _missing_step(m, profile, th, stems)} for m in decision.missing),
        finite({**asdict(ev), "kv_bound": asdict(kv_bound)}),
        th.model_dump(),
        tuple(lines),
        tuple(guidance),
    )


def read_card(profile: str, root: Path = REPO_ROOT) -> Card:
    """The card of a rendered profile (``reports/<profile>/status.json``)."""
    data = load_profile(profile, root / "profiles")
    path = root / "reports" / profile / "status.json"
    if not path.is_file():
        raise StudyError(f"{path}: no rendered reports for profile {profile!r} (run `make all PROFILE={profile}`)")
    return card_from_status(profile, read_status(path), list(data["notebooks"]), data.get("decision"))


def card_json(card: Card) -> str:
    """The card as strict JSON (no NaN or Infinity: a missing number is null)."""
    return json.dumps(finite(asdict(card)), indent=1, allow_nan=False)


def card_text(card: Card) -> str:
    out = [
        card.headline,
        f"(rule: {card.decision.rule}; profile {card.profile}, model {card.model or 'not named'})",
        "",
    ]
    head = ("", "16-bit", "FP8", "change (interval)", "how known")
    table = [head] + [(r.quantity, r.baseline, r.fp8, r.change, r.how) for r in card.rows]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        out.append(" | ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + " | " + row[4])
    if card.missing:
        out += ["", "To decide, measure:"] + [f"- {m['what']}: {m['run']}" for m in card.missing]
    out += ["", "What would change this answer:"] + [f"- {c}" for c in card.changes]
    out += ["", "Published usage guidance on this model and GPU:"]
    for g in card.guidance:
        mark = {True: "applies", False: "does not apply", None: "cannot tell"}[g.applies]
        out.append(f"- {g.scenario}: {mark} ({g.why}) -> {g.published}")
    return "\n".join(out)
