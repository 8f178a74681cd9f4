"""Published MLPerf Training results imported: one folder per (system, benchmark), with
the original logs, their digests, the system's fingerprint and MLPerf's score.

What is read
------------
A round's results repository (``training_results_v5.1``), one submitter's folder
(``AMD``) or one system's benchmark folder (``AMD/results/<system>/llama2_70b_lora``),
laid out as MLPerf publishes them::

    <submitter>/results/<system>/<benchmark>/result_N.txt   (SMC v4.0: result_<job>_<N>.txt)
    <submitter>/results/<system>/<benchmark>/scaling.json   (optional: the review's scaling factor)
    <submitter>/systems/<system>.json                       (the system description)

What is written
---------------
``OUT/<submitter>/<system>/<benchmark>/``::

    published.json   PublishedBenchmark: where it came from, the fingerprint, each log's
                     digest and status, MLPerf's score and what it leaves out
    logs/<name>      each result log, byte for byte (the digests in published.json are theirs)
    system.json      the system description, byte for byte
    scaling.json     where the benchmark folder has one, byte for byte

Nothing is trained or re-timed: each run is what its log says (its status, its
seed, its time from ``run_start`` to ``run_stop``), read by ampcert's strict MLLOG
reader (:mod:`ampcert.mllog.reader`, the reader of a team's own job's log too). A
log that reader refuses, or whose run did not succeed, is kept with its reason
and dropped from the score as MLPerf's summarizer drops it.

Precision is taken from what the logs disclose (MLPerf 6.x's lowest-precision
keys) or recorded as "not disclosed"; the system description's free-text
``sw_notes`` are kept verbatim beside it. It is never guessed from file names.

Every benchmark folder is read and every system description validated before
the first file is written, and a folder already imported with other content is
not replaced. Each folder is written beside its place and renamed into it, so
it is whole or absent. Importing the same results twice, from wherever they lie,
writes the same bytes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ampcert.atomic import atomic_write_bytes, atomic_write_chunks
from ampcert.certify.mlperf import COMPLIANCE, Reverification, reverify, round_name, round_of_folder
from ampcert.configio import read_json_file
from ampcert.errors import BadArgument, UserError
from ampcert.mllog.reader import Scanned, TrainingLog, scan
from ampcert.published.energy import BenchmarkEnergy, energy_benchmark
from ampcert.published.scores import (
    BenchmarkScore,
    RunTime,
    result_files,
    scaling_factor,
    score_benchmark,
    timed_runs,
)
from ampcert.published.system import SystemFingerprint, read_system
from ampcert.regular_files import (
    CHUNK,
    HashedLines,
    digest_regular_file,
    open_regular,
    read_regular_file,
)

FORMAT: Literal["ampcert.published.mlperf/1"] = "ampcert.published.mlperf/1"
PUBLISHED_FILE = "published.json"
NOT_DISCLOSED = "not disclosed"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PublishedLog(_Model):
    """One result log as published: where it came from, its bytes' digest, what its run says."""

    file: str = Field(description="the copy in this folder, logs/<name>")
    original: str = Field(description="its path in the submission, <submitter>/results/<system>/<benchmark>/<name>")
    sha256: str
    bytes: int
    status: str | None = Field(description="run_stop's status (success, aborted); null where the log cannot be read")
    seed: int | None = None
    global_batch_size: int | None = None
    problem: str | None = Field(default=None, description="why ampcert's strict MLLOG reader refused the log")


class PowerLog(_Model):
    """One power log as published (power/result_N/node_K.txt, sw_K.txt): the bytes an energy figure comes from."""

    file: str = Field(description="the copy in this folder, power/<run>/<name>")
    sha256: str
    bytes: int


class DisclosedPrecision(_Model):
    disclosed: str = Field(description=f"what the logs disclose (lowest precision per category), or '{NOT_DISCLOSED}'")
    sw_notes: str = Field(default="", description="the system description's free-text notes, verbatim (not parsed)")


class PublishedBenchmark(_Model):
    """One system's published results for one benchmark, imported (``published.json``)."""

    format: Literal["ampcert.published.mlperf/1"] = FORMAT
    round: str | None = Field(description="the MLPerf Training round (5.1), from the repository's folder name; "
                                          "null where the path does not say it")
    submitter: str = Field(description="the submitter's folder name")
    system: str = Field(description="the system's folder name (systems/<system>.json)")
    benchmark: str
    division: str
    availability: str = Field(description="the system description's status")
    fingerprint: SystemFingerprint
    precision: DisclosedPrecision
    logs: list[PublishedLog]
    power_logs: list[PowerLog] = Field(default_factory=list, description="the power logs, copied and digested as "
                                       "the result logs are (energy names the ones each run's figure comes from)")
    scaling_json_sha256: str | None = Field(description="sha256 of scaling.json as published; null: none")
    score: BenchmarkScore
    energy: BenchmarkEnergy = Field(description="energy to train from the power logs (power_logs false: none)")
    reverification: Reverification = Field(
        description="MLPerf's own tools for the round's ruleset, run on copies (paths relative to the submission)")

    @property
    def rejected(self) -> list[str]:
        """The checks that failed (MLPerf's, and ampcert's findings beside them), each as ``name: detail``."""
        return [f"{c.name}: {c.detail}" for c in self.reverification.checks if c.status == "failed"]


@dataclass(frozen=True)
class BenchmarkFolder:
    """A system's benchmark folder inside a submission."""

    folder: Path       # <submission root>/<submitter>/results/<system>/<benchmark>
    round: str | None

    @property
    def benchmark(self) -> str:
        return self.folder.name

    @property
    def system(self) -> str:
        return self.folder.parent.name

    @property
    def submitter_dir(self) -> Path:
        return self.folder.parent.parent.parent

    @property
    def system_file(self) -> Path:
        return self.submitter_dir / "systems" / f"{self.system}.json"

    def relative(self, name: str) -> str:
        return "/".join((self.submitter_dir.name, "results", self.system, self.benchmark, name))


def round_of(path: Path, given: str | None = None) -> str | None:
    """The round ``path`` belongs to: ``given`` (``5.1``, ``v5.1`` or ``5.1.0``), else the
    ``training_results_vX.Y`` folder it is in; None where neither says."""
    if given is not None:
        found = round_name(given)
        if found is None:
            raise BadArgument("round", "expected a round such as 5.1", given)
        return found
    return round_of_folder(path)


def _benchmark_dirs(results: Path) -> list[Path]:
    """The benchmark folders (holding result logs) of a ``results/`` folder, or of one system's folder in it."""
    systems = [results] if results.parent.name == "results" else sorted(s for s in results.iterdir() if s.is_dir())
    return [b for s in systems for b in sorted(s.iterdir()) if b.is_dir() and result_files(b)]


def find_benchmarks(path: Path, round_: str | None = None) -> list[BenchmarkFolder]:
    """Every system's benchmark folder under ``path`` (a round, a submitter, its ``results/``, a
    system's or one benchmark folder), sorted; :class:`UserError` where ``path`` is not a submission.
    Paths are resolved first: the names of the submitter, system and benchmark are the folders' own."""
    if not path.is_dir():
        raise UserError(f"{path}: no such folder")
    path = path.resolve()
    found_round = round_of(path, round_)
    if result_files(path):
        if path.parent.parent.name != "results":
            raise UserError(f"{path}: holds result logs, but not at <submitter>/results/<system>/<benchmark>/, "
                            "where MLPerf publishes them (the system description is found from there)")
        dirs = [path]
    elif path.name == "results" or path.parent.name == "results":
        dirs = _benchmark_dirs(path)
    elif (path / "results").is_dir():
        dirs = _benchmark_dirs(path / "results")
    else:
        dirs = [b for sub in sorted(path.iterdir()) if (sub / "results").is_dir() for b in _benchmark_dirs(sub / "results")]
    if not dirs:
        raise UserError(f"{path}: not an MLPerf Training submission: no <submitter>/results/<system>/<benchmark>/"
                        "result_*.txt in it (give a round, a submitter's folder, a system's or a benchmark folder)")
    return [BenchmarkFolder(d, found_round) for d in dirs]


def _log(where: BenchmarkFolder, read: Scanned, run: RunTime, log: TrainingLog | None) -> PublishedLog:
    """One result log as published: its bytes' digest, and what its run says (from :func:`.scores.run_time`)."""
    return PublishedLog(file=f"logs/{run.file}", original=where.relative(run.file),
                        sha256=read.sha256, bytes=read.size,
                        status=log.status if log else None, seed=log.seed if log else None,
                        global_batch_size=log.global_batch_size if log else None,
                        problem=None if log else run.dropped)  # the reader's refusal, when it refused the log


def _precision(logs: list[TrainingLog], fingerprint: SystemFingerprint) -> DisclosedPrecision:
    """What every readable log discloses alike (MLPerf 6.x's lowest_numerical_precision_* keys)."""
    seen = {tuple(sorted(log.lowest_precision.items())) for log in logs}
    disclosed = NOT_DISCLOSED
    if len(seen) == 1 and (only := next(iter(seen))):
        disclosed = ", ".join(f"{category} {dtype}" for category, dtype in only)
    elif len(seen) > 1:
        disclosed = "the logs disclose different precisions"
    return DisclosedPrecision(disclosed=disclosed, sw_notes=fingerprint.sw_notes)


def _relative(value: Any, root: str) -> Any:
    """``value`` (plain data) with every ``root`` prefix of a path in its text taken out."""
    if isinstance(value, str):
        return value.replace(root, "")
    if isinstance(value, list):
        return [_relative(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _relative(v, root) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Copied:
    """A file the import copies when it writes, streamed (a result log may be hundreds of
    MB, and is not held): the bytes it read when it planned, named by their digest. The
    copy is refused if the file no longer holds them."""

    source: Path
    sha256: str
    size: int

    def write(self, dest: Path) -> None:
        try:
            fh = open_regular(self.source)
        except OSError as exc:
            raise UserError(f"{self.source}: cannot read: {exc.strerror or exc}") from None
        with fh:
            copied = HashedLines(fh, CHUNK)
            atomic_write_chunks(dest, copied.chunks())
        if copied.sha256 != self.sha256:
            raise UserError(f"{self.source}: changed while it was imported (sha256 {copied.sha256[:12]}, read "
                            f"as {self.sha256[:12]}): import it again")

    def same_as(self, path: Path) -> bool:
        return digest_regular_file(path)[0] == self.sha256


@dataclass(frozen=True)
class Planned:
    """One benchmark folder read and judged, ready to write."""

    source: BenchmarkFolder
    record: PublishedBenchmark
    files: dict[str, bytes | Copied]   # relative path in the output folder -> bytes, or the file to copy

    @property
    def target(self) -> Path:
        return Path(self.record.submitter, self.record.system, self.record.benchmark)


def _only_regular_files(where: BenchmarkFolder) -> None:
    """:class:`UserError` where the benchmark folder (or its system description) holds a
    symbolic link or anything but a regular file or folder (a FIFO, a device, a socket).

    A submission is untrusted input: its files are read by ampcert and by MLPerf's own
    checkers (which open what they find, following links), so a link to a host file
    (``result_10.txt -> /etc/os-release``) would be imported as a result log, and a FIFO
    would hang the import. Nothing is read before this check."""
    where_is = where.submitter_dir.parent
    paths = [where.system_file, where.folder.parent, where.folder]
    for root, dirs, names in os.walk(where.folder, followlinks=False):
        paths += [Path(root, n) for n in (*dirs, *names)]
    for path in paths:
        try:
            mode = path.lstat().st_mode
        except OSError as exc:
            raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
        shown = path.relative_to(where_is) if path.is_relative_to(where_is) else path
        if stat.S_ISLNK(mode):
            raise UserError(f"{shown}: a symbolic link (to {os.readlink(path)}), not followed: an import reads "
                            "only the regular files inside the submission it was given")
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise UserError(f"{shown}: not a regular file (a FIFO, device or socket), not read")


def read_benchmark(where: BenchmarkFolder) -> Planned:
    """Everything one benchmark folder's import writes, read and checked (nothing written)."""
    _only_regular_files(where)
    fingerprint = read_system(where.system_file)
    files: dict[str, bytes | Copied] = {"system.json": read_regular_file(where.system_file)}
    results = result_files(where.folder)
    # Each log read once, streamed: its digest, its status, the score and the energy come from the
    # same bytes, in memory bounded by what the log says, not by its size.
    scanned = {path: scan(path, in_order=False, source=path.name) for path in results}
    files.update({f"logs/{path.name}": Copied(path, read.sha256, read.size) for path, read in scanned.items()})
    scaling = where.folder / "scaling.json"
    scaling_json = read_regular_file(scaling) if scaling.is_file() else None
    if scaling_json is not None:
        files["scaling.json"] = scaling_json
    # The power logs the energy figures come from, kept and digested as the result logs are.
    power = {path.relative_to(where.folder).as_posix(): read_regular_file(path)
             for path in sorted((where.folder / "power").rglob("*.txt")) if path.is_file()}
    files.update(power)
    scaling_factor(where.folder)  # a scaling.json that says no factor is one line, before MLPerf's checkers run
    # Stored relative to the submission, so published.json does not depend on where the round was cloned.
    checked = _relative(reverify(where.folder, where.round).model_dump(), str(where.submitter_dir.parent) + "/")
    # MLPerf's summarizer drops a run its compliance checker refuses; so does the score.
    refused = {f["file"]: f"MLPerf's compliance checker: {f['errors'][0] if f['errors'] else 'refused'}"
               for c in checked["checks"] if c["name"] == COMPLIANCE for f in c["files"] if not f["ok"]}
    timed = timed_runs(results, refused, scanned)
    score = score_benchmark(where.folder, where.benchmark, accelerators=fingerprint.accelerators or None,
                            timed=timed)
    record = PublishedBenchmark(
        round=where.round, submitter=where.submitter_dir.name, system=where.system, benchmark=where.benchmark,
        division=fingerprint.division, availability=fingerprint.status, fingerprint=fingerprint,
        precision=_precision([log for _, log in timed if log is not None], fingerprint),
        logs=[_log(where, scanned[path], run, log) for path, (run, log) in zip(results, timed, strict=True)],
        power_logs=[PowerLog(file=name, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
                    for name, data in power.items()],
        scaling_json_sha256=hashlib.sha256(scaling_json).hexdigest() if scaling_json is not None else None,
        score=score, energy=energy_benchmark(where.folder, where.benchmark, timed=timed, power_logs=power),
        reverification=Reverification.model_validate(checked))
    files[PUBLISHED_FILE] = (record.model_dump_json(indent=1) + "\n").encode()
    return Planned(where, record, files)


def _clash(item: Planned, out: Path) -> str | None:
    """Why ``item`` cannot be written under ``out`` (None: it can, or it is there already, byte for byte)."""
    folder = out / item.target
    for parent in (out, *(out / p for p in reversed(folder.relative_to(out).parents[:-1])), folder):
        if parent.exists() and not parent.is_dir():
            return f"{parent}: exists and is not a folder"
    if not folder.exists():
        return None
    there = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}
    differ = sorted((there ^ set(item.files)) | {n for n, data in item.files.items() if n in there and not (
        data.same_as(folder / n) if isinstance(data, Copied) else (folder / n).read_bytes() == data)})
    if differ:
        return (f"{folder / differ[0]} already exists with other content: import into an empty folder or remove "
                f"{folder} (a second round of the same system and benchmark goes into another --out)")
    return None


def write_planned(planned: list[Planned], out: Path) -> list[Path]:
    """Write each planned folder under ``out``; refuse, before writing anything, a folder already
    there with other content. Each folder is written beside its place and renamed into it, so a
    folder is whole or absent; one already there with the same bytes is left as it is."""
    for item in planned:
        if why := _clash(item, out):
            raise UserError(why)
    written = []
    for item in planned:
        folder = out / item.target
        if not folder.exists():
            folder.parent.mkdir(parents=True, exist_ok=True)
            # A hidden name (never read as an import), made with the umask's mode, as the files are.
            building = folder.parent / f".{folder.name}.importing-{os.getpid()}"
            shutil.rmtree(building, ignore_errors=True)  # left by a process that was killed
            building.mkdir()
            try:
                for name, data in item.files.items():
                    (building / name).parent.mkdir(parents=True, exist_ok=True)
                    if isinstance(data, Copied):
                        data.write(building / name)
                    else:
                        atomic_write_bytes(building / name, data)
                building.rename(folder)
            finally:
                shutil.rmtree(building, ignore_errors=True)
        written.append(folder)
    return written


def is_imported(folder: Path) -> bool:
    return (folder / PUBLISHED_FILE).is_file()


def load_published(folder: Path) -> PublishedBenchmark:
    """An imported folder's ``published.json``, validated; :class:`UserError` (one line) otherwise."""
    path = folder / PUBLISHED_FILE
    data = read_json_file(path, what="JSON", missing=f"{folder}: not an imported MLPerf result "
                          f"(no {PUBLISHED_FILE}: `ampcert import mlperf`)")
    try:
        return PublishedBenchmark.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"{path}: {where}: {first['msg']} (not a {FORMAT} file)") from None
