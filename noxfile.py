"""Developer sessions.

- `tests`, `lint` (the defaults): the CPU test suite on torch 2.13 and ruff.
- `jax_current`, `jax_oldest`: ampcert.amp.jax on JAX 0.12 (Python 3.12) and 0.10 (Python 3.11),
  each in a venv without torch; on the newest, the harness without torch too (`.ci/run` runs
  jax_current; the test command's venv has JAX 0.10, with torch).
- `torch_oldest`, `torch_current`, `torch_newest`: the torch AMP tests, the audit and a tiny suite on torch
  2.11.0, 2.14.1 and 2.15.0, the supported range's ends and the newest on this disk (CUDA builds, ~5 GB venvs).
- `slow`: the long forms of tests that CI shortens (suites/fp8.yaml trained as shipped);
- `gpu`: the gpu-marked tests on a CUDA machine; `browser`: report.html in headless Chromium;
  `slurm`: `--executor slurm` on a real single-node Slurm (Debian's daemons, started as root);
  `postgres`: the history store on a real PostgreSQL server (Debian's);
  `bench`: every script in benchmarks/;
  `isa`: the quickstart's and the smoke suite's certificates at this CPU's ISA and held to AVX2.
"""

import nox

nox.options.sessions = ["tests", "lint"]
# torch==2.13.0 is pinned for CPU sessions because that build is on the CI
# machines' disk; a bare `torch` could pull a multi-GB CUDA build.
CPU_TORCH = "torch==2.13.0"
# The sessions .ci/run starts beside the tests install without compiling every module of every
# dependency to bytecode (pandas, scipy, matplotlib, jaxlib...): a session imports a fraction of
# them, and the compiling took CPU the parallel tests were waiting for.
CI_PIP = ("--no-compile",)


@nox.session
def tests(session: nox.Session) -> None:
    session.install(CPU_TORCH, "-e", ".[dev]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "ampcert", "tests", "benchmarks")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the modules [tool.mypy] names (amp/, results, spec, certify, session...).

    Core dependencies only: torch and JAX are absent, so their types read as Any
    (ignore_missing_imports); what is checked is ampcert's own contracts, in seconds."""
    session.install(*CI_PIP, "-e", ".", "mypy>=1.10", "types-PyYAML")
    session.run("mypy", *session.posargs)


@nox.session
def slow(session: nox.Session) -> None:
    """What CI runs shortened, at full length: tests/session/test_fp8_suite.py trains the
    shipped suites/fp8.yaml as shipped (20 steps; CI trains it for 4, ~100 s of CPU less), and
    tests/test_wheel.py trains the whole smoke suite from the wheel to its certificate (CI trains
    its first shard: 2 of 16 runs, ~8 min less where bf16 is emulated)."""
    session.install(CPU_TORCH, "-e", ".[dev]")
    session.run("pytest", "tests/session/test_fp8_suite.py",
                "tests/test_wheel.py::test_the_shipped_smoke_suite_by_name_from_an_empty_folder", *session.posargs,
                env={"AMPCERT_TEST_SHIPPED_FP8": "1", "AMPCERT_TEST_SHIPPED_SMOKE": "1"})


@nox.session
def gpu(session: nox.Session) -> None:
    """On a CUDA machine: the gpu-marked tests (torch as installed there, CUDA build).

    The `torch` extra's floor (2.13) is what `tests` runs; its ceiling (2.14.1) is
    `torch_current`. The lent GPU machines carry torch 2.11 and no network: there, run
    `python3 -m pytest -m gpu` with PYTHONPATH at the checkout and the missing wheels
    carried in (a fresh venv cannot install anything there)."""
    session.install("-e", ".[dev]")
    session.run("pytest", "-m", "gpu", *session.posargs)


# The newest torch that installs here (issue 17). It is a CUDA build (~5.5 GB in the
# venv, read from the machines' disk, not downloaded) and runs on the CPU here.
CURRENT_TORCH = "torch==2.14.1"
TORCH_AMP_TESTS = ("tests/amp", "tests/backends/test_amp_parity.py", "tests/backends/test_amp_harness.py",
                   "tests/backends/test_flops.py",
                   # precision recipes: torchao's update bit for bit, FSDP2 and DDP on two ranks, resuming
                   "tests/backends/test_recipes.py", "tests/backends/test_resume.py")
# One tiny suite through `ampcert run`: ampcert's autocast in bf16 and fp16 (the latter
# with DynamicLossScaler), in real worker processes.
TINY_AMPCERT_SUITE = """\
name: torch-current
amp: ampcert
precisions: [fp32, bf16, fp16]
seeds: [0]
train: {steps: 20, eval_every: 10}
timeout_s: 300
workloads:
  - workload: digits
"""


def _torch_version_session(session: nox.Session, requirement: str) -> None:
    """The torch side on one torch release: the AMP tests, `ampcert audit --device cpu` (the
    shipped torch-cpu policy against this torch's autocast, op by op; exit 1 on any
    disagreement) and one tiny suite through `ampcert run`."""
    import pathlib
    import shutil

    version = requirement.split("==")[1]
    session.install(requirement, "-e", ".[dev]")
    session.run("python", "-c", "import torch, sys; print('torch', torch.__version__); "
                f"sys.exit(not torch.__version__.startswith({version!r}))")
    session.run("pytest", "-q", "-p", "no:cacheprovider", *TORCH_AMP_TESTS, *session.posargs)
    session.run("ampcert", "audit", "--device", "cpu")
    tmp = pathlib.Path(session.create_tmp())
    suite, out = tmp / "torch-current.yaml", tmp / "torch-current-results"
    suite.write_text(TINY_AMPCERT_SUITE)
    shutil.rmtree(out, ignore_errors=True)
    session.run("ampcert", "run", str(suite), "--out", str(out))


@nox.session(python="3.11")  # the 2.14.1 wheel on disk is cp311
def torch_current(session: nox.Session) -> None:
    """The torch side on torch 2.14.1 (_torch_version_session). Not a default session (the
    venv is ~5.5 GB); `nox -r -s torch_current` reuses it."""
    _torch_version_session(session, CURRENT_TORCH)


# The ends of the supported range (pyproject's torch extra): CUDA builds from PyPI, several GB
# each (a download on the first run; `nox -r` reuses the venv), run on the CPU here.
OLDEST_TORCH, NEWEST_TORCH = "torch==2.11.0", "torch==2.15.0"


@nox.session(python="3.11")
def torch_oldest(session: nox.Session) -> None:
    """The torch side on the oldest supported torch, 2.11.0 (_torch_version_session)."""
    _torch_version_session(session, OLDEST_TORCH)


@nox.session(python="3.11")
def torch_newest(session: nox.Session) -> None:
    """The torch side on the newest supported torch, 2.15.0 (_torch_version_session)."""
    _torch_version_session(session, NEWEST_TORCH)


@nox.session
def browser(session: nox.Session) -> None:
    """report.html in headless Chromium (needs `apt-get install chromium`): screenshot,
    no console errors, no network requests."""
    session.install(CPU_TORCH, "-e", ".[dev]")
    session.run("pytest", "-m", "browser", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    session.install(CPU_TORCH, "-e", ".[dev]")
    for script in sorted(__import__("pathlib").Path("benchmarks").glob("*.py")):
        session.run("python", str(script))


@nox.session
def postgres(session: nox.Session) -> None:
    """The history store against a real PostgreSQL server: installs Debian's postgresql
    where its binaries are missing (apt-get, as root), then runs the postgres-marked tests,
    which start a throwaway server (initdb as the postgres user, a free port, trust on
    127.0.0.1) or use the one $AMPCERT_TEST_POSTGRES names. The README's test command runs
    them too wherever the binaries are installed."""
    import glob
    import os

    if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        if os.geteuid() != 0:
            session.error("nox -s postgres installs PostgreSQL with apt-get: run it as root")
        session.run("apt-get", "update", "-q", external=True)
        session.run("apt-get", "install", "-y", "-q", "postgresql", external=True,
                    env={"DEBIAN_FRONTEND": "noninteractive"})
    session.install(CPU_TORCH, "-e", ".[dev]")
    session.run("pytest", "-m", "postgres", "-p", "no:cacheprovider", *session.posargs)


# A single-node Slurm for `nox -s slurm`: Debian's slurmctld, slurmd and munge, started
# by the session as root (their state under a scratch folder), stopped at its end.
SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
SLURM_CONF = """\
ClusterName=ampcert
SlurmctldHost={host}
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd.log
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
NodeName={host} CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@nox.session
def slurm(session: nox.Session) -> None:
    """`ampcert run --executor slurm` against a real single-node Slurm: installs Debian's
    slurmctld, slurmd and munge where missing (apt-get, as root), starts munged, slurmctld
    and slurmd with a scratch configuration (SLURM_CONF), waits for the node to be idle,
    runs the slurm-marked tests (tests/runner: a suite through sbatch job arrays, held to a
    local run), then stops the daemons. Not a default session (root, apt, daemons)."""
    import os
    import shutil
    import socket
    import subprocess
    import tempfile
    import time

    if os.geteuid() != 0:
        session.error("nox -s slurm starts Slurm's daemons: run it as root (a CI machine or a container)")
    if subprocess.run(["pgrep", "-x", "slurmctld|slurmd|munged"], capture_output=True).returncode == 0:
        session.error("Slurm or munge already runs here: run the slurm-marked tests against it "
                      "(`pytest -m slurm`) instead of starting a second one")
    if not all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged")):
        session.run("apt-get", "update", "-q", external=True)
        session.run("apt-get", "install", "-y", "-q", *SLURM_PACKAGES, external=True,
                    env={"DEBIAN_FRONTEND": "noninteractive"})
    session.install(CPU_TORCH, "-e", ".[dev]")
    state = tempfile.mkdtemp(prefix="ampcert-slurm-")
    host = socket.gethostname().split(".")[0]
    conf = os.path.join(state, "slurm.conf")
    with open(conf, "w") as fh:
        fh.write(SLURM_CONF.format(host=host, state=state, cpus=os.cpu_count(), ctld_port=6817, d_port=6818))
    for sub in ("ctld", "spool"):
        os.makedirs(os.path.join(state, sub))
    env = {"SLURM_CONF": conf}
    if not os.path.exists("/etc/munge/munge.key"):
        session.run("mungekey", "--create", external=True)  # (Debian's postinst makes one; a container may not)
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    # The daemons this session started, by their pid files: stopped at the end, nothing else.
    pid_files = ["/run/munge/munged.pid", os.path.join(state, "slurmctld.pid"), os.path.join(state, "slurmd.pid")]
    try:
        session.run("runuser", "-u", "munge", "--", "munged", external=True)
        session.run("slurmctld", "-f", conf, external=True, env=env)
        session.run("slurmd", "-f", conf, external=True, env=env)
        deadline = time.monotonic() + 60
        state_now = ""
        while time.monotonic() < deadline:
            state_now = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=os.environ | env,
                                       capture_output=True, text=True).stdout.strip()
            if state_now == "idle":
                break
            time.sleep(1)
        else:
            with open(os.path.join(state, "slurmd.log")) as fh:
                session.error(f"the Slurm node never became idle (sinfo: {state_now!r}):\n{fh.read()[-2000:]}")
        session.run("pytest", "-m", "slurm", "-p", "no:cacheprovider", *session.posargs, env=env)
    finally:
        for pid_file in reversed(pid_files):
            try:
                with open(pid_file) as fh:
                    os.kill(int(fh.read().strip()), 15)
            except (OSError, ValueError):  # not started, or gone already
                pass
        time.sleep(2)  # slurmd and slurmctld write their state on SIGTERM before they exit
        shutil.rmtree(state, ignore_errors=True)


# ampcert.amp.jax on its own, on the newest and the oldest JAX it supports, each in a
# venv without torch: the session checks that torch is absent and that
# `import ampcert.amp.jax` works there before the tests run.
JAX_AMP_TESTS = ("tests/amp/jax/test_jax_autocast.py", "tests/amp/jax/test_jax_loss_scale.py")
# What ampcert.amp.jax imports (jax, numpy, PyYAML) plus the test runner. The project
# goes in with --no-deps: its own dependencies include torch.
JAX_AMP_DEPS = ("numpy>=1.24", "pyyaml>=6.0", "pytest>=8", "pytest-timeout>=2.2")


def _python(version: str) -> str:
    """An interpreter for `version` that runs: pyenv's install of it where there is one
    (pyenv's `pythonX.Y` shim on PATH fails for a version that is not selected), else
    `version`, for nox to find on PATH."""
    import os
    import pathlib
    import re

    root = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv"))
    found = [p for p in root.glob(f"versions/{version}.*/bin/python{version}")
             if re.fullmatch(rf"{re.escape(version)}\.\d+", p.parents[1].name)]
    newest = max(found, key=lambda p: int(p.parents[1].name.rsplit(".", 1)[1]), default=None)
    return str(newest) if newest else version


# The harness with `backend: jax` where torch is not installed: a tiny JAX suite planned,
# trained, reported and certified, and a torch suite refused with the extra to install.
JAX_HARNESS_TESTS = ("tests/session/test_jax_without_torch.py",)


def _jax_amp(session: nox.Session, jax: str, harness: bool) -> None:
    # First ampcert.amp.jax alone: jax, numpy and PyYAML, nothing of the harness's deps.
    session.install(*CI_PIP, jax, *JAX_AMP_DEPS)
    session.install(*CI_PIP, "--no-deps", "-e", ".")
    session.run("python", "-c", "import importlib.util, jax; print('jax', jax.__version__); "
                "assert importlib.util.find_spec('torch') is None, 'torch is installed'")
    session.run("python", "-c", "import ampcert.amp.jax, sys; assert 'torch' not in sys.modules")
    session.run("pytest", "-q", *JAX_AMP_TESTS, *session.posargs)
    if not harness:
        return
    # Then the whole package as a JAX-only team installs it (`ampcert[jax]`: no torch).
    session.install(*CI_PIP, "-e", ".[jax]", jax)
    session.run("python", "-c", "import importlib.util; "
                "assert importlib.util.find_spec('torch') is None, 'ampcert[jax] pulled torch'")
    session.run("pytest", "-q", *JAX_HARNESS_TESTS, *session.posargs)


@nox.session(python=_python("3.12"))
def jax_current(session: nox.Session) -> None:
    """The JAX AMP tests on the newest JAX (0.12) and Python 3.12, without torch; then the
    harness installed as `ampcert[jax]` (no torch): a JAX suite trained, reported and certified."""
    _jax_amp(session, "jax==0.12.*", harness=True)


@nox.session(python=_python("3.11"))
def jax_oldest(session: nox.Session) -> None:
    """The JAX AMP tests on the oldest JAX supported (0.10) and Python 3.11, without torch.

    The harness on JAX 0.10 is the README's test command's: its venv (Python 3.11) resolves
    `jax>=0.10` to 0.10 (0.10.2 at this writing), and tests/backends/test_jax_backend.py trains, audits and certifies
    there (with torch installed, and blocked where it is under test:
    tests/session/test_jax_without_torch.py). A third run of that suite here cost CI about
    a minute of CPU, for no JAX-version coverage the other two lack."""
    _jax_amp(session, "jax==0.10.*", harness=False)


# The CPU held to AVX2, as on a CPU without AVX512-BF16/AMX (issue 56): ATen's vectorised
# kernels (ATEN_CPU_CAPABILITY), oneDNN's convolutions and bf16 matmuls (ONEDNN_MAX_CPU_ISA)
# and MKL's fp32 GEMMs (MKL_ENABLE_INSTRUCTIONS) all take their AVX2 code paths.
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def _quickstart_suite() -> str:
    """The suite docs/quickstart.md writes (its `cat > my-suite.yaml` block), as the page has it."""
    import pathlib
    import re

    page = pathlib.Path("docs/quickstart.md").read_text()
    return re.search(r"cat > my-suite\.yaml <<'YAML'\n(.*?)\nYAML\n", page, re.S).group(1) + "\n"


@nox.session
def isa(session: nox.Session) -> None:
    """The certificates the docs promise, at both CPU kinds on this one machine: the
    quickstart's suite (from docs/quickstart.md) and `smoke`, each run at the machine's own
    ISA and with the CPU held to AVX2 (AVX2_ONLY), `--repeat N` times each (default 1;
    `nox -s isa -- --repeat 5 --only quickstart --at avx2`), installed from the wheel as the README's
    main job installs it. Every run must end `certificate: PASS`, exit 0.

    How close the AVX2 setting comes to an AVX2-only machine: the same kernels run (ATen's
    AVX2 code, oneDNN's and MKL's AVX2 paths, bf16 matmuls and convolutions converted to fp32
    around fp32 kernels, as there), so the numbers a certificate judges are that code's. Not
    the same: the cores are this machine's (their speed, caches and clocks: time-to-target
    and throughput differ, the verdicts on accuracy do not), the capability probe still reads
    avx512_bf16/amx in /proc/cpuinfo and so decides "accelerated" from its timing (slow under
    AVX2: not accelerated, as there), and code that reads the flags itself (a library's own
    dispatch through cpuid, outside these three switches) takes its native path. On an
    AVX2-only machine both settings run the same code."""
    import argparse
    import pathlib
    import shutil

    parser = argparse.ArgumentParser(prog="nox -s isa --")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", choices=["quickstart", "smoke"], action="append")
    parser.add_argument("--at", choices=["native", "avx2"], action="append", help="the ISA settings (default both)")
    args = parser.parse_args(session.posargs)
    session.install(CPU_TORCH, ".[torch]")
    tmp = pathlib.Path(session.create_tmp())
    quickstart = tmp / "my-suite.yaml"
    quickstart.write_text(_quickstart_suite())
    suites = {"quickstart": str(quickstart), "smoke": "smoke"}
    for setting, env in (("native", {}), ("avx2", AVX2_ONLY)):
        if args.at and setting not in args.at:
            continue
        for name in args.only or list(suites):
            for i in range(args.repeat):
                out = tmp / f"{name}-{setting}-{i}"
                shutil.rmtree(out, ignore_errors=True)
                log = session.run("ampcert", "run", suites[name], "--out", str(out), env=env, silent=True)
                verdict = next((line for line in log.splitlines() if line.startswith("certificate: ")), "")
                session.log(f"{name} at {setting} ({i + 1}/{args.repeat}): {verdict or 'no certificate'}")
                if not verdict.startswith("certificate: PASS"):
                    session.error(f"{name} at {setting}: {verdict or 'no certificate'}\n{log[-3000:]}")
