"""Helpers the CLI tests share."""
from kit.cli import main


def one_error_line(capsys, argv) -> str:
    """Run the CLI, expect exit 2 and exactly one stderr line; return it."""
    assert main(argv) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]
