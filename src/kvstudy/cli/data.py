"""The data and model makers: ``kvstudy tiny-model``, ``checkpoints``, ``gsm8k-data``, ``train-model``
and ``retrieval-data``."""

from __future__ import annotations

import argparse
from typing import Any

from kvstudy.cli import force_option
from kvstudy.errors import StudyError
from kvstudy.io import read_json
from kvstudy.limits import MAX_FACTOR, MAX_ITEMS, MAX_NEEDLES, MAX_SEED, float_arg, int_arg, output_folder
from kvstudy.tools import tiny_model as tm
from kvstudy.tools import train_data
from kvstudy.tools.retrieval_data import RetrievalSet, write_retrieval_data
from kvstudy.tools.train_data import TrainSettings
from kvstudy.tools.train_model import DEFAULT_OUT, evaluate_gsm8k, evaluate_retrieval, run_training


def _tiny_model(args: argparse.Namespace) -> int:
    spec = tm.SIZES[args.size]  # argparse's choices
    path = args.path if args.path is not None else tm.DEFAULT_PATHS[args.size]
    folder = tm.build_tiny_model(path, spec) if args.force else tm.ensure_tiny_model(path, spec)
    marker = read_json(folder / tm.MARKER)
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(
        f"{folder}: {args.size} Qwen3 ready ({spec.num_hidden_layers} layers, hidden {spec.hidden_size}, "
        f"{size / 1e6:.1f} MB, "
        f"model.safetensors sha256 {marker['files']['model.safetensors'][:12]})"
    )
    return 0


def add_tiny_model(subparsers: Any) -> None:
    parser = subparsers.add_parser("tiny-model", help="build the tiny random-weight Qwen3 model (offline)")
    sub = parser.add_subparsers(dest="tiny_command", required=True)
    build = sub.add_parser("build", help="build the model folder if it is missing")
    build.add_argument(
        "path",
        nargs="?",
        type=output_folder,
        help=f"model folder (default {tm.DEFAULT_PATH} for tiny, {tm.SPEED_PATH} for speed)",
    )
    build.add_argument(
        "--size",
        choices=sorted(tm.SIZES),
        default="tiny",
        help="tiny: 4 layers, hidden 256 (plumbing); speed: 6 layers, hidden 768 (CPU speed sweep)",
    )
    force_option(build, "rebuild even if the folder is complete")
    build.set_defaults(func=_tiny_model)


def _checkpoints(args: argparse.Namespace) -> int:
    from kvstudy.tools import checkpoints  # numpy: only here

    if args.checkpoints_command == "list":
        for case in checkpoints.CASES:
            print(f"{case.name:24s} {case.what}")
        return 0
    unknown = set(args.names) - {c.name for c in checkpoints.CASES}
    if unknown:
        raise StudyError(f"checkpoint names {sorted(unknown)}: unknown (see `kvstudy checkpoints list`)")
    for folder in checkpoints.build_all(args.out_dir, args.names, args.force):
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"{folder}: {size} bytes")
    return 0


def add_checkpoints(subparsers: Any) -> None:
    from kvstudy.tools import checkpoints

    parser = subparsers.add_parser(
        "checkpoints",
        help="generate the small KV-scale test checkpoints",
        description=checkpoints.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="checkpoints_command", required=True)
    build = sub.add_parser("build", help="write the checkpoints into a folder")
    build.add_argument("out_dir", type=output_folder, help="e.g. data/checkpoints")
    build.add_argument("names", nargs="*", help="only these checkpoints (default: all)")
    force_option(build)
    build.set_defaults(func=_checkpoints)
    sub.add_parser("list", help="list the checkpoints and what each contains").set_defaults(func=_checkpoints)


def _gsm8k_data(args: argparse.Namespace) -> int:
    for split, path in train_data.write_splits(args.folder, args.seed, args.n_test, args.n_train, args.force).items():
        print(f"{split}: {path}")
    return 0


def add_gsm8k_data(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "gsm8k-data",
        help="write the offline GSM8K-format train/test files",
        description=train_data.GSM8K_DATA_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("folder", type=output_folder, help="where to write train.jsonl and test.jsonl")
    parser.add_argument("--seed", type=int_arg(0, MAX_SEED), default=train_data.SEED)
    parser.add_argument("--n-test", type=int_arg(1, MAX_ITEMS), default=train_data.N_TEST)
    parser.add_argument("--n-train", type=int_arg(1, MAX_ITEMS), default=train_data.N_TRAIN)
    force_option(parser)
    parser.set_defaults(func=_gsm8k_data)


def _train_model(args: argparse.Namespace) -> int:
    settings = TrainSettings().scaled(args.steps_scale)  # 1.0: the recipe as it is
    record = run_training(args.out, settings, start=args.continue_from, force=args.force)
    print(f"{args.out}: trained in {record['wall_s']:.0f} s, final loss {record['loss_curve']['points'][-1][1]:.4f}")
    if args.eval:
        gsm = evaluate_gsm8k(args.out, args.eval)
        print(f"gsm8k zero-shot strict-match: {gsm['correct']}/{gsm['n']} = {gsm['accuracy']:.3f}")
        ret = evaluate_retrieval(args.out, (512, 1024, 2048, 4096), 20)
        for key, value in ret.items():
            print(f"retrieval {key}: {value['correct']}/{value['n']}")
    return 0


def add_train_model(subparsers: Any) -> None:
    parser = subparsers.add_parser("train-model", help="train the small Qwen3 model (GSM8K-format + retrieval)")
    parser.add_argument(
        "--out", type=output_folder, default=str(DEFAULT_OUT), help=f"model folder (default {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--eval",
        type=int_arg(0, MAX_ITEMS),
        default=0,
        metavar="N",
        help="then evaluate on N test questions and 20 retrieval items per length",
    )
    parser.add_argument(
        "--continue-from",
        metavar="DIR",
        help="a model folder saved after the recipe's first phases: run only the phases after them",
    )
    parser.add_argument(
        "--steps-scale",
        type=float_arg(1e-6, MAX_FACTOR),
        default=1.0,
        help="multiply every stage's steps (1.0 = the committed recipe)",
    )
    force_option(parser)
    parser.set_defaults(func=_train_model)


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise StudyError(f"{option}: expected comma-separated whole numbers, got {text!r}") from None


def _retrieval_data(args: argparse.Namespace) -> int:
    options = ("n_per_length", "questions_per_context", "n_needles", "seed", "chars_per_token")
    spec = RetrievalSet(lengths=_ints(args.lengths, "--lengths"), **{name: getattr(args, name) for name in options})
    path = write_retrieval_data(args.folder, spec, args.force)
    print(f"wrote {path} ({len(spec.kinds) * len(spec.lengths) * spec.n_per_length} items)")
    return 0


def add_retrieval_data(subparsers: Any) -> None:
    default = RetrievalSet()
    parser = subparsers.add_parser(
        "retrieval-data", help="write the long-context retrieval set (lm-eval retrieval_offline)"
    )
    parser.add_argument("folder", type=output_folder, help="where test.jsonl and spec.json go, e.g. data/retrieval")
    parser.add_argument(
        "--lengths", default=",".join(map(str, default.lengths)), help="context lengths in tokens, comma-separated"
    )
    parser.add_argument("--n-per-length", type=int_arg(1, MAX_ITEMS), default=default.n_per_length)
    parser.add_argument("--questions-per-context", type=int_arg(1, MAX_NEEDLES), default=default.questions_per_context)
    parser.add_argument("--n-needles", type=int_arg(1, MAX_NEEDLES), default=default.n_needles)
    parser.add_argument("--seed", type=int_arg(0, MAX_SEED), default=default.seed)
    parser.add_argument(
        "--chars-per-token",
        type=float_arg(0.01, MAX_FACTOR),
        default=default.chars_per_token,
        help="characters per token of the served model's tokenizer (1 for a byte-level one)",
    )
    force_option(parser)
    parser.set_defaults(func=_retrieval_data)
