"""The one error type a user can cause.

Every mistake a user can make (unknown GPU, impossible shape, malformed file, missing column)
raises KitError with a message that names the input and says what would be valid. The CLI turns it
into one line on stderr and exit code 2.
"""


class KitError(Exception):
    """A problem with the user's input, explained in one line."""


def one_line(e: BaseException, with_type: bool = True) -> str:
    """A caught exception (from a user's model, module or config) as one line for a KitError:
    its message's first line, after its type name unless with_type is False; the bare type name
    when it has no message."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if not msg:
        return type(e).__name__
    return f"{type(e).__name__}: {msg}" if with_type else msg


def whole_number(value, what: str, low: int = 1) -> int:
    """value as a Python int, once it is a whole number >= low (numpy integers too; a bool is
    not a number here); else a KitError naming `what`."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise KitError(f"{what} must be a whole number of at least {low}, got {value!r}")
    return int(value)


def real_number(value, what: str, low: float = 0.0, strict: bool = False,
                high: float | None = None) -> float:
    """value as a Python float, once it is a finite number >= low (> low when strict; <= high
    when given; numpy numbers too; a bool or a string is not a number here); else a KitError
    naming `what`."""
    import math
    import numbers

    x = float("nan")
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        try:
            x = float(value)
        except OverflowError:  # an int past float's range
            pass
    if not math.isfinite(x) or not (x > low if strict else x >= low) or (high is not None and x > high):
        bounds = f"{'>' if strict else '>='} {low:g}" + (f" and <= {high:g}" if high is not None else "")
        raise KitError(f"{what} must be a finite number {bounds}, got {value!r}")
    return x


SEPARATOR_NAMES = {",": "commas", ";": "semicolons"}


def comma_items(text: str, sep: str = ",") -> list[str]:
    """The stripped items of a `sep` list; a trailing separator adds none. ValueError for an
    empty item between two separators ("1K,,2K"), where a value was lost."""
    items = [t.strip() for t in str(text).rstrip().removesuffix(sep).split(sep)]
    if len(items) > 1 and not all(items):
        raise ValueError(f"an empty item between {SEPARATOR_NAMES.get(sep, repr(sep) + 's')}")
    return [t for t in items if t]


def comma_names(text, what: str) -> list[str]:
    """The stripped items of a comma list given as `what` (a trailing comma adds none); a KitError
    for an empty item between two commas ("tile,,wave"), where a name was lost, as `kit compare
    --gpus` and `kit comm predict --sizes` already refused it (comma_items)."""
    try:
        return comma_items(str(text))
    except ValueError:
        raise KitError(f"{what} {text!r} has an empty item between commas; separate names with "
                       "single commas") from None


def need_path(value, what: str):
    """value as given, once it is a path: a non-empty string or an os.PathLike (not bytes); else
    a KitError naming `what`."""
    if isinstance(value, bytes) or not (isinstance(value, str) or hasattr(value, "__fspath__")) \
            or not str(value).strip():
        raise KitError(f"{what} must be a path (a non-empty string or os.PathLike), got {value!r}")
    return value


def refuse_device(path, what: str) -> None:
    """A KitError when path is a character or block device (/dev/zero, a terminal, a disk): read as
    an input file it never ends or blocks; `kit gpus --add /dev/zero` read until the OOM killer
    ended it at 23 GB. A pipe (`<(...)`) is still read; a missing path is left to the caller."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise KitError(f"{what} {path} is a device, not a file; give a file")


def inside_kit(path) -> bool:
    """Whether path is the kit package or lies in it (its code, GPU catalog, shipped weights):
    where no output of a command, nor a trained bundle but the shipped one, may be written."""
    from pathlib import Path

    package = Path(__file__).resolve().parent
    target = Path(path).resolve()
    return target == package or package in target.parents


def yes_no(value, what: str) -> bool:
    """value as a Python bool, once it is one (a numpy bool too); else a KitError naming `what`:
    a string such as "no" or a number would otherwise count by its truth."""
    import numpy as np

    if not isinstance(value, (bool, np.bool_)):
        raise KitError(f"{what} must be True or False, got {value!r}")
    return bool(value)
