"""framework.cli.running: the one way the command lines run a verb (issue #38 item 6)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from framework.cli import dispatch
from framework.cli.parser import VERBS, build_parser
from framework.errors import FrameworkError


def _parser(*, func_defaults: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="demo")
    sub = parser.add_subparsers(dest="command")
    hello = sub.add_parser("hello")
    hello.add_argument("name")
    if func_defaults:
        hello.set_defaults(func=_hello)
    sub.add_parser("fail")
    return parser


def _hello(args: argparse.Namespace) -> int:
    print(f"hello {args.name}")
    return 0


def _fail(args: argparse.Namespace) -> int:
    raise FrameworkError("no such thing")


VERBS_OF_DEMO = {"hello": _hello, "fail": _fail}


def test_dispatch_runs_the_verb_the_mapping_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch("demo", _parser(), VERBS_OF_DEMO, ["hello", "you"]) == 0
    assert capsys.readouterr().out == "hello you\n"


def test_a_user_mistake_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch("demo", _parser(), VERBS_OF_DEMO, ["fail"]) == 2
    assert capsys.readouterr().err == "demo: error: no such thing\n"


def test_no_verb_prints_the_help_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch("demo", _parser(), VERBS_OF_DEMO, []) == 2
    assert "usage: demo" in capsys.readouterr().out


def test_a_sub_parser_s_func_default_still_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """A command line that sets ``func`` on its sub-parsers (the Katta-like ctl's way) can
    pass an empty mapping."""
    assert dispatch("demo", _parser(func_defaults=True), {}, ["hello", "me"]) == 0
    assert capsys.readouterr().out == "hello me\n"


def test_every_verb_of_framework_has_a_function() -> None:
    parser = build_parser()
    words = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert words == set(VERBS)


def test_importing_the_cli_loads_neither_the_runtime_nor_rich() -> None:
    """The examples' command lines import the toolkit: it stays light (the verbs import what
    they need when they run)."""
    code = ("import sys, framework.cli; print(sorted(m for m in ('framework.runtime', 'rich', "
            "'trio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
