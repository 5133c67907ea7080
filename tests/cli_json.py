"""Run the kit CLI with --json and parse what it prints, for the tests of its commands."""
import json

from kit.cli import main


def cli_json(capsys, argv: list[str]) -> dict:
    rc = main(argv + ["--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)
