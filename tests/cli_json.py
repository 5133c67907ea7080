"""Run the kit CLI with --json and parse what it prints, for the tests of its commands."""
import json

from kit.cli import main


def cli_json(capsys, argv: list[str]) -> dict:
    rc = main(argv + ["--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def cli_error(capsys, *argv) -> str:
    """The one error line of a command that must fail with exit 2 (stdout may hold a listing):
    `kit: error: ...`, no traceback."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert "Traceback" not in err and err.startswith("kit: error: ") and err.count("\n") == 1, err
    return err
