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

    def __init__(self, message: object = "") -> None:
        super().__init__(one_line(str(message)))


def one_line(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped
    (``\\n``): a file or field name taken from user input can hold them, and
    the message must stay one line that cannot rewrite the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
