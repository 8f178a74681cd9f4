"""The one exception type the CLI turns into a one-line message and exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: a file, a field, a path.

    The message is a single line that names what is wrong and what was
    expected; the CLI prints it as ``ampcert: error: <message>`` and exits 2.
    Raise it only *before* anything is written, or where nothing written can
    be harmed.
    """

    exit_code = 2
