"""The two kinds of failure: what the user did (:class:`UserError`) and what the program broke
(:class:`InternalError`)."""


class UserError(Exception):
    """Bad input or an unusable environment, described in one clear sentence for the user.

    The CLI prints the message (no traceback) and exits with a non-zero code.
    """


class InternalError(RuntimeError):
    """A rule ios-ray keeps for itself was broken: a bug to report, never the user's input. The CLI lets it through
    with its traceback."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message, or its type's name where it has none (for one-sentence errors)."""
    lines = str(error).strip().splitlines()
    return lines[0].strip() if lines else type(error).__name__
