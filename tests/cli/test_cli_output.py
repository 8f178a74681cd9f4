"""What the CLI prints reads right anywhere: a terminal of any width, a pipe or
CI log (plain text, nothing cut, no colour), a program (--json on stdout,
--json-out FILE); NO_COLOR wins; `--version`, `list` and `show`; bad input on
the new commands and options is one line and exit 2 (click's usage errors, the
session's BadArgument in the option's words).

The commands run through the entry point in this process (:func:`here`): what they print,
not how a process starts, is under test here (test_cli_imports.py starts each in a fresh
interpreter, test_wheel.py the installed script). What needs a process of its own has one,
forked warm (``warm_cli``): a terminal (the pty test), bytes through a real file
descriptor (``show``), the folder's training run."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, assert_one_line_error, cli_env
from factories import built_once, warm_cli
from rich.console import Console

import ampcert
from ampcert import cli, resources, session
from ampcert.cli import views
from ampcert.console import (
    Col,
    Output,
    fit_layout,
    plain_lines,
    print_table,
    vertical_lines,
    wrap_cell,
)
from ampcert.errors import BadArgument

SUITE = """\
name: cli-output
amp: native
device: cpu
precisions: [fp32, bf16]
seeds: [0]
unaccelerated: run
train: {steps: 6, eval_every: 6}
workloads:
  - workload: digits
"""

ANSI = re.compile(r"\x1b\[")
BOX = set("┏┓┗┛┃━┡┩│─┌┐└┘╇╋")


@dataclass(frozen=True)
class Folder:
    suite: Path
    root: Path      # a results folder (commands may re-render it)
    signed: Path    # a signed copy, left alone
    key: Path
    pub: Path


def _build(base: Path) -> None:
    from ampcert.report.sign import keygen

    suite = base / "suite.yaml"
    suite.write_text(SUITE)
    root = base / "results"
    # warm_cli: the same commands, forked with their imports done (2-3 s less each); how a
    # command starts cold is test_cli_imports.py's, which reads this folder too
    proc = warm_cli("run", suite, "--out", root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    signed = base / "signed"
    shutil.copytree(root, signed)
    key, _ = keygen(base / "signing.key")
    proc = warm_cli("sign", signed, "--key", key)
    assert proc.returncode == 0, proc.stdout + proc.stderr


_SHARED: dict[str, Folder] = {}


def shared_folder(tmp_path_factory) -> Folder:
    """One tiny real results folder for the CLI tests of this session (trained once, ~10 s,
    by whichever test process asks first; tests/cli/test_cli_imports.py uses it too), copied
    into this process's temp folder: commands that re-render it never meet another's lock."""
    if "folder" not in _SHARED:
        base = tmp_path_factory.mktemp("cli-folder")
        shutil.copytree(built_once(tmp_path_factory, "cli-folder", _build), base, dirs_exist_ok=True)
        _SHARED["folder"] = Folder(base / "suite.yaml", base / "results", base / "signed", base / "signing.key",
                                   base / "signing.key.pub")
    return _SHARED["folder"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Folder:
    return shared_folder(tmp_path_factory)


def _a_fresh_interpreters_warning_filters() -> None:
    """Python's own default filters (no -W, no PYTHONWARNINGS), in place of pytest's."""
    warnings.resetwarnings()
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__", append=True)
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=category, append=True)


@pytest.fixture
def here(monkeypatch, capfd):
    """``ampcert ARGS`` through the entry point (``cli.main``) in this process, as
    conftest's ``cli_here``, returned as ``warm_cli`` returns it and in its environment
    (``cli_env``'s COLUMNS=200, ``env`` laid over it), but watching what a process of its own
    would show: both file descriptors are captured (anything that reaches fd 1 or 2, not only
    ``sys.stdout``: stdout is a file, not a terminal), and the warnings Python would print
    (a fresh interpreter's filters, each warning shown afresh) are on stderr, where pytest
    would have recorded them quietly."""

    def run(*args: object, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        argv = ["ampcert", *map(str, args)]
        with monkeypatch.context() as m, warnings.catch_warnings(record=True) as caught:
            _a_fresh_interpreters_warning_filters()
            m.chdir(cwd)
            m.setattr(sys, "argv", argv)
            for name, value in ({"COLUMNS": cli_env()["COLUMNS"]} | (env or {})).items():
                m.setenv(name, value)
            capfd.readouterr()
            with pytest.raises(SystemExit) as exit_:
                cli.main()
            out, err = capfd.readouterr()
        err += "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)
        code = exit_.value.code
        return subprocess.CompletedProcess(argv, 0 if code is None else code if isinstance(code, int) else 1, out, err)

    return run


# --------------------------------------------------------------------------- --version


def test_version(here):
    proc = here("--version")
    assert proc.returncode == 0 and proc.stdout == f"ampcert {ampcert.__version__}\n" and not proc.stderr
    assert ampcert.__version__ == "0.1.0"


# --------------------------------------------------------------------------- piped: plain, whole, uncoloured


def _table_commands(f: Folder, tmp: Path) -> dict[str, list]:
    return {
        "report": ["report", f.root],
        "dry-run": ["run", f.suite, "--dry-run"],
        "certify": ["certify", f.root],
        "compare": ["compare", f.root, f.root],
        "plan": ["plan", f.root, "--target-samples", "1000000"],
        "check": ["check", f.root],
        "list": ["list"],
        "env": ["env"],
        "merge": ["merge", tmp / "merged", f.root],
    }


def test_piped_tables_at_80_columns_are_plain_and_whole(folder, tmp_path, here):
    summary = json.loads((folder.root / "summary.json").read_text())
    outputs = {}
    for name, args in _table_commands(folder, tmp_path).items():
        proc = here(*args, env={"COLUMNS": "80"})
        outputs[name] = proc.stdout
        assert proc.returncode in (0, 1), (name, proc.stdout + proc.stderr)
        out = proc.stdout
        assert "…" not in out, (name, out)
        assert not ANSI.search(out + proc.stderr), (name, out)
        assert not BOX & set(out), (name, out)
        if name == "report":
            lines = out.splitlines()
            table = lines[: next(i for i, line in enumerate(lines) if line.startswith("wrote "))]
            assert max(map(len, table)) <= 80, out
            # every group whole: workload, precision, runs
            for g in summary["groups"]:
                assert re.search(rf"^{g['workload']}\s+{g['precision']}\s+{g['completed']}/{g['runs']}\s", out, re.M), out
        if name == "dry-run":
            run_ids = [p.name for p in (folder.root / "runs").iterdir()]
            assert run_ids and all(run_id in out for run_id in run_ids), out  # run ids never cut
    # the summary's header is the full words it always was
    header = next(line for line in outputs["report"].splitlines() if line.startswith("workload"))
    assert header.split() == ["workload", "prec", "runs", "metric", "target", "samples/s", "speedup", "MFU",
                              "accel"] + (["note"] if any(g.get("note") for g in summary["groups"]) else [])


def test_summary_notes_and_no_amp_column_in_process():
    group = {"workload": "digits", "amp": "native", "precision": "fp16", "runs": 2, "completed": 2,
             "final_metric": 0.5, "target_reached": None, "samples_per_s": 12345.6,
             "speedup_vs_fp32": 0.02, "mfu": None, "accelerated": False,
             "note": "not comparable (capped at 30 steps)"}
    s = {"suite": "s", "groups": [dict(group, precision="fp32", note=None, accelerated=True), group,
                                  dict(group, precision="bf16")]}
    buf = io.StringIO()
    views.print_summary(Console(file=buf, width=80, force_terminal=False), SimpleNamespace(runs=[]), s)
    out = buf.getvalue()
    assert out.splitlines()[0] == "suite s, amp native"
    assert out.count("[1]") == 3 and "[2]" not in out  # one marker per distinct note, and its footnote
    assert "[1] not comparable (capped at 30 steps)" in out and "12,346" in out and "NO" in out
    assert max(map(len, out.splitlines())) <= 80 and "…" not in out


# --------------------------------------------------------------------------- layouts (pure)


COLS = [Col("workload"), Col("prec"), Col("samples/s", "right"), Col("note")]
ROWS = [["digits", "fp32", "18,011", ""],
        ["a-rather-long-workload-label", "fp16", "312", "not comparable (capped at 30 steps)"]]


@pytest.mark.parametrize("width", [200, 80, 60, 45, 30, 12])
def test_terminal_table_fits_or_becomes_blocks(width):
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=True, color_system=None)
    print_table(con, COLS, ROWS, title="suite t")
    out = buf.getvalue()
    lines = out.splitlines()
    assert "…" not in out
    if fit_layout(COLS, ROWS, width) is None:  # even wrapped it does not fit: key: value blocks, nothing cut
        assert "workload:  a-rather-long-workload-label" in lines and "samples/s: 312" in lines
    else:
        assert max(len(line.rstrip()) for line in lines) <= width, out
        header = next(line for line in lines if "workload" in line)
        assert header.split() == ["workload", "prec", "samples/s", "note"]  # headers never broken
        # folded cells keep every character (folding interleaves them with their neighbours' lines)
        shown = sum(len(re.sub(r"\s", "", line)) for line in lines if set(line.strip()) != {"─"})
        given = ["suite t"] + [c.header for c in COLS] + [cell for row in ROWS for cell in row]
        assert shown == sum(len(re.sub(r"\s", "", text)) for text in given), out


def test_plain_layout_is_aligned_wrapped_or_blocks():
    lines = plain_lines(COLS, ROWS)
    assert lines[0].split() == ["workload", "prec", "samples/s", "note"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[3].endswith("not comparable (capped at 30 steps)")
    assert fit_layout(COLS, ROWS, 200) == (COLS, ROWS, [len(ROWS[1][0]), 4, 9, len(ROWS[1][3])])
    # too wide for 40 columns: still a table, the widest cells wrapped between words, nothing lost
    cols, rows, widths = fit_layout(COLS, ROWS, 40)
    wrapped = plain_lines(cols, rows, widths)
    assert wrapped[0].split() == ["workload", "prec", "samples/s", "note"] and max(map(len, wrapped)) <= 40
    assert wrapped[3].split()[1:3] == ["fp16", "312"], wrapped  # the row's short cells on its first line
    assert sorted(re.sub(r"\s", "", "".join(wrapped[3:]))) == sorted(re.sub(r"\s", "", "".join(ROWS[1])))
    assert all(any(word in line for line in wrapped) for word in ROWS[1][3].split())  # no word folded
    # not even the headers fit: every row a block of key: value lines
    assert fit_layout(COLS, ROWS, 20) is None
    blocks = vertical_lines(COLS, ROWS)
    assert blocks[:3] == ["workload:  digits", "prec:      fp32", "samples/s: 18,011"]  # empty note left out
    assert "" in blocks and "note:      not comparable (capped at 30 steps)" in blocks


def test_spare_columns_go_before_blocks():
    cols = [Col("run_id"), Col("workload", spare=True), Col("steps", "right")]
    rows = [["digits-fp32-native-s0-886fc453", "digits", "300"]]
    for terminal in (True, False):
        buf = io.StringIO()
        print_table(Console(file=buf, width=40, force_terminal=terminal, color_system=None), cols, rows)
        assert buf.getvalue().split()[:2] == ["run_id", "steps"], buf.getvalue()


@pytest.mark.parametrize("text, width, lines", [
    ("digits/torch/native/bf16", 13, ["digits/torch/", "native/bf16"]),       # after a path's slashes
    ("energy_j_per_sample", 11, ["energy_j_", "per_sample"]),                 # after underscores
    ("bf16 (not accelerated)", 12, ["bf16 (not", "accelerated)"]),            # at spaces, dropped there
    ("5,050 (5,000–5,100)", 8, ["5,050", "(5,000–", "5,100)"]),               # after a range's dash
    ("-30.0% 1.5e-05", 7, ["-30.0%", "1.5e-05"]),                             # never inside a number
    ("  parity.final_metric (advisory)", 22, ["  parity.final_metric", "(advisory)"]),  # the indent kept
    ("abcdefghij", 4, ["abcd", "efgh", "ij"]),                                # a word longer than a line: folded
    ("two\nlines", 20, ["two", "lines"]),
])
def test_cells_wrap_between_words_and_after_separators(text, width, lines):
    assert wrap_cell(text, width) == lines


def test_whole_columns_are_never_wrapped():
    cols = [Col("run_id", whole=True), Col("note")]
    rows = [["digits-fp32-native-s0-886fc453", "bf16 not accelerated on cpu: 0.09x fp32"]]
    _, _, widths = fit_layout(cols, rows, 50)
    assert widths[0] == len(rows[0][0]) and sum(widths) + 2 <= 50
    assert fit_layout(cols, rows, 36) is None  # the note cannot be narrower than its header and longest word


def _synthetic_pair(root: Path) -> tuple[Path, Path]:
    """Two results folders of one suite, the candidate 30% slower (nothing trained)."""
    from factories import completed, plan, write_results

    specs = plan({"name": "logs", "precisions": ["fp32", "bf16"], "seeds": [0, 1, 2],
                  "workloads": [{"workload": "digits"}, {"workload": "underflow"}]})
    baseline, candidate = (
        write_results(root / name, [completed(s, final_metric=0.9 + 0.01 * s.seed,
                                              samples_per_s=5000 * speed * (1 + 0.01 * s.seed)) for s in specs],
                      suite="logs")
        for name, speed in (("baseline", 1.0), ("candidate", 0.7)))
    return baseline, candidate


def _table_lines(out: str, headers: list[str]) -> list[str]:
    """The table in ``out`` whose header line names ``headers``: that line, its dashes and every line
    after them (rows, then what follows the table); a stacked form (``workload: digits``) fails."""
    lines = out.splitlines()
    top = next((i for i, line in enumerate(lines) if line.split() == headers), None)
    assert top is not None, out  # a header line, so a table, not key: value blocks
    assert set(lines[top + 1].replace(" ", "")) == {"-"}, out
    assert not any(line.startswith(f"{headers[0]}:") for line in lines), out  # a block's first line
    return lines[top:]


def test_piped_compare_at_80_columns_is_a_table(tmp_path, here):
    """`COLUMNS=80 ampcert compare A B | cat`: a table with a row a line or two, never wider than 80."""
    from ampcert import gate

    baseline, candidate = _synthetic_pair(tmp_path)
    proc = here("compare", baseline, candidate, env={"COLUMNS": "80"})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the candidate regressed
    table = _table_lines(proc.stdout, ["subject", "metric", "baseline", "candidate", "change", "status"])
    rows = gate.table_rows(session.compare(baseline, candidate))
    body = table[2:2 + next(i for i, line in enumerate(table[2:]) if line.startswith(("n: ", "tests: ")))]
    assert all(len(line) <= 80 for line in table[:2] + body), proc.stdout
    assert len(body) <= 2 * len(rows), proc.stdout  # one row, one or two lines
    # each row's first line: the subject's start, its metric and change, its status whole
    firsts = [line for line in body if line.split()[-1] in {"OK", "REGRESSION", "IMPROVED", "N/A", "NOISY"}]
    assert len(firsts) == len(rows), proc.stdout
    for line, row in zip(firsts, rows, strict=True):
        subject, metric, *_, status = line.split()
        assert row["subject"].startswith(subject) and (metric, status) == (row["metric"], row["status"]), line
        assert row["change"] in line, line
    # wide enough, each row is one line with every column
    wide = here("compare", baseline, candidate, env={"COLUMNS": "200"})
    assert _table_lines(wide.stdout, ["subject", "metric", "baseline", "candidate", "n", "change", "limit",
                                      "evidence", "status"])


def test_piped_plan_screen_and_summary_at_80_columns_are_tables(tmp_path):
    """The capacity plan, the FP8 screen and the run summary (two backends: 12 columns when wide)
    stay tables in an 80-column log: shorter headers, spare columns left out, long cells wrapped."""
    from ampcert.report import summary
    from ampcert.results import load

    baseline, _ = _synthetic_pair(tmp_path)

    def piped(show) -> str:
        buf = io.StringIO()
        show(Console(file=buf, width=80, force_terminal=False))
        return buf.getvalue()

    cap = session.capacity(baseline, 1_000_000)
    out = piped(lambda con: views.print_capacity(con, cap))
    table = _table_lines(out, ["workload", "prec", "samples/s", "wall", "kWh", "cost", "USD", "saved"])
    assert all(len(line) <= 80 for line in table if not line.startswith("saved: ")), out
    assert len(table) <= 2 + 3 * len(cap.rows) + 1, out

    layer = {"in_features": 512, "out_features": 64, "converted": False, "verdict": "safe",
             "rel_error_vs_bf16": 0.0397, "underflow": {"input": 0.0, "weight": 0.0, "grad_output": 0.0},
             "amax": {"input": [0.82], "weight": [0.0447], "grad_output": [0.0024]},
             "reason": "first or last Linear layer (kept in high precision by default)",
             "why": "output 0.0397 from bf16's; underflow <= 0.00%"}
    layers = [dict(layer, name=name) for name in ("blocks.0.attn.qkv", "blocks.0.mlp.fc", "head")]
    out = piped(lambda con: views.print_fp8_layers(con, layers))
    table = _table_lines(out, ["layer", "fp8", "verdict", "rel", "err", "why"])
    assert all(len(line) <= 80 for line in table[:-1]) and len(table) <= 2 + 4 * len(layers) + 1, out
    assert all(f"{name}  " in out for name in ("blocks.0.attn.qkv", "blocks.0.mlp.fc", "head")), out

    s = summary.build(load(baseline))
    s["groups"] += [dict(g, backend="jax", amp="ampcert") for g in s["groups"]]
    out = piped(lambda con: views.print_summary(con, SimpleNamespace(runs=[]), s))
    table = _table_lines(out, ["workload", "backend", "amp", "prec", "runs", "metric", "samples/s", "speedup",
                               "accel"])
    rows = table[2:2 + len(s["groups"])]
    assert all(len(line) <= 80 for line in rows) and [line.split()[:3] for line in rows] == [
        [g["workload"], g["backend"], g["amp"]] for g in s["groups"]], out


def test_terminal_table_end_to_end_in_a_pty(folder):
    pty = pytest.importorskip("pty")
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in cli_env().items() if k not in ("COLUMNS", "NO_COLOR", "FORCE_COLOR")}
    # `ampcert` on PATH as the warm CLI installs it: the command runs forked warm, on this
    # pty as its stdout and stderr (the terminal it measures), in this environment
    proc = subprocess.Popen([str(warm_cli.bin_dir() / "ampcert"), "report", str(folder.root)], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(master)
    out = ANSI.sub("", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()))
    assert proc.returncode == 0, out
    assert "…" not in out and "─" in out  # a terminal table (header rule), nothing cut
    assert max(len(line.rstrip()) for line in out.splitlines() if "wrote " not in line) <= 80, out


# --------------------------------------------------------------------------- --json


def test_every_table_command_prints_json(folder, tmp_path, here):
    expect = {
        "report": (["report", folder.root], {"results", "summary"}),
        "certify": (["certify", folder.root], {"rules", "status", "subjects", "verdicts"}),
        "compare": (["compare", folder.root, folder.root], {"status", "comparisons"}),
        "plan": (["plan", folder.root, "--target-samples", "1000"], {"rows", "target_samples"}),
        "check": (["check", folder.root], {"rules", "logs", "violations"}),
        "list": (["list"], {"workloads", "suites", "precisions", "policies", "rules"}),
        "env": (["env"], {"python", "cpu", "gpu", "packages"}),
        "dry-run": (["run", folder.suite, "--dry-run"], {"suite", "runs", "capabilities"}),
        "merge": (["merge", tmp_path / "merged", folder.root], {"results", "summary", "merged"}),
    }
    printed = {}
    for name, (args, keys) in expect.items():
        proc = here(*args, "--json", cwd=tmp_path)
        assert proc.returncode in (0, 1), (name, proc.stdout + proc.stderr)
        assert "warning" not in proc.stderr, (name, proc.stderr)
        printed[name] = data = json.loads(proc.stdout)  # stdout is the JSON and nothing else
        assert keys <= set(data), (name, sorted(data))
        assert not ANSI.search(proc.stdout)
    assert not (tmp_path / "-").exists()
    assert printed["report"]["summary"] == json.loads((folder.root / "summary.json").read_text())


def _night(root: Path, index: int, level: float) -> Path:
    """A synthetic night of suite `nightly` for the history gate (as tests/history builds them)."""
    from factories import completed, plan, write_results

    specs = plan({"name": "nightly", "precisions": ["fp32"], "seeds": [0, 1], "workloads": [{"workload": "digits"}]})
    folder = write_results(root / f"night-{index:02d}",
                           [completed(s, final_metric=0.95, samples_per_s=5000 * level * (1 + 0.01 * (-1) ** index))
                            for s in specs], suite="nightly")
    data = json.loads((folder / "plan.json").read_text())
    data |= {"created_at": f"2026-10-01T{index:02d}:00:00+00:00",
             "environment": {"hostname": "ci-runner-1", "cpu": {"model": "Test CPU"}}}
    (folder / "plan.json").write_text(json.dumps(data))
    return folder


@pytest.fixture(scope="module")
def nights(tmp_path_factory) -> tuple[Path, str]:
    """A history store of 8 nights and a 9th, new night: (new night, store)."""
    root = tmp_path_factory.mktemp("nights")
    folders = [_night(root, i, 1.0) for i in range(9)]
    store = str(root / "h.sqlite")
    session.history_add(folders[:-1], store=store)
    return folders[-1], store


def _json_commands(f: Folder, nights: tuple[Path, str]) -> dict[str, list]:
    """compare, gate, plan (whose --json took a FILE) and one command whose --json was always a flag."""
    new, store = nights
    return {"compare": ["compare", f.root, f.root], "gate": ["gate", new, "--store", store],
            "plan": ["plan", f.root, "--target-samples", "1000"], "list": ["list"]}


def test_json_out_writes_the_json_that_json_prints(folder, nights, tmp_path, here):
    for name, args in _json_commands(folder, nights).items():
        out = tmp_path / f"{name}.json"
        proc = here(*args, "--json-out", out, cwd=tmp_path)
        assert proc.returncode == 0, (name, proc.stdout + proc.stderr)
        assert f"wrote {out}" in proc.stdout and not proc.stderr, (name, proc.stdout + proc.stderr)
        assert not proc.stdout.lstrip().startswith("{")  # the table, not the JSON, on stdout
        written = json.loads(out.read_text())
        # --json and --json-out together: the same data on stdout and in the file, messages on stderr
        both = tmp_path / f"{name}-both.json"
        proc = here(*args, "--json", "--json-out", both, cwd=tmp_path)
        assert proc.returncode == 0, (name, proc.stdout + proc.stderr)
        assert json.loads(proc.stdout) == json.loads(both.read_text()), name
        assert f"wrote {both}" in proc.stderr
        assert written.keys() == json.loads(proc.stdout).keys(), name
    assert not (tmp_path / "-").exists()


def test_the_old_json_file_spelling_is_a_usage_error(folder, nights, tmp_path, here):
    """`--json FILE` (compare, gate and plan until their release of warnings passed) is one
    usage line and exit 2 now, writing nothing: --json is a flag, --json-out takes the file."""
    for name, args in _json_commands(folder, nights).items():
        if name == "list":
            continue
        out = tmp_path / f"{name}-old.json"
        proc = here(*args, "--json", out, cwd=tmp_path)
        assert proc.returncode == 2, (name, proc.stdout + proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, (name, proc.stderr)
        assert not out.exists() and not proc.stdout.strip(), name
        proc = here(*args, f"--json={out}", cwd=tmp_path)
        assert proc.returncode == 2 and not out.exists(), (name, proc.stdout + proc.stderr)


def test_a_bad_argument_is_named_as_the_option_that_fed_it(monkeypatch, capsys, folder):
    def main(*args: object) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["ampcert", *map(str, args)])
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            cli.main()
        return exit_.value.code, capsys.readouterr().err

    def bad(param: str, value: object = None):
        def raise_(*args, **kwargs):
            raise BadArgument(param, "not what it should be", value)
        return raise_

    # a parameter spelled as its option (the default), one fed by an argument, one by another option
    monkeypatch.setattr(session, "capacity", bad("price_per_gpu_hour"))
    assert main("plan", "r", "--target-samples", "5") == \
        (2, "ampcert: error: --price-per-gpu-hour: not what it should be\n")
    monkeypatch.setattr(session, "capacity", bad("source", "r"))
    assert main("plan", "r", "--target-samples", "5") == (2, "ampcert: error: REPORT r: not what it should be\n")
    monkeypatch.setattr(session, "plan_resume", bad("folder", "old"))
    assert main("run", "--resume", "old", "--dry-run") == (2, "ampcert: error: --resume old: not what it should be\n")
    # and as the session raises it: the folder of --resume
    monkeypatch.undo()
    code, err = main("run", "--resume", folder.root.parent / "nope")
    assert code == 2 and err.startswith("ampcert: error: --resume ") and "results folder not found" in err, err


def test_one_output_object_per_invocation():
    """No console lives in the module: each invocation makes its own (for its streams)."""
    from rich.console import Console as RichConsole

    assert not [name for name, value in vars(cli).items() if isinstance(value, (RichConsole, Output))]
    from typer.testing import CliRunner

    first = CliRunner().invoke(cli.app, ["list", "--json"])
    second = CliRunner().invoke(cli.app, ["list"])
    assert first.exit_code == second.exit_code == 0, first.output + second.output
    assert json.loads(first.stdout)["workloads"] and "workloads" in second.stdout
    dash = CliRunner().invoke(cli.app, ["list", "--json-out", "-"])  # stdout, as --json; no file named '-'
    assert dash.exit_code == 0 and json.loads(dash.stdout) == json.loads(first.stdout)


# --------------------------------------------------------------------------- --help


@pytest.mark.parametrize("args, flags, choices", [
    (["run"], ["--dry-run", "--json", "--retry-failed", "--slurm-local"], ["<local|ray|slurm>"]),
    (["screen"], ["--first-last", "--json"], ["<fp8|mxfp8>", "<tensorwise|rowwise|rowwise_with_gw_hp>", "<cpu|cuda>"]),
    (["audit"], ["--json"], ["<torch|jax>", "<cpu|cuda>", "<bf16|fp16>"]),
    (["history", "show"], ["--json"], []),
    ([], ["--version"], []),
])
def test_help_lists_choices_and_no_value_after_a_flag(args, flags, choices):
    from typer.testing import CliRunner

    out = CliRunner().invoke(cli.app, [*args, "--help"], env={"COLUMNS": "200"}).stdout
    assert "<bool>" not in out, out
    for flag in [*flags, "--help"]:
        assert re.search(rf"{flag}\s+[A-Za-z]", out) and not re.search(rf"{flag}\s+<", out), (flag, out)
    for listed in choices:
        assert listed in out, (listed, out)


def test_the_choices_are_the_engines_own():
    from ampcert.amp.fp8_recipes import RECIPES
    from ampcert.cli.options import Executor, Fp8Precision, Fp8Recipe
    from ampcert.runner.fleet import EXECUTORS

    assert [e.value for e in Executor] == list(EXECUTORS)
    assert [r.value for r in Fp8Recipe] == [name for name, r in RECIPES.items() if r.precision == "fp8"]
    assert {p.value for p in Fp8Precision} == {r.precision for r in RECIPES.values()}


# --------------------------------------------------------------------------- colour


def test_no_color_wins_over_force_color(folder, here):
    forced = here("compare", folder.root, folder.root, env={"FORCE_COLOR": "1", "COLUMNS": "200"})
    assert ANSI.search(forced.stdout), "FORCE_COLOR alone colours (or this test proves nothing)"
    for args in (["compare", folder.root, folder.root], ["report", folder.root], ["list"],
                 ["certify", folder.root]):
        proc = here(*args, env={"NO_COLOR": "1", "FORCE_COLOR": "1"})
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        assert not ANSI.search(proc.stdout + proc.stderr), (args, proc.stdout)
        assert not BOX & set(proc.stdout)  # and a pipe is not taken for a terminal


# --------------------------------------------------------------------------- list, show


def test_list_names_the_shipped_policies_and_rule_packs(here):
    proc = here("list")
    assert proc.returncode == 0, proc.stderr
    for name in resources.shipped_names("policy") + resources.shipped_names("rules"):
        assert name in proc.stdout
    data = json.loads(here("list", "--json").stdout)
    assert data["policies"] == list(resources.shipped_names("policy"))
    assert data["rules"] == list(resources.shipped_names("rules"))


def test_show_prints_the_shipped_text_exactly(tmp_path, monkeypatch, capsysbinary):
    """Every shipped file through the entry point in this process (its bytes on stdout, nothing
    on stderr); the first of each kind also through a process of its own, its stdout a pipe."""
    for kind in resources.KINDS:
        for i, name in enumerate(resources.shipped_names(kind)):
            expected = resources.shipped_path(kind, name).read_bytes()
            monkeypatch.setattr(sys, "argv", ["ampcert", "show", kind, name])
            capsysbinary.readouterr()
            with pytest.raises(SystemExit) as exit_:
                cli.main()
            out, err = capsysbinary.readouterr()
            assert exit_.value.code == 0 and not err, err
            assert out == expected, (kind, name)
            if i == 0:
                proc = warm_cli("show", kind, name, cwd=tmp_path, text=False, timeout=60)
                assert proc.returncode == 0 and not proc.stderr, proc.stderr
                assert proc.stdout == expected, (kind, name)


@pytest.mark.parametrize("args, fragments", [
    (["show"], ["KIND and NAME", "policy", "rules"]),
    (["show", "policy"], ["show policy", "torch-cpu"]),
    (["show", "policy", "nope"], ["'nope'", "torch-cpu", "torch-cuda"]),
    (["show", "rule", "default"], ["'rule'", "policy", "rules"]),
    (["show", "rules", "default", "extra"], ["show", "extra"]),
    (["show", "--bogus"], ["--bogus"]),
    (["compare", "a", "b", "--json-out"], ["--json-out"]),
    (["audit", "--device", "tpu"], ["audit", "--device", "'tpu'", "'cpu'", "'cuda'"]),
    (["audit", "--dtype", "fp32"], ["audit", "--dtype", "'fp32'", "'bf16'", "'fp16'"]),
    (["screen", "digits", "--device", "tpu"], ["screen", "--device", "'tpu'"]),
    (["plan", "a", "--target-samples", "ten"], ["--target-samples"]),
    (["report", "--json"], ["report", "Missing argument", "results"]),
    (["nosuchcommand"], ["nosuchcommand"]),
])
def test_bad_input_is_one_line_exit_2(args, fragments, here):
    assert_one_line_error(here(*args), *fragments)


def test_json_to_an_unwritable_file_is_one_line(folder, tmp_path, here):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert_one_line_error(here("compare", folder.root, folder.root, "--json-out", blocker / "gate.json"),
                          "cannot write")
    assert_one_line_error(here("plan", folder.root, "--target-samples", "10", "--json-out", blocker / "plan.json"),
                          "cannot write")
    assert_one_line_error(here("report", folder.root, "--json-out", blocker / "summary.json"), "cannot write",
                          "summary.json")


def test_keygen_sign_verify_and_the_history_commands_print_json(folder, nights, tmp_path, here):
    """The commands without a table print their data as JSON too (--json, --json-out FILE)."""
    signed = tmp_path / "signed"
    shutil.copytree(folder.signed, signed)
    proc = here("keygen", tmp_path / "k", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    keys = json.loads(proc.stdout)
    assert keys["public_key"] == f"{tmp_path / 'k'}.pub" and Path(keys["private_key"]).is_file() and keys["keyid"]
    proc = here("sign", signed, "--key", tmp_path / "k", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    envelope = Path(json.loads(proc.stdout)["envelope"])
    assert envelope.is_file() and "signed:" in proc.stderr  # the message on stderr, the data on stdout
    out = tmp_path / "verified.json"
    proc = here("verify", envelope, "--pubkey", f"{tmp_path / 'k'}.pub", "--json", "--json-out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verified = json.loads(proc.stdout)
    assert verified == json.loads(out.read_text())
    assert verified["verified"] is True and verified["keyid"] == keys["keyid"]
    assert {s["name"] for s in verified["subjects"]} == {"report.json", "report.html"}
    (signed / "report.html").write_text("tampered")
    proc = here("verify", envelope, "--pubkey", f"{tmp_path / 'k'}.pub", "--json", cwd=tmp_path)
    assert proc.returncode == 1 and "NOT VERIFIED" in proc.stderr
    assert json.loads(proc.stdout)["verified"] is False and "report.html" in json.loads(proc.stdout)["reason"]

    night, _ = nights
    store = str(tmp_path / "h.sqlite")
    proc = here("history", "add", night, "--store", store, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == [{"folder": str(night), "added": True}]
    proc = here("history", "add", night, "--store", store, "--json", cwd=tmp_path)
    assert json.loads(proc.stdout) == [{"folder": str(night), "added": False}]
    proc = here("history", "plot", tmp_path / "p.svg", "--store", store, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == {"svg": str(tmp_path / "p.svg"), "metric": "samples_per_s"}
    assert (tmp_path / "p.svg").read_text().startswith("<svg ")
