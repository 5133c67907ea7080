"""`kit collect-comm --help` and `kit validate --help` name each option's default.

A new user's walk through `kit --help`: collect-comm's --backend (gloo, even on a GPU machine),
--ranks, --sizes, --collectives, --iters, --warmup, --repeats and validate's --predictor printed
no default, or no help at all. The expected defaults are read off the parser itself, so the help
and the behaviour cannot drift apart."""
import argparse

import pytest

from kit.cli import build_parser


def options(command):
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]._actions


@pytest.mark.parametrize("command", ["collect-comm", "validate"])
def test_every_option_with_a_default_says_it_in_its_help(command):
    silent = [a.option_strings[0] for a in options(command)
              if a.option_strings and a.default not in (None, False, argparse.SUPPRESS)
              and not (a.help and "default" in a.help and str(a.default) in a.help)]
    assert silent == []
