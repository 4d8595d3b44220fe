"""The one exception type that carries a user-facing message."""


class UserError(Exception):
    """Bad input or an unusable environment, described in one clear sentence for the user.

    The CLI prints the message (no traceback) and exits with a non-zero code.
    """


def first_line(error: BaseException) -> str:
    """The first line of an exception's message, or its type's name where it has none (for one-sentence errors)."""
    lines = str(error).strip().splitlines()
    return lines[0].strip() if lines else type(error).__name__
