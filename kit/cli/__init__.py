"""`kit ...`: one subcommand per job, `--json` on every one, thin over kit.api.

Subcommands live in kit/cli/cmd_*.py. Each such module defines `register(subparsers)`, which adds
its parser(s) with `add_command` and sets `func` to a callable taking the parsed args. A func
returns an object: the CLI prints it as JSON under --json, or calls the parser's `text` renderer.
A KitError anywhere becomes one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
import warnings

from kit.errors import KitError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line and exits 2, and takes no abbreviated
    option: argparse's default prefix matching had read `kit replay T --gpu h100-sxm` as
    --gpu-file h100-sxm (replay has no --gpu) and answered with an error about --gpu-file."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise KitError(f"{self.prog}: {message}")


def _whole_at_least(s: str, low: int, what: str) -> int:
    """s read exactly (kit.whole_numbers: through float, 9007199254740993 had become ...992 and
    1.0000000000000001 had passed as 1), at least `low`; else one usage error."""
    from kit.whole_numbers import exact_whole

    try:
        whole = exact_whole(s)
    except (ValueError, OverflowError):  # OverflowError: more than 400 digits (1e400)
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
    if whole < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return whole


def positive_int(s: str) -> int:
    """argparse type: a whole number ≥ 1 ("4096", "1e3"); anything else is a one-line usage error."""
    return _whole_at_least(s, 1, "a positive whole number")


def non_negative_int(s: str) -> int:
    """argparse type: a whole number ≥ 0 (no warm-up calls, say)."""
    return _whole_at_least(s, 0, "a whole number >= 0")


def positive_float(s: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    return value


def add_command(subparsers, name: str, help: str, func, text=None) -> argparse.ArgumentParser:
    """Add a subcommand with --json; `text(result) -> str` renders the non-JSON output."""
    p = subparsers.add_parser(name, help=help, description=help)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=func, text=text)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kit", description="Predict deep-learning performance on GPUs and clusters.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")
    package = importlib.import_module("kit.cli")
    for mod in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if mod.name.startswith("cmd_"):
            importlib.import_module(f"kit.cli.{mod.name}").register(sub)
    _name_defaults(parser)
    return parser


def _name_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option with a default of its own (not None or off) says it in its --help, read off the
    parser so the two cannot drift: `kit predict --help` had named no default for --mode, --dtype,
    --fusion, --tp ..., and 50 options over 9 commands were silent. A help that already names its
    default is left as written. A default of 0 counts (`0 in (None, False)` is true in Python, so
    compare by identity)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _name_defaults(child)
        elif (action.option_strings and action.help is not argparse.SUPPRESS
              and not any(action.default is x for x in (None, False, argparse.SUPPRESS))):
            text = action.help or ""
            if not ("default" in text and str(action.default) in text):
                action.help = f"{text} (default %(default)s)" if text else "default %(default)s"


def _plain(o):
    """o as plain JSON values in one pass: numpy scalars and arrays as Python ones, objects with
    to_dict as their dict, and every non-finite float (an infeasible plan's inf, a missing NaN)
    as null: JSON (RFC 8259) has no Infinity or NaN, and a strict reader (JavaScript's
    JSON.parse) rejects them. numpy is looked up, not imported: no value is numpy's unless it is
    loaded, and importing it had cost `kit comm predict` 0.04 s of its 0.17 s."""
    import math

    np = sys.modules.get("numpy")
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if np is not None and isinstance(o, np.generic):
        return _plain(o.item())
    if np is not None and isinstance(o, np.ndarray):
        return _plain(o.tolist())
    if hasattr(o, "to_dict"):
        return _plain(o.to_dict())
    return o


def json_text(result) -> str:
    """What every command prints under --json: strict JSON (TypeError on a value it cannot hold)."""
    return json.dumps(_plain(result), indent=2, allow_nan=False)


def _note(message, category, filename, lineno, file=None, line=None):
    """A warning on the command line: one line, without Python's file, line and category."""
    print(f"kit: note: {str(message).strip().splitlines()[0] if str(message).strip() else category.__name__}",
          file=sys.stderr)


_result_out: list = []  # the stdout a --json run's result goes to, while the run's prints do not


def result_stream():
    """Where a command writes its result itself (kit validate's list before it fails): stdout,
    even while a --json run sends everything else printed to stderr."""
    return _result_out[-1] if _result_out else sys.stdout


def main(argv: list[str] | None = None) -> int:
    with warnings.catch_warnings():  # restored on return (tests call main many times)
        warnings.showwarning = _note
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.version:
            from kit import __version__

            print(__version__)
            return 0
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        as_json = getattr(args, "json", False) or args.text is None
        if as_json:  # stdout is the JSON alone: what the run prints (a user's model) goes to stderr
            import contextlib

            _result_out.append(sys.stdout)
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    result = args.func(args)
            finally:
                _result_out.pop()
        else:
            result = args.func(args)
        if result is None:
            return 0
        if as_json:
            print(json_text(result))
        else:
            print(args.text(result))
        return 0
    except KitError as e:
        print(f"kit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
