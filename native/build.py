"""Build the compiled core (``cdc_native``) and install it into the running Python (or build its wheel):
profile-guided when the Rust toolchain can, a plain release build otherwise. ``scripts/setup.sh`` runs it with the
project's ``.venv``.

    .venv/bin/python native/build.py [--pgo auto|1|0] [--wheel DIR]

A profile-guided build (PGO) is three steps: the crate built with instrumentation (``-Cprofile-generate``); that
build run on ``native/pgo_train.py``, which pushes a pipeline's work through it (decoding generated segments of
every CQL type, plain and compressed; two batches of the state engine over them; a key-value batch into stored
rows) while it counts which branches and calls are taken; then the crate built again with those counts
(``-Cprofile-use``), which lets the compiler lay out, inline and unroll for the paths that run. Same sources,
same outputs: only the machine code's layout differs. Measured on this project's 2-core machines
(docs/benchmarks.md, the round after f90f04e): about 30 % more cells/s decoding and 15 % less CPU per change in the
state engine. It costs one more build and about 10 s of training, about two minutes in all. The counts vary a
little from one training to the next (the engine's threads share counters; stored rows come back from Delta in
varying order), and the compiler's choices with them: timed each in a process of its own, five builds of the
same code came within about a tenth of one another's CPU in the state engine, and two builds of the code before
them 1.23 times apart (the round after e807c7b). ``benchmarks/engine_ab.py`` times builds against each other.

It needs ``llvm-profdata`` of the LLVM that rustc is built on (to merge the counts): rustup's ``llvm-tools``
component (added here when rustup can fetch it), or an ``llvm-profdata`` of the same LLVM major version on PATH.
``--pgo`` (or ``CASSANDRA_CDC_NATIVE_PGO``): ``auto`` (the default) falls back to a plain build, saying why, when
any step cannot run; ``1`` makes that an error; ``0`` builds plain. The installed module says which it is:
``cdc_native.PROFILE_GUIDED``.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NATIVE = Path(__file__).resolve().parent
ROOT = NATIVE.parent
ENV = "CASSANDRA_CDC_NATIVE_PGO"
PGO_DIR = NATIVE / "target" / "pgo"                # the instrumented build, its counts and the merged profile
TRAINING_TIMEOUT_S = 900
RUSTUP_TIMEOUT_S = 180          # fetching llvm-tools (about 30 MB) from rustup's distribution server


class CannotProfile(Exception):
    """A profile-guided build cannot be made here (the message says why)."""


def log(msg: str) -> None:
    print(f"[native] {msg}", flush=True)


def _run(cmd: list, *, env: dict | None = None, timeout: float | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _rustc_info() -> tuple[str, int]:
    """rustc's host triple and the major version of its LLVM."""
    out = _run(["rustc", "-vV"]).stdout
    host = re.search(r"^host: (\S+)", out, re.M)
    llvm = re.search(r"^LLVM version: (\d+)", out, re.M)
    if not host or not llvm:
        raise CannotProfile(f"cannot tell rustc's host and LLVM version from `rustc -vV`: {out!r}")
    return host.group(1), int(llvm.group(1))


def _llvm_major(tool: str) -> int | None:
    m = re.search(r"LLVM version (\d+)", _run([tool, "--version"]).stdout)
    return int(m.group(1)) if m else None


def find_llvm_profdata() -> str:
    """An ``llvm-profdata`` that reads what rustc's instrumentation writes (the same LLVM major version)."""
    host, major = _rustc_info()
    sysroot = _run(["rustc", "--print", "sysroot"]).stdout.strip()
    bundled = Path(sysroot) / "lib" / "rustlib" / host / "bin" / "llvm-profdata"
    if not bundled.exists() and shutil.which("rustup"):
        log("adding rustup's llvm-tools component (llvm-profdata, to merge the training counts)")
        try:
            added = _run(["rustup", "component", "add", "llvm-tools"], timeout=RUSTUP_TIMEOUT_S, cwd=NATIVE)
            if added.returncode != 0:
                log(f"rustup could not add llvm-tools: {added.stderr.strip()[-400:]}")
        except subprocess.TimeoutExpired:
            log(f"rustup did not add llvm-tools within {RUSTUP_TIMEOUT_S} s (offline?)")
    if bundled.exists():
        return str(bundled)
    for name in (f"llvm-profdata-{major}", "llvm-profdata"):
        tool = shutil.which(name)
        if tool and _llvm_major(tool) == major:
            return tool
    raise CannotProfile(f"no llvm-profdata of LLVM {major} (rustc's): rustup's llvm-tools component is not "
                        f"installed and none is on PATH")


def _extension_name() -> str:
    return "libcdc_native.dylib" if sys.platform == "darwin" else "libcdc_native.so"


def instrumented_package(work: Path, counts: Path) -> Path:
    """The crate built with instrumentation that writes its counts under ``counts``, as a ``cdc_native`` package
    in ``work`` (returned: the directory to put first on ``sys.path``)."""
    target = PGO_DIR / "instrumented"
    env = {**os.environ, "CARGO_TARGET_DIR": str(target), "PYO3_PYTHON": sys.executable,
           "RUSTFLAGS": f"{os.environ.get('RUSTFLAGS', '')} -Cprofile-generate={counts}".strip()}
    log("building the crate with instrumentation (-Cprofile-generate)")
    built = _run(["cargo", "build", "--release", "--quiet", "--manifest-path", NATIVE / "Cargo.toml"], env=env)
    if built.returncode != 0:
        raise CannotProfile(f"the instrumented build failed:\n{built.stderr[-2000:]}")
    pkg = work / "cdc_native"
    pkg.mkdir()
    shutil.copy(target / "release" / _extension_name(), pkg / "cdc_native.abi3.so")
    (pkg / "__init__.py").write_text("from .cdc_native import *  # noqa: F403\n")
    return work


def train(package_dir: Path, counts: Path, work: Path) -> None:
    """Run ``pgo_train.py`` on the instrumented build: its counts land in ``counts``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(package_dir), str(ROOT),
                                                                       os.environ.get("PYTHONPATH")])),
           "CDC_NATIVE_TRAINING_BUILD": str(package_dir), "CASSANDRA_CDC_NATIVE": "1",
           "LLVM_PROFILE_FILE": str(counts / "cdc_native-%p-%m.profraw")}
    log("training it on native/pgo_train.py (a pipeline's decode and state-engine work)")
    try:
        ran = _run([sys.executable, NATIVE / "pgo_train.py", work], env=env, timeout=TRAINING_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CannotProfile(f"the training run took more than {TRAINING_TIMEOUT_S} s") from None
    if ran.returncode != 0:
        raise CannotProfile(f"the training run failed:\n{(ran.stdout + ran.stderr)[-3000:]}")
    log(ran.stdout.strip().splitlines()[-1] if ran.stdout.strip() else "training done")
    if not any(counts.glob("*.profraw")):
        raise CannotProfile(f"the training run wrote no counts into {counts}")


def merged_profile(profdata: str, counts: Path) -> Path:
    out = PGO_DIR / "cdc_native.profdata"
    merged = _run([profdata, "merge", "-o", out, *sorted(counts.glob("*.profraw"))])
    if merged.returncode != 0:
        raise CannotProfile(f"llvm-profdata could not merge the counts:\n{merged.stderr[-2000:]}")
    return out


def make_profile() -> Path:
    """The merged profile of a training run of an instrumented build (raises CannotProfile)."""
    missing = [tool for tool in ("cargo", "rustc") if shutil.which(tool) is None]
    if missing:
        raise CannotProfile(f"no {' and no '.join(missing)} on PATH")
    profdata = find_llvm_profdata()
    counts = PGO_DIR / "counts"
    shutil.rmtree(counts, ignore_errors=True)
    counts.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="cdc-native-pgo-") as tmp:
        build = Path(tmp) / "build"
        build.mkdir()
        train(instrumented_package(build, counts), counts, Path(tmp) / "work")
    return merged_profile(profdata, counts)


def install(profile: Path | None, wheel_dir: Path | None = None) -> bool:
    """``pip install ./native`` (maturin), with ``profile`` for a profile-guided build, or with ``wheel_dir`` the
    wheel built into it instead (``pip wheel``: for Spark executors and other machines): whether it built."""
    env = dict(os.environ)
    env.pop("CDC_NATIVE_PROFILE_GUIDED", None)
    if profile is not None:
        env["RUSTFLAGS"] = f"{env.get('RUSTFLAGS', '')} -Cprofile-use={profile}".strip()
        env["CDC_NATIVE_PROFILE_GUIDED"] = "1"      # read by the crate at build time: cdc_native.PROFILE_GUIDED
    kind = "profile-guided" if profile else "plain release build"
    pip = [sys.executable, "-m", "pip"]
    if wheel_dir is None:
        log(f"building and installing cdc_native ({kind})")
        pip += ["install", "-q", "--disable-pip-version-check", str(NATIVE)]
    else:
        log(f"building the cdc_native wheel into {wheel_dir} ({kind})")
        pip += ["wheel", "-q", "--disable-pip-version-check", "--no-deps", "-w", str(wheel_dir), str(NATIVE)]
    return subprocess.run(pip, env=env, check=False).returncode == 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pgo", choices=("auto", "1", "0"), default=os.environ.get(ENV, "auto").strip() or "auto",
                   help=f"profile-guided build: auto (when the toolchain can), 1 (required), 0 (plain); default "
                        f"${ENV} or auto")
    p.add_argument("--wheel", metavar="DIR", type=Path, default=None,
                   help="build the wheel into DIR instead of installing it (abi3: one per platform, for every "
                        "CPython >= 3.11; for Spark executors)")
    a = p.parse_args(argv)
    if a.pgo not in ("auto", "1", "0"):       # a default from the environment skips argparse's own check
        p.error(f"{ENV} must be auto, 1 or 0, not {a.pgo!r}")
    profile = None
    if a.pgo != "0":
        try:
            profile = make_profile()
        except CannotProfile as e:
            if a.pgo == "1":
                raise SystemExit(f"[native] a profile-guided build was required ({ENV}=1) and cannot be made: {e}")
            log(f"no profile-guided build ({e}); building plain: same outputs, slower (docs/benchmarks.md)")
    if install(profile, a.wheel):
        return 0
    if profile is not None and a.pgo == "auto":
        log("the profile-guided build failed (see above); building plain")
        if install(None, a.wheel):
            return 0
    raise SystemExit(f"could not build native/ (see above); {ENV}=0 builds without a profile, "
                     "CASSANDRA_CDC_NATIVE=0 runs without the compiled core")


if __name__ == "__main__":
    sys.exit(main())
