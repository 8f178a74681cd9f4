"""The one exception type the CLI turns into a one-line message and exit code 2."""

from __future__ import annotations

from collections.abc import Callable


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


class BadArgument(UserError):
    """A bad value for one argument of a session function, in the API's own words.

    ``str(exc)`` names the parameter as a caller of :mod:`ampcert.session`
    wrote it (``device: expected cpu or cuda, got 'tpu'``, or with the value
    it was given, ``csv out.csv: cannot write (...)``); the CLI, which knows
    which flag fed that parameter, prints :meth:`as_option` instead
    (``--device: expected ...``, ``--csv out.csv: cannot write ...``).
    ``param`` is the parameter's name, ``value`` what was given (or None),
    ``detail`` what is wrong with it.
    """

    def __init__(self, param: str, detail: str, value: object = None) -> None:
        self.param = param
        self.value = None if value is None else one_line(str(value))
        self.detail = one_line(detail)
        super().__init__(self._render(param))

    def _render(self, name: str) -> str:
        return f"{name}{'' if self.value is None else ' ' + self.value}: {self.detail}"

    def as_option(self, flag: str | None = None) -> str:
        """The one line with the command line's spelling: ``flag`` where given,
        else ``--`` and the parameter's name with dashes (``sign_key`` -> ``--sign-key``)."""
        return self._render(flag or "--" + self.param.replace("_", "-"))


class WriteFailed(UserError, OSError):
    """A file could not be written: a full disk, a quota, a read-only or missing folder.

    Raised by the atomic writers (``atomic.atomic_write_text``, ``results.atomic_write_json``,
    the telemetry series, the MLLOG), which leave the old file as it was and
    no temp file behind, so nothing written before is harmed and ``--resume``
    goes on once there is space. The message names the file and the errno:
    ``cannot write DIR/report.html: [Errno 28] No space left on device``.

    Not bad input, but the same one line: the CLI exits 2, or 1 when it ends
    an ``ampcert run`` (the run failed; see ``ampcert.cli.main``). An OSError
    too (``errno``, ``strerror``, ``filename``), so that code catching OSError
    around a write goes on working.
    """

    def __init__(self, path: object, error: OSError) -> None:
        reason = f"[Errno {error.errno}] {error.strerror}" if error.errno is not None else str(error)
        # The folder, where it is what failed (a parent that is a file, or that
        # cannot be made): the errno alone would point at the wrong name.
        other = error.filename
        if other is not None and str(other) != str(path) and not str(other).endswith(".tmp"):
            reason += f" ({other})"
        super().__init__(f"cannot write {path}: {reason}")
        self.error = error
        self.path = str(path)
        self.errno, self.strerror, self.filename = error.errno, error.strerror, str(path)

    def __str__(self) -> str:  # the one line, not OSError's "[Errno N] ...: 'path'"
        return str(self.args[0])

    def during_runs(self) -> WriteFailedDuringRuns:
        """The same failure, once runs have started: the command failed as a crashed run does."""
        return WriteFailedDuringRuns(self.path, self.error)


class WriteFailedDuringRuns(WriteFailed):
    """A write that failed once runs had started (a disk filled by the suite): exit 1, not 2.

    What was written stays whole, and ``--resume`` goes on once there is space."""

    exit_code = 1


def one_line(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped
    (``\\n``): a file or field name taken from user input can hold them, and
    the message must stay one line that cannot rewrite the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class Interrupted(BaseException):
    """A signal (SIGINT, SIGTERM or SIGHUP) stopped the command.

    Raised in the main thread by the runner's signal handlers
    (``ampcert.runner.signals.interruptible``); the worker of the run in
    progress is stopped on the way up: finished runs keep their results, the
    interrupted run has none and stays pending. A BaseException, as
    KeyboardInterrupt is: an interruption is no failure of the command, and no
    ``except Exception`` on its way up may record it as one. The CLI prints
    :attr:`line` (:meth:`report`) and exits ``128 + signum`` (130 SIGINT, 143
    SIGTERM, 129 SIGHUP: what a shell reports for a process that the signal
    ended). ``folder`` is the results folder that ``ampcert run --resume``
    continues; None where there is none (yet).
    """

    def __init__(self, signum: int, folder: object = None) -> None:
        import shlex
        import signal

        self.signum = signum
        self.exit_code = 128 + signum
        self.folder = None if folder is None else str(folder)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        message = f"interrupted by {name}"
        if self.folder is not None:
            message += f"; finished runs are kept; resume with ampcert run --resume {shlex.quote(self.folder)}"
        super().__init__(one_line(message))
        # None until the line is being written, False while it is, True once it
        # is: a further signal (which ends the process at once, see the runner)
        # writes the line itself only while None, so it is never lost nor doubled.
        self.written: bool | None = None

    @property
    def line(self) -> str:
        return f"ampcert: {self}"

    def report(self, write: Callable[[str], object]) -> None:
        """Write :attr:`line` with ``write`` (the CLI's console on stderr)."""
        self.written = False
        write(self.line)
        self.written = True


class NotVerified(Exception):
    """A signed report that does not verify: the message says which check failed.

    Not bad input (exit 2) but a negative finding: the CLI exits 1."""
