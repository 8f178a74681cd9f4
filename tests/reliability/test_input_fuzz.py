"""Property-based tests: random mutations of valid input files (suites, torch and
JAX op policies, rule packs, MLLOG compliance rules, MLLOG logs) give either a
valid result (a run plan, a policy, a rule pack, a list of violations) or one
line naming the file (UserError, exit code 2), never a traceback, a hang or a
write to the file system.

The parsers run in-process under hypothesis (fast enough for hundreds of
inputs); a few hand-picked inputs that used to crash or hang go through the
real CLI to prove the exit-2, no-traceback path end to end.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import yaml
from conftest import REPO, cli_env
from rel_lab import start_early

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ampcert.amp.policy import PolicyError, load_policy  # noqa: E402
from ampcert.certify import evaluate  # noqa: E402
from ampcert.certify.compliance import check_log, load_compliance_rules  # noqa: E402
from ampcert.certify.rules import load_rules  # noqa: E402
from ampcert.errors import UserError  # noqa: E402
from ampcert.results import EvalPoint, RunResult  # noqa: E402
from ampcert.runner.planning import dump_plan_table  # noqa: E402
from ampcert.spec import apply_capabilities, expand, load_suite, parse_suite  # noqa: E402

EXAMPLES = int(os.environ.get("AMPCERT_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
HANG_S = 10  # one input parsed for longer than this is a hang
COUNTS = {"tried": 0, "accepted": 0, "rejected": 0, "tracebacks": 0}

# --------------------------------------------------------------------------- guards

_WRITES: list[str] | None = None  # set while a parser runs: every write it attempts
_THREAD: int | None = None  # the parser's thread (the rel_lab runs write logs from others meanwhile)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITE_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.truncate", "os.symlink", "os.link",
                 "os.chmod", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"}


def _audit(event: str, args: tuple) -> None:
    if _WRITES is None or threading.get_ident() != _THREAD:
        return
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing and "__pycache__" not in str(path):
            _WRITES.append(f"open {path!r} {mode or flags}")
    elif event in _WRITE_EVENTS:
        _WRITES.append(f"{event} {args[0]!r}")


sys.addaudithook(_audit)


class Hang(Exception):
    pass


@contextlib.contextmanager
def guarded(what: str):
    """Run a parser: no write, no hang; a UserError/PolicyError must be one line."""
    global _WRITES, _THREAD

    def alarm(*_):
        raise Hang(f"{what}: still parsing after {HANG_S} s")

    COUNTS["tried"] += 1
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    _WRITES, _THREAD = [], threading.get_ident()
    try:
        yield
        COUNTS["accepted"] += 1
    except (UserError, PolicyError) as exc:
        COUNTS["rejected"] += 1
        message = str(exc)
        assert message and "\n" not in message and "\r" not in message, f"not one line: {message!r}"
        assert "Traceback" not in message
    except Hang:
        COUNTS["tracebacks"] += 1
        raise
    except Exception:
        COUNTS["tracebacks"] += 1  # anything else would reach the user as a traceback
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        writes, _WRITES = _WRITES, None
        assert not writes, f"{what} wrote to the file system: {writes}"


@pytest.fixture(scope="module", autouse=True)
def report_counts(request, tmp_path_factory):
    start_early(request, tmp_path_factory)
    yield
    print(f"\nfuzz: {COUNTS['tried']} mutated inputs tried, {COUNTS['accepted']} accepted, "
          f"{COUNTS['rejected']} rejected with one line, {COUNTS['tracebacks']} tracebacks/hangs")


def test_the_guard_sees_writes(tmp_path):
    with pytest.raises(AssertionError, match="wrote to the file system"):
        with guarded("a parser that writes"):
            (tmp_path / "x").write_text("x")
    COUNTS["tried"] -= 1  # not a mutated input
    COUNTS["accepted"] -= 1


# --------------------------------------------------------------------------- mutations

NASTY_STRINGS = [
    "", " ", "\n", "a\nb", "\t", "fp64", "fp16", "bf16", "digits", "gpt", "none", "null", "~", "-1", "0", "1e999",
    ".nan", "-.inf", "2024-13-45", "0x", "*", "&a", "{", "[", ":", "- ", "---", "...", "!!python/object:os.system",
    "../../../../etc/passwd", "/dev/null", "/nonexistent/file.yaml", "default", "procurement", "torch-cpu",
    "torch-cuda", "jax", "fault_workloads:raising", "fault_workloads:not_a_workload", "nosuch:thing", "é\u202e\u0000",
    "x" * 300, "<script>", "{{ 7*7 }}", "%s%n", "\ufeff", "INTERVAL_START", "success", "metadata.status",
]
TOKENS = ["\n", ": ", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "!!int ", "!!bool ", "!!timestamp ",
          "!!binary ", "!!set ", "!!python/object/apply:os.system ['true'] ", "? ", "|\n", ">\n", "\t", "---\n",
          "...\n", "%YAML 1.1\n", "'", '"', "#", "\x00", "\ufeff", "2024-13-45", "9" * 5000, "1e999", "-",
          "0o8", "<<: *a\n", "null", "~", "true"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.sampled_from(NASTY_STRINGS),
)


@functools.cache  # one strategy per key set, not one per draw (hypothesis validates each anew)
def _values(keys: tuple[str, ...]):
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.sampled_from(keys) | st.text(max_size=6), inner, max_size=3),
                        max_leaves=6)


def values(keys: list[str]):
    return _values(tuple(keys))


def _slots(node, out=None):
    """(container, key) for every item of every mapping and sequence in ``node``."""
    out = [] if out is None else out
    if isinstance(node, dict):
        for k in list(node):
            out.append((node, k))
            _slots(node[k], out)
    elif isinstance(node, list):
        for i in range(len(node)):
            out.append((node, i))
            _slots(node[i], out)
    return out


def _keys(node, out=None) -> list[str]:
    out = [] if out is None else out
    if isinstance(node, dict):
        out += [str(k) for k in node]
        for v in node.values():
            _keys(v, out)
    elif isinstance(node, list):
        for v in node:
            _keys(v, out)
    return out


@st.composite
def mutated_doc(draw, seeds: list):
    doc = copy.deepcopy(draw(st.sampled_from(seeds)))
    keys = sorted(set(_keys(doc))) or ["x"]
    for _ in range(draw(st.integers(1, 3))):
        slots = _slots(doc)
        if not slots:
            doc = draw(values(keys))
            continue
        container, key = draw(st.sampled_from(slots))
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "dup", "wrap"]))
        if op == "replace":
            container[key] = draw(values(keys))
        elif op == "delete":
            del container[key]
        elif op == "add":
            if isinstance(container, dict):
                container[draw(st.sampled_from(keys) | st.text(max_size=6))] = draw(values(keys))
            else:
                container.insert(key, draw(values(keys)))
        elif op == "dup":
            if isinstance(container, list):
                container.append(copy.deepcopy(container[key]))
            else:
                container[str(key) + draw(st.sampled_from(["", "s", "_"]))] = copy.deepcopy(container[key])
        else:
            container[key] = [container[key]] if draw(st.booleans()) else {"x": container[key]}
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


@st.composite
def mutated_text(draw, texts: list[str]):
    text = draw(st.sampled_from(texts))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "insert", "delete", "flip", "dupline", "truncate"]))
        if op == "insert":
            text = text[:pos] + draw(st.sampled_from(TOKENS) | st.text(max_size=4)) + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 40)):]
        elif op == "flip" and pos < len(text):
            text = text[:pos] + chr((ord(text[pos]) ^ (1 << draw(st.integers(0, 6)))) or 32) + text[pos + 1:]
        elif op == "dupline":
            lines = text.splitlines(keepends=True)
            if lines:
                i = draw(st.integers(0, len(lines) - 1))
                lines.insert(i, lines[i])
                text = "".join(lines)
        else:
            text = text[:pos]
    return text


def mutations(texts: list[str]):
    docs = []
    for t in texts:
        with contextlib.suppress(yaml.YAMLError):
            docs.append(yaml.safe_load(t))
    return st.one_of(mutated_doc(docs), mutated_text(texts))


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="ampcert-fuzz-") as d:
        yield Path(d)


def _assert_untouched(folder: Path, expected: set[str]) -> None:
    assert {p.name for p in folder.iterdir()} <= expected, "a parser created files beside its input"


# --------------------------------------------------------------------------- suites

SUITE_SEEDS = [(REPO / "suites" / n).read_text() for n in ("smoke.yaml", "numerics.yaml", "vision.yaml")] + [
    """
name: faults
precisions: [fp32, bf16]
seeds: [0, 1]
train: {steps: 6, eval_every: 3}
timeout_s: 60
unaccelerated: cap
unaccelerated_max_steps: 3
telemetry: {rate_hz: 5}
workloads:
  - workload: digits
    params: {}
  - workload: "fault_workloads:raising"
    id: raising
    seeds: [3]
    loss_scaling: false
    train: {target: 0.5, max_steps: 8, eval_every: 4}
""",
    """
name: policied
amp: ampcert
policy: torch-cpu
device: cpu
precisions: [bf16]
certify: procurement
workloads: [{workload: digits}]
""",
]
CAPS = {"fp32": {"accelerated": True, "note": "fp32"},
        "bf16": {"accelerated": False, "note": "bf16 not accelerated"},
        "fp16": {"accelerated": False, "note": "fp16 not accelerated"}}


@FUZZ
@given(text=mutations(SUITE_SEEDS))
def test_mutated_suites_plan_or_fail_in_one_line(scratch, text):
    path = _write(scratch, "suite.yaml", text)
    with guarded(f"suite {text[:200]!r}"):
        suite = load_suite(path)
        runs = apply_capabilities(suite, expand(suite, "cpu"), CAPS)
        assert runs and dump_plan_table(runs)
        assert len({r.run_id for r in runs}) == len(runs), "two runs of one plan share an id"
    _assert_untouched(scratch, {"suite.yaml"})


def test_suite_parser_on_non_mapping_and_odd_python_values():
    for data in (None, [], "text", 3, {"name": "t", "workloads": [{"workload": "digits", "params": {"x": {1, 2}}}]},
                 {"name": "t", "workloads": [None]}, {"name": "t", "workloads": "digits"}):
        with guarded(f"suite data {data!r}"):
            parse_suite(data, "suite.yaml")


# --------------------------------------------------------------------------- policies

POLICY_SEEDS = [(REPO / "configs" / "policies" / n).read_text() for n in ("torch-cpu.yaml", "jax.yaml")] + [
    p.read_text() for p in sorted((REPO / "configs" / "policies" / "examples").glob("*.yaml"))
] + ["""
name: small
extends: torch-cuda
overrides: {softmax: fp32, layer_norm: lower_precision, cumsum: none}
uncast_if_mixed: [tensordot]
""", """
name: small-jax
extends: jax
framework: jax
overrides: {exp: none}
accumulate_fp32: [dot_general]
"""]


@FUZZ
@given(text=mutations(POLICY_SEEDS))
def test_mutated_policies_load_or_fail_in_one_line(scratch, text):
    path = _write(scratch, "policy.yaml", text)
    with guarded(f"policy {text[:200]!r}"):
        policy = load_policy(path)
        assert policy.to_dict()["families"] is not None and policy.effective_sha256
    _assert_untouched(scratch, {"suite.yaml", "policy.yaml"})


# --------------------------------------------------------------------------- rule packs

RULE_SEEDS = [(REPO / "configs" / "rules" / n).read_text() for n in ("default.yaml", "procurement.yaml")]


def _results() -> list[RunResult]:
    """A small, plausible result set (fp32 and bf16, two seeds and a repeat) to evaluate mutated packs on."""
    suite = parse_suite({"name": "t", "precisions": ["fp32", "bf16"], "seeds": [0, 1],
                         "train": {"steps": 4, "eval_every": 2}, "certify": "default",
                         "workloads": [{"workload": "digits"}]}, "t.yaml")
    out = []
    pack = load_rules("default")
    for i, spec in enumerate(expand(suite, "cpu", min_seeds=pack.min_seeds(), repeats=pack.repeats())):
        low = spec.precision != "fp32"
        out.append(RunResult(
            run_id=spec.run_id, spec=spec, status="completed", steps=4, train_samples=256, metric="accuracy",
            higher_is_better=True, final_metric=0.5 + 0.01 * spec.seed - 0.005 * low,
            loss=[2.0, 1.5, 1.2, 1.0 + 0.01 * spec.seed], samples_per_s=1000.0 * (1 + 0.1 * low),
            evals=[EvalPoint(step=2, samples=128, train_time_s=0.1, value=0.4),
                   EvalPoint(step=4, samples=256, train_time_s=0.2, value=0.5 + 0.01 * spec.seed)],
            weights_sha256=f"w{spec.precision}{spec.seed}", loss_scale=[65536.0] * 4 if low else None,
            skipped_steps=[] if low else None, accelerated=not low, target=0.45, target_reached=True,
            steps_to_target=4, samples_to_target=256 + 64 * (i % 2),
        ))
    return out


@FUZZ
@given(text=mutations(RULE_SEEDS))
def test_mutated_rule_packs_load_and_evaluate_or_fail_in_one_line(scratch, text):
    path = _write(scratch, "rules.yaml", text)
    results = _cached_results()
    with guarded(f"rules {text[:200]!r}"):
        pack = load_rules(path)
        pack.min_seeds(), pack.repeats()
        cert = evaluate(results, pack)
        json.dumps(cert.model_dump(mode="json"))


_RESULTS: list[RunResult] = []


def _cached_results() -> list[RunResult]:
    if not _RESULTS:
        _RESULTS.extend(_results())
    return _RESULTS


# --------------------------------------------------------------------------- MLLOG compliance

COMPLIANCE_SEEDS = [(REPO / "configs" / "rules" / "mllog.yaml").read_text()]
S, E, P = "INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"
GOOD_LOG = [("init_start", S, None, {}), ("submission_benchmark", P, "w", {}), ("seed", P, 0, {}),
            ("global_batch_size", P, 64, {}), ("precision", P, "bf16", {}), ("train_samples", P, 100, {}),
            ("eval_samples", P, 10, {}), ("init_stop", E, None, {}), ("run_start", S, None, {}),
            ("block_start", S, None, {}), ("block_stop", E, None, {}), ("eval_start", S, None, {}),
            ("eval_accuracy", P, 0.9, {"step": 3}), ("eval_stop", E, None, {}),
            ("run_stop", E, None, {"status": "success"})]


def _log_text(events) -> str:
    return "".join(":::MLLOG " + json.dumps({"namespace": "r", "time_ms": 1000 + i, "event_type": et, "key": k,
                                              "value": v, "metadata": m}) + "\n"
                   for i, (k, et, v, m) in enumerate(events))


@FUZZ
@given(text=mutations(COMPLIANCE_SEEDS))
def test_mutated_compliance_rules_load_and_check_or_fail_in_one_line(scratch, text):
    log = _write(scratch, "run.mllog", _log_text(GOOD_LOG))
    path = _write(scratch, "mllog-rules.yaml", text)
    with guarded(f"compliance rules {text[:200]!r}"):
        for v in check_log(log, load_compliance_rules(path)):
            assert "\n" not in str(v), f"violation spans lines: {str(v)!r}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.floats()
    | st.text(max_size=8) | st.sampled_from(NASTY_STRINGS),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=5)
LINE_GARBAGE = ["[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" + "}" * 3000, "9" * 5000, "1e999", "NaN",
                "-Infinity", '"\\ud800"', "\x00", "{}", "[]", "null", '{"key": 1}', '{"key": "x", "event_type": []}']


@st.composite
def mutated_log(draw):
    events = [list(e) for e in GOOD_LOG]
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "dup", "swap", "value", "meta", "key", "etype"]))
        i = draw(st.integers(0, len(events) - 1)) if events else 0
        if not events:
            break
        if op == "delete":
            events.pop(i)
        elif op == "dup":
            events.insert(i, list(events[i]))
        elif op == "swap":
            j = draw(st.integers(0, len(events) - 1))
            events[i], events[j] = events[j], events[i]
        elif op == "value":
            events[i][2] = draw(json_values)
        elif op == "meta":
            events[i][3] = draw(json_values)
        elif op == "key":
            events[i][0] = draw(st.sampled_from([e[0] for e in GOOD_LOG]) | st.text(max_size=6))
        else:
            events[i][1] = draw(st.sampled_from([S, E, P, "", "bogus"]))
    lines = _log_text(events).splitlines(keepends=True)
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(lines)))
        raw = ":::MLLOG " + draw(st.sampled_from(LINE_GARBAGE) | st.text(max_size=20)) + "\n"
        lines.insert(i, draw(st.sampled_from([raw, raw[:-1], raw[: len(raw) // 2] + "\n"])))
    return "".join(lines)


@FUZZ
@given(text=mutated_log())
def test_mutated_mllog_logs_give_violations_never_a_crash(scratch, text):
    log = _write(scratch, "run.mllog", text)
    rules = _default_compliance()
    with guarded(f"log {text[:200]!r}"):
        for v in check_log(log, rules):
            assert "\n" not in str(v) and v.line >= 0


def test_mllog_that_is_not_utf8_is_one_line(scratch):
    log = scratch / "binary.mllog"
    log.write_bytes(b":::MLLOG {\xff\xfe}\n")
    with guarded("binary log"):
        check_log(log, _default_compliance())


_DEFAULT_COMPLIANCE: list = []


def _default_compliance():
    if not _DEFAULT_COMPLIANCE:
        _DEFAULT_COMPLIANCE.append(load_compliance_rules())
    return _DEFAULT_COMPLIANCE[0]


# --------------------------------------------------------------------------- inputs that once crashed or hung

BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
                 + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)])


def _bomb(key_path: str, mapping_key: str) -> str:
    """A billion-laughs document whose anchors hide under ``mapping_key`` and whose ``key_path`` is the bomb."""
    anchors = "\n".join("  " + line for line in BOMB.splitlines())
    return f"{mapping_key}:\n{anchors}\n{key_path}: *a8\n"


KNOWN_BAD = {
    # suite files
    "suite-deep.yaml": ("suite", "name: t\nworkloads: " + "[" * 700 + "]" * 700 + "\n"),
    "suite-bomb.yaml": ("suite", _bomb("precisions", "params") + "name: t\nworkloads: [{workload: digits}]\n"),
    "suite-self-alias.yaml": ("suite", "name: t\nworkloads: &w [{workload: digits, params: {x: *w}}]\n"),
    "suite-date.yaml": ("suite", "name: t\ndescription: 2024-13-45\nworkloads: [{workload: digits}]\n"),
    "suite-badtag.yaml": ("suite", "name: t\nseeds: [!!int x]\nworkloads: [{workload: digits}]\n"),
    "suite-badbool.yaml": ("suite", "name: t\nworkloads: [{workload: digits, loss_scaling: !!bool maybe}]\n"),
    "suite-newline-label.yaml": ("suite", 'name: t\nworkloads: [{workload: "di\\ngits", precisions: [fp64]}]\n'),
    "suite-bigint.yaml": ("suite", "name: t\nseeds: [" + "9" * 5000 + "]\nworkloads: [{workload: digits}]\n"),
    # policies
    "policy-name-bomb.yaml": ("policy", _bomb("name", "description")),
    "policy-deep.yaml": ("policy", "name: p\nfamilies: " + "{a: " * 2000 + "1" + "}" * 2000 + "\n"),
    "policy-date.yaml": ("policy", "name: p\ndescription: 2024-02-30\nfamilies: {}\n"),
    # rule packs
    "rules-bomb.yaml": ("rules", _bomb("x", "description").replace("x: *a8", "name: r\nrules: [{id: a, check: *a8, measures: m}]")),
    "rules-deep.yaml": ("rules", "name: r\nrules: " + "[" * 700 + "]" * 700 + "\n"),
    "rules-badtag.yaml": ("rules", "name: r\nrules: [{id: a, check: speedup, measures: m, min_ratio: !!float x}]\n"),
    # compliance rules
    "mllog-rules-bomb.yaml": ("compliance", _bomb("order", "x-anchors").replace("x-anchors:", "name: c\nkeys: []\nvalues: []\nwithin: []\nz:")),
    "mllog-rules-date.yaml": ("compliance", "name: 2024-13-45\n"),
}


@pytest.mark.parametrize("name", sorted(KNOWN_BAD))
def test_inputs_that_used_to_crash_or_hang(scratch, name):
    kind, text = KNOWN_BAD[name]
    path = _write(scratch, name, text)
    with guarded(name):
        if kind == "suite":
            suite = load_suite(path)
            expand(suite, "cpu")
        elif kind == "policy":
            load_policy(path)
        elif kind == "rules":
            load_rules(path)
        else:
            load_compliance_rules(path)
    if kind == "suite":
        with pytest.raises(UserError, match=name.replace(".", r"\.")):
            load_suite(path)


# --------------------------------------------------------------------------- end to end

def _cli(args: list[str], cwd: Path, home: Path) -> subprocess.Popen:
    env = cli_env() | {"HOME": str(home), "TMPDIR": str(home), "MPLCONFIGDIR": str(home / "mpl")}
    return subprocess.Popen([sys.executable, "-m", "ampcert", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_cli_bad_inputs_are_one_line_exit_2_and_write_nothing(tmp_path):
    """Through the real CLI: exit 2, one line, no traceback, no file anywhere
    it could write (its working folder, HOME, TMPDIR) -- and a valid mutation
    still plans."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name in ("suite-bomb.yaml", "suite-date.yaml", "policy-name-bomb.yaml", "mllog-rules-date.yaml"):
        (inputs / name).write_text(KNOWN_BAD[name][1])
    (inputs / "uses-policy.yaml").write_text("name: t\namp: ampcert\npolicy: policy-name-bomb.yaml\n"
                                             "workloads: [{workload: digits}]\n")
    (inputs / "ok.yaml").write_text("name: ok\ndevice: cpu\nprecisions: [fp32]\nseeds: [3]\n"
                                    "train: {steps: 2, eval_every: 1}\nworkloads: [{workload: digits}]\n")
    (inputs / "deep.mllog").write_text(":::MLLOG " + "[" * 100000 + "\n")
    bigint = _log_text(GOOD_LOG).replace('"value": 0,', '"value": ' + "9" * 5000 + ",")
    (inputs / "bigint.mllog").write_text(bigint)
    before = {p.name: p.read_bytes() for p in inputs.iterdir()}
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    cases = {
        "suite-bomb": (["run", inputs / "suite-bomb.yaml", "--out", cwd / "out"], 2, "more than 100000 values"),
        "suite-date": (["run", inputs / "suite-date.yaml", "--dry-run"], 2, "month must be in 1..12"),
        "policy": (["run", inputs / "uses-policy.yaml", "--dry-run"], 2, "policy-name-bomb.yaml"),
        "mllog-rules": (["check", inputs / "deep.mllog", "--rules", inputs / "mllog-rules-date.yaml"], 2,
                        "mllog-rules-date.yaml"),
        "mllog": (["check", inputs / "deep.mllog", inputs / "bigint.mllog"], 1, None),
        "ok": (["run", inputs / "ok.yaml", "--dry-run"], 0, None),
    }
    results = {}
    names = list(cases)
    for pair in (names[i:i + 2] for i in range(0, len(names), 2)):  # two at a time: CI has two cores
        procs = {name: _cli([str(a) for a in cases[name][0]], cwd, home) for name in pair}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            results[name] = (proc.returncode, out, err)
    for name, (_, code, fragment) in cases.items():
        rc, out, err = results[name]
        assert rc == code, (name, out, err)
        assert "Traceback" not in out + err, (name, err)
        if code == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("ampcert: error: ") and fragment in lines[0], (name, err)
        COUNTS["tried"] += 1
    assert "suite ok: 1 runs on cpu" in results["ok"][1]
    assert list(cwd.iterdir()) == [] and [p for p in home.rglob("*") if p.is_file()] == []
    assert {p.name: p.read_bytes() for p in inputs.iterdir()} == before
