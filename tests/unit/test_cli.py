"""The command table: each module registers exactly the sub-commands cli.SUBCOMMAND_MODULES names,
and a command builds only its own module's parser."""

from __future__ import annotations

import importlib

from kvstudy import cli


def test_the_table_names_what_each_module_registers() -> None:
    parser = cli._Parser(prog="kvstudy")
    sub = parser.add_subparsers(dest="command")
    for name, commands in cli.SUBCOMMAND_MODULES.items():
        before = set(sub.choices)
        importlib.import_module(name).register(sub)
        assert sorted(set(sub.choices) - before) == sorted(commands), name


def test_a_command_builds_its_own_parser_only() -> None:
    sub = cli.build_parser(["capacity", "x"])._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert set(sub.choices) == {"capacity"}
    every = cli.build_parser([])._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert {c for commands in cli.SUBCOMMAND_MODULES.values() for c in commands} == set(every.choices)


def test_an_unknown_command_is_one_line(capsys) -> None:
    assert cli.main(["no-such-command"]) == 2
    assert "invalid choice" in capsys.readouterr().err
