"""Every `kit <command> --help` names each option's default.

A new user's walk through `kit --help`: collect-comm's --backend (gloo, even on a GPU machine),
--ranks, --sizes, --collectives, --iters, --warmup, --repeats and validate's --predictor printed
no default, or no help at all; so did 56 options over 10 other commands (predict's --mode,
--dtype, --fusion, --tp, --zero ..., collect-embedding's sweep, the op commands' --dtype).
The expected defaults are read off the parser itself, so the help and the behaviour cannot drift
apart. A default of 0 counts: `0 in (None, False)` is true in Python, so compare by identity."""
import argparse

import pytest

from kit.cli import build_parser


def parsers(parser=None, name="kit"):
    """(name, parser) for every command, the nested ones (`kit op gemm`, `kit comm fit`) too."""
    parser = parser or build_parser()
    yield name, parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for child_name, child in a.choices.items():
                yield from parsers(child, f"{name} {child_name}")


def has_own_default(action):
    return (action.option_strings and action.help is not argparse.SUPPRESS
            and not any(action.default is x for x in (None, False, argparse.SUPPRESS)))


COMMANDS = dict(parsers())


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_with_a_default_says_it_in_its_help(command):
    parser = COMMANDS[command]
    shown = " ".join(parser.format_help().split())  # rendered, as the user reads it
    silent = [a.option_strings[0] for a in parser._actions if has_own_default(a)
              and not (a.help and "default" in a.help and str(a.default) in a.help % {"default": a.default})]
    assert silent == []
    for a in parser._actions:
        if has_own_default(a):
            assert str(a.default) in shown


def test_the_walk_reaches_the_commands_that_were_silent():
    # the two the first fix named, and the nested and the 0-default cases
    assert {"kit collect-comm", "kit validate", "kit predict", "kit op gemm", "kit comm fit"} <= set(COMMANDS)
    zero = next(a for a in COMMANDS["kit predict"]._actions if "--zero" in a.option_strings)
    assert zero.default == 0 and "default 0" in zero.help % {"default": zero.default}
