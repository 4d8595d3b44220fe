"""The two kinds of failure: what the user did (:class:`UserError`) and what the program broke
(:class:`InternalError`), and the kinds of user error a caller may want to catch apart, each still one sentence:
:class:`ImportRefused`, :class:`DeviceUnavailable` and :class:`StoreUnusable`."""


class UserError(Exception):
    """Bad input or an unusable environment, described in one clear sentence for the user.

    The CLI prints the message (no traceback) and exits with a non-zero code.
    """


class ImportRefused(UserError):
    """ios-ray cannot import this model into its graph (it cannot be traced or captured, it fails on the example
    input, or it takes or returns what ios-ray does not schedule): run it as it is, or change what the message names.
    """


class DeviceUnavailable(UserError):
    """A device label names no device ios-ray knows, or no node of the cluster offers that device."""


class StoreUnusable(UserError):
    """The latency store cannot be used: missing where it must exist, a folder, not a store, unreadable or damaged,
    locked by another program, of another format version, unwritable, or hard-linked under several names."""


class InternalError(RuntimeError):
    """A rule ios-ray keeps for itself was broken: a bug to report, never the user's input. The CLI lets it through
    with its traceback."""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message, or its type's name where it has none (for one-sentence errors)."""
    lines = str(error).strip().splitlines()
    return lines[0].strip() if lines else type(error).__name__
