"""The one error type a user can cause.

Every mistake a user can make (unknown GPU, impossible shape, malformed file, missing column)
raises KitError with a message that names the input and says what would be valid. The CLI turns it
into one line on stderr and exit code 2.
"""


class KitError(Exception):
    """A problem with the user's input, explained in one line."""
