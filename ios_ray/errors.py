"""The one exception type that carries a user-facing message."""


class UserError(Exception):
    """Bad input or an unusable environment, described in one clear sentence for the user.

    The CLI prints the message (no traceback) and exits with a non-zero code.
    """
