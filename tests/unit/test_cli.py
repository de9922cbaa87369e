"""The command table: each module of kvstudy.cli has an ``add_<command>`` for exactly the sub-commands
cli.COMMANDS gives it, and a command builds only its own parser."""

from __future__ import annotations

import importlib

from kvstudy import cli


def test_the_table_names_what_each_module_adds() -> None:
    for noun, commands in cli.COMMANDS.items():
        module = importlib.import_module(f"kvstudy.cli.{noun}")
        adders = sorted(name for name in vars(module) if name.startswith("add_"))
        assert adders == sorted("add_" + c.replace("-", "_") for c in commands), noun
        for command in commands:
            sub = cli._Parser(prog="kvstudy").add_subparsers(dest="command")
            getattr(module, "add_" + command.replace("-", "_"))(sub)
            assert list(sub.choices) == [command]


def test_a_command_builds_its_own_parser_only() -> None:
    sub = cli.build_parser(["capacity", "x"])._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert set(sub.choices) == {"capacity"}
    every = cli.build_parser([])._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert [c for commands in cli.COMMANDS.values() for c in commands] == list(every.choices)


def test_an_unknown_command_is_one_line(capsys) -> None:
    assert cli.main(["no-such-command"]) == 2
    assert "invalid choice" in capsys.readouterr().err
