"""A real local Apache Cassandra 5.0 cluster for the tests, the demo and the benchmarks (never for production).

One call starts 1 to 9 nodes from the ``cassandra-all`` jars that ``scripts/setup.sh`` fetched from Maven Central
(``.jvm/lib/cassandra``, pinned by ``jvm/cassandra/pom.xml``), waits until CQL answers on every node, and stops
them by PID::

    from cdc_lib.demo.cassandra import start_cluster
    with start_cluster(3, "/tmp/c3") as c:                 # nodes on 127.0.0.1, .2, .3
        session = c.session()                              # cassandra-driver, every node a contact point
        c.nodetool(1, "drain")                             # nodetool from the same jars
        c.node(2).cdc_raw                                  # where that node's agent reads
    # leaving the block: SIGTERM every node, SIGKILL what is still running after a timeout

Node ``i`` listens on ``127.0.0.i`` (CQL and storage ports shared by the nodes, the standard 9042 and 7000 when
they are free on every address, else free ones), has its own JMX port on 127.0.0.1 (JMX's "local" mode binds the
loopback address whatever the node's address), a fixed token (``num_tokens: 1``, evenly spaced) and
``auto_bootstrap: false``: a new cluster has nothing to stream, so all nodes start at the same time. Everything of
node ``i`` is under ``<base_dir>/node<i>``: ``conf/`` (the generated ``cassandra.yaml`` and logback config),
``logs/system.log`` and ``logs/stdout.log`` (shown when a start fails), ``commitlog/``, ``cdc_raw/`` (same
filesystem: Cassandra hard-links segments into it), ``data/``, ``hints/``, ``saved_caches/``.

CDC is on (``cdc_enabled``, ``commitlog_segment_size: 1MiB`` so segments fill and close quickly), heaps are small
(512 MiB, serial GC) and the JVM runs under ``nice``. Yaml keys given to ``start_cluster``/``LocalCassandra``
override the generated ones (``commitlog_compression``, ``transparent_data_encryption_options``,
``storage_compatibility_mode``, ``cdc_total_space`` ...); ``node_yaml={2: {...}}`` overrides one node.

What a start costs (measured on a 2-core machine; README, "A real Cassandra"): it is CPU-bound (class loading,
JIT). The shortcuts that help are the startup properties in ``FAST_START_PROPS`` (they save ~10 s on 3 nodes);
``-Dcassandra.unsafesystem=true`` is deliberately not used: after a SIGKILL a node would forget tables created since
its last schema flush and drop their mutations at replay.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from . import jvm

# JPMS flags of Cassandra 5.0's conf/jvm17-server.options: without them the daemon fails on JDK 17.
JDK17_SERVER_FLAGS = (
    "-Djdk.attach.allowAttachSelf=true",
    "--add-exports", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports", "java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports", "java.sql/java.sql=ALL-UNNAMED",
    "--add-exports", "java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports", "jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports", "jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports", "jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/java.io=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens", "jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
)

# conf/jvm17-clients.options (nodetool and the other tools die in FileUtils.<clinit> without them).
JDK17_CLIENT_FLAGS = (
    "-Djdk.attach.allowAttachSelf=true",
    "--add-exports", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports", "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-exports", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-exports", "java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports", "java.sql/java.sql=ALL-UNNAMED",
    "--add-exports", "jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/java.io=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "--add-opens", "java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens", "java.base/java.util.concurrent.atomic=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens", "java.base/java.math=ALL-UNNAMED",
    "--add-opens", "java.base/java.net=ALL-UNNAMED",
)

# The general part of conf/jvm-server.options (-ea included: Cassandra runs with assertions on).
GENERAL_SERVER_FLAGS = (
    "-ea", "-da:net.openhft...", "-XX:+UseThreadPriorities", "-XX:+HeapDumpOnOutOfMemoryError", "-Xss256k",
    "-XX:+UseTLAB", "-XX:+ResizeTLAB", "-XX:+PerfDisableSharedMem", "-Djava.net.preferIPv4Stack=true",
    "-XX:+UseSerialGC",
)

# Startup shortcuts for a throw-away local cluster. ring_delay and the gossip settle wait save ~10 s on 3 nodes;
# a superuser setup delay of 0 makes CassandraRoleManager retry in a tight loop, 1 s does not.
FAST_START_PROPS = {
    "cassandra.skip_wait_for_gossip_to_settle": "0",
    "cassandra.gossip_settle_min_wait_ms": "0",
    "cassandra.ring_delay_ms": "1000",
    "cassandra.superuser_setup_delay_ms": "1000",
}

STANDARD_NATIVE_PORT, STANDARD_STORAGE_PORT, STANDARD_JMX_PORT = 9042, 7000, 7199
MURMUR3_MIN = -(1 << 63)
# A non-seed node that boots before the seed answers gossip exits with this; it is simply started again.
_NO_SEED_YET = "Unable to gossip with any peers"
_TOOLS_LOGBACK = '<configuration><root level="OFF"/></configuration>\n'
_NODE_LOGBACK = """<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${cassandra.logdir}/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""


class CassandraStartError(RuntimeError):
    """A node did not come up; the message carries the end of its logs."""


class PortTakenError(CassandraStartError):
    """Another process took one of the cluster's ports between choosing it and binding it (other jobs on the
    machine start servers too): a first start tries again on other ports."""


# What a node's log says when one of its ports was taken first (JMX; Cassandra 5.0's storage port: "/127.0.0.1:7000
# is in use by another process", seen in CI when another job's node had just taken it).
_PORT_TAKEN = ("Address already in use", "Port already in use", "is in use by another process")


def even_tokens(n: int) -> list:
    """``num_tokens: 1`` tokens spread evenly over the Murmur3 ring."""
    return [MURMUR3_MIN + i * ((1 << 64) // n) for i in range(n)]


def _port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((address, port))
            return True
        except OSError:
            return False


def _port_for(addresses: list, preferred: int, taken: set) -> int:
    """``preferred`` when it is free on every address, else a port the kernel gives that is."""
    if preferred not in taken and all(_bindable(a, preferred) for a in addresses):
        return preferred
    for _ in range(100):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = s.getsockname()[1]
        if port not in taken and all(_bindable(a, port) for a in addresses):
            return port
    raise CassandraStartError(f"no port free on every one of {addresses}")


# ------------------------------------------------------------------------------------------------ yaml

def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def dump_yaml(obj: Any, indent: int = 0) -> str:
    """Block-style YAML of dicts, lists and scalars (all cassandra.yaml needs; no PyYAML dependency)."""
    pad = "  " * indent
    lines = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (dict, list)) and v:
                lines += [f"{pad}{k}:", dump_yaml(v, indent + 1)]
            else:
                lines.append(f"{pad}{k}: " + ("{}" if isinstance(v, dict) else "[]" if isinstance(v, list)
                                               else _yaml_scalar(v)))
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}- " + dump_yaml(v, indent + 1).lstrip())
            else:
                lines.append(f"{pad}- {_yaml_scalar(v)}")
    else:
        lines.append(pad + _yaml_scalar(obj))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ nodes

@dataclass
class Node:
    """One node: its address, directories, ports and (while it runs) its process."""
    index: int
    address: str
    dir: Path
    jmx_port: int
    token: int
    proc: Optional[subprocess.Popen] = None
    started_at: Optional[float] = None
    ready_after: Optional[float] = None     # seconds from spawn until CQL answered

    @property
    def conf_dir(self) -> Path:
        return self.dir / "conf"

    @property
    def yaml_path(self) -> Path:
        return self.conf_dir / "cassandra.yaml"

    @property
    def log_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def system_log(self) -> Path:
        return self.log_dir / "system.log"

    @property
    def stdout_log(self) -> Path:
        return self.log_dir / "stdout.log"

    @property
    def commitlog(self) -> Path:
        return self.dir / "commitlog"

    @property
    def cdc_raw(self) -> Path:
        return self.dir / "cdc_raw"

    @property
    def hints(self) -> Path:
        return self.dir / "hints"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        out = []
        for p in (self.stdout_log, self.system_log):
            if p.exists():
                text = p.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"==> {p} (last {len(text)} lines) <==\n" + "\n".join(text))
        return "\n".join(out) or f"(node {self.index} wrote no log in {self.log_dir})"


class LocalCassandra:
    """A local cluster of ``nodes`` Cassandra 5.0 nodes under ``base_dir`` (see the module docstring).

    Nothing runs until :meth:`start`. ``yaml`` overrides keys of every node's ``cassandra.yaml`` (a dict value is
    merged one level deep; None removes the key), ``node_yaml`` those of one node (``{2: {...}}``).
    """

    def __init__(self, base_dir, nodes: int = 1, *, yaml: Optional[dict] = None,
                 node_yaml: Optional[dict] = None, heap: str = "512m", cluster_name: str = "cdc_local",
                 nice: int = 10, java: str = "java", extra_jvm: Iterable[str] = ()):
        if not 1 <= nodes <= 9:
            raise ValueError("a local cluster has 1 to 9 nodes")
        self.base_dir = Path(base_dir).resolve()
        self.yaml = dict(yaml or {})
        self.node_yaml = {int(k): dict(v) for k, v in (node_yaml or {}).items()}
        self.heap, self.cluster_name, self.nice, self.java = heap, cluster_name, nice, java
        self.extra_jvm = tuple(extra_jvm)
        self.classpath = jvm.classpath("cassandra")
        self.jamm = jvm.jar("cassandra", "jamm")
        addresses = [f"127.0.0.{i + 1}" for i in range(nodes)]
        self.nodes = [Node(i + 1, address, self.base_dir / f"node{i + 1}", 0, token)
                      for i, (address, token) in enumerate(zip(addresses, even_tokens(nodes)))]
        self._choose_ports()
        self.started_in: Optional[float] = None         # seconds for the whole cluster to answer CQL
        self.respawned = 0
        self.port_retries = 0                           # first starts begun again on other ports
        self._driver = None
        self._driver_lock = threading.Lock()

    def _choose_ports(self, avoid: Iterable[int] = ()) -> None:
        """Cassandra's standard ports where they are free (and not in ``avoid``), else ports the kernel gives."""
        addresses = [n.address for n in self.nodes]
        taken = set(avoid)
        self.native_port = _port_for(addresses, STANDARD_NATIVE_PORT, taken)
        taken.add(self.native_port)
        self.storage_port = _port_for(addresses, STANDARD_STORAGE_PORT, taken)
        taken.add(self.storage_port)
        for i, n in enumerate(self.nodes):
            n.jmx_port = _port_for(["127.0.0.1"], STANDARD_JMX_PORT + 100 * i, taken)
            taken.add(n.jmx_port)

    # -------------------------------------------------------------- info
    @property
    def contact_points(self) -> list:
        return [n.address for n in self.nodes]

    def node(self, i: int) -> Node:
        return self.nodes[i - 1]

    @property
    def pids(self) -> dict:
        return {n.index: n.pid for n in self.nodes if n.running()}

    def __repr__(self) -> str:
        return (f"LocalCassandra({len(self.nodes)} nodes, CQL {','.join(self.contact_points)}:{self.native_port}, "
                f"pids {self.pids}, {self.base_dir})")

    # -------------------------------------------------------------- configuration
    def node_config(self, n: Node) -> dict:
        d = n.dir
        conf: dict = {
            "cluster_name": self.cluster_name,
            "num_tokens": 1,
            "initial_token": str(n.token),
            "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
            "endpoint_snitch": "SimpleSnitch",
            "seed_provider": [{"class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
                               "parameters": [{"seeds": f"{self.nodes[0].address}:{self.storage_port}"}]}],
            "listen_address": n.address,
            "rpc_address": n.address,
            "storage_port": self.storage_port,
            "native_transport_port": self.native_port,
            "start_native_transport": True,
            "auto_bootstrap": False,
            "data_file_directories": [str(d / "data")],
            "commitlog_directory": str(n.commitlog),
            "cdc_raw_directory": str(n.cdc_raw),
            "saved_caches_directory": str(d / "saved_caches"),
            "hints_directory": str(n.hints),
            "commitlog_sync": "periodic",
            "commitlog_sync_period": "10000ms",
            "commitlog_segment_size": "1MiB",
            "cdc_enabled": True,
            "cdc_total_space": "64MiB",
            "cdc_free_space_check_interval": "250ms",
            "authenticator": {"class_name": "AllowAllAuthenticator"},
            "authorizer": {"class_name": "AllowAllAuthorizer"},
            "concurrent_compactors": 1,
            # a 2-core machine shared with other work: Cassandra's 2 s write timeout fails writes under load
            "write_request_timeout": "20000ms",
            "read_request_timeout": "20000ms",
            "range_request_timeout": "30000ms",
            "counter_write_request_timeout": "20000ms",
            "cas_contention_timeout": "10000ms",
            "truncate_request_timeout": "60000ms",
            "request_timeout": "30000ms",
        }
        for k, v in {**self.yaml, **self.node_yaml.get(n.index, {})}.items():
            if v is None:
                conf.pop(k, None)
            elif isinstance(v, dict) and isinstance(conf.get(k), dict):
                conf[k] = {**conf[k], **v}
            else:
                conf[k] = v
        return conf

    def write_config(self, clean: bool = True) -> None:
        """Write every node's directories and config (``clean``: delete what an earlier cluster left there)."""
        if clean and self.base_dir.exists():
            shutil.rmtree(self.base_dir)
        for n in self.nodes:
            for sub in (n.conf_dir, n.log_dir, n.commitlog, n.cdc_raw, n.hints, n.dir / "data", n.dir / "saved_caches"):
                sub.mkdir(parents=True, exist_ok=True)
            n.yaml_path.write_text(dump_yaml(self.node_config(n)) + "\n")
            (n.conf_dir / "logback.xml").write_text(_NODE_LOGBACK)
        (self.base_dir / "logback-tools.xml").write_text(_TOOLS_LOGBACK)

    def jvm_command(self, n: Node) -> list:
        props = {
            "cassandra.config": n.yaml_path.as_uri(),
            "cassandra-foreground": "yes",
            "cassandra.storagedir": str(n.dir),
            "cassandra.logdir": str(n.log_dir),
            "logback.configurationFile": (n.conf_dir / "logback.xml").as_uri(),
            "cassandra.jmx.local.port": str(n.jmx_port),
            **FAST_START_PROPS,
        }
        if n.proc is not None and len(self.nodes) > 1:
            # A restart first checks its address with a gossip "shadow round" that waits for a seed's answer for
            # only about the ring delay: with the 1 s shortcut a node restarted on a 2-core machine gave up
            # ("Unable to gossip with any peers") 3 s in, its seed busy. Cassandra's own 30 s bound it there.
            props["cassandra.ring_delay_ms"] = "30000"
        return [self.java, f"-Xms{self.heap}", f"-Xmx{self.heap}", *GENERAL_SERVER_FLAGS, *JDK17_SERVER_FLAGS,
                f"-javaagent:{self.jamm}", *[f"-D{k}={v}" for k, v in props.items()], *self.extra_jvm,
                "-cp", self.classpath, "org.apache.cassandra.service.CassandraDaemon"]

    # -------------------------------------------------------------- processes
    def start(self, timeout: float = 300.0) -> "LocalCassandra":
        """Write the configs afresh, start every node at once, wait until CQL answers on all of them.

        On failure every node started is stopped and ``CassandraStartError`` carries the end of the logs. The first
        start of a new cluster that lost one of its ports to another process starts afresh on other ports, up to
        three times: the ports are chosen when the cluster is made, and bound only seconds later.
        """
        fresh = self.started_in is None and not any((n.dir / "data").exists() for n in self.nodes)
        for attempt in range(3):
            try:
                return self._start(timeout)
            except PortTakenError:
                if not fresh or attempt == 2:
                    raise
                self.port_retries += 1
                for n in self.nodes:
                    shutil.rmtree(n.dir, ignore_errors=True)
                self._choose_ports(avoid=[STANDARD_NATIVE_PORT, STANDARD_STORAGE_PORT, self.native_port,
                                          self.storage_port, *(STANDARD_JMX_PORT + 100 * i for i in range(9)),
                                          *(n.jmx_port for n in self.nodes)])
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> "LocalCassandra":
        busy = [f"{a}:{p}" for n in self.nodes for a, p in ((n.address, self.native_port),
                                                             (n.address, self.storage_port),
                                                             ("127.0.0.1", n.jmx_port)) if _port_open(a, p, 0.2)]
        if busy:
            raise PortTakenError(f"ports in use (another Cassandra?): {', '.join(busy)}")
        self.write_config()
        t0 = time.monotonic()
        try:
            seed = self.nodes[0]
            self._spawn(seed)
            if len(self.nodes) > 1:
                # The others boot while the seed does, but their first gossip round must find it listening (else
                # they exit and are started again, a few seconds lost): start them once its storage port is open.
                while seed.running() and not _port_open(seed.address, self.storage_port, 0.2) \
                        and time.monotonic() - t0 < timeout:
                    time.sleep(0.1)
                for n in self.nodes[1:]:
                    self._spawn(n)
            self.wait_ready(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def _spawn(self, n: Node) -> None:
        cmd = self.jvm_command(n)
        (n.dir / "jvm.cmd").write_text(" ".join(cmd) + "\n")
        if self.nice:
            cmd = ["nice", "-n", str(self.nice), *cmd]
        with open(n.stdout_log, "ab") as out:
            n.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      cwd=n.dir, start_new_session=True)
        n.started_at = time.monotonic()
        n.ready_after = None

    def wait_ready(self, indexes: Optional[Iterable[int]] = None, timeout: float = 300.0) -> None:
        """Wait until CQL answers on the given nodes (all by default) and every running node lists every other
        one as a peer; a non-seed that exited because the seed was not up yet is started again."""
        pending = {i: self.node(i) for i in (indexes or [n.index for n in self.nodes])}
        deadline = time.monotonic() + timeout
        respawns = {i: 3 for i in pending}
        while pending:
            for n in list(pending.values()):
                if not n.running():
                    if n.index != 1 and respawns[n.index] and _NO_SEED_YET in n.log_tail(200):
                        respawns[n.index] -= 1
                        self.respawned += 1
                        time.sleep(1.0)
                        self._spawn(n)
                        continue
                    tail = n.log_tail()
                    error = PortTakenError if any(m in tail for m in _PORT_TAKEN) else CassandraStartError
                    raise error(f"node {n.index} ({n.address}) exited with status "
                                f"{n.proc.returncode if n.proc else '?'} before CQL was up\n{tail}")
                if _port_open(n.address, self.native_port) and self._answers_as(n):
                    n.ready_after = time.monotonic() - n.started_at
                    del pending[n.index]
            if pending and time.monotonic() > deadline:
                raise CassandraStartError(f"nodes {sorted(pending)} did not answer CQL within {timeout:.0f} s\n"
                                          + "\n".join(n.log_tail() for n in pending.values()))
            if pending:
                time.sleep(0.2)
        self._wait_peers(deadline)

    def _answers_as(self, n: Node) -> bool:
        """The Cassandra answering on the node's address and CQL port is this node (its commit-log directory),
        not another one that took the port first (other jobs on the machine start Cassandras too: a node of ours
        that lost the race exits, and the other one must not be taken for it). False while it cannot tell yet."""
        cluster = self._one_node_cluster(n, connect_timeout=10)
        try:
            rows = cluster.connect().execute("SELECT value FROM system_views.settings "
                                             "WHERE name = 'commitlog_directory'")
            theirs = [r.value for r in rows]
        except Exception:  # noqa: BLE001 - not ready yet (or not Cassandra): asked again on the next round
            return False
        finally:
            cluster.shutdown()
        if theirs != [str(n.commitlog)]:
            raise PortTakenError(f"another Cassandra answers on {n.address}:{self.native_port} (its commit log "
                                      f"is {theirs}, node {n.index}'s is {n.commitlog})\n{n.log_tail()}")
        return True

    def _one_node_cluster(self, n: Node, **options):
        """A cassandra-driver Cluster that talks to node ``n`` only (its load-balancing policy in the default
        execution profile: the Cluster argument is the driver's deprecated form)."""
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import WhiteListRoundRobinPolicy
        only_n = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([n.address]))
        return Cluster([n.address], port=self.native_port, protocol_version=5,
                       execution_profiles={EXEC_PROFILE_DEFAULT: only_n}, **options)

    def _wait_peers(self, deadline: float) -> None:
        """Every running node knows every other running one as a NORMAL peer (so RF = N writes at ALL work)."""
        running = [n for n in self.nodes if n.running()]
        if len(running) < 2:
            return
        for n in running:
            want = {m.address for m in running if m is not n}
            cluster = self._one_node_cluster(n)
            try:
                session = cluster.connect()
                while True:
                    rows = session.execute("SELECT peer, native_address FROM system.peers_v2")
                    if want <= {str(r.peer) for r in rows if r.native_address is not None}:
                        break
                    if time.monotonic() > deadline:
                        raise CassandraStartError(f"node {n.index} does not see peers {sorted(want)}\n"
                                                  f"{n.log_tail()}")
                    time.sleep(0.25)
            finally:
                cluster.shutdown()

    def start_node(self, i: int, timeout: float = 300.0) -> Node:
        """Start a stopped node again (its data, commit log and cdc_raw are kept)."""
        n = self.node(i)
        if not n.running():
            self._spawn(n)
        self.wait_ready([i], timeout)
        return n

    def stop_node(self, i: int, timeout: float = 90.0, sig: int = signal.SIGTERM) -> Optional[int]:
        """Send ``sig`` (SIGTERM: Cassandra's shutdown hook drains) to node ``i`` by PID; SIGKILL it when it has
        not exited after ``timeout``. Returns its exit status."""
        n = self.node(i)
        if n.proc is None:
            return None
        if n.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(n.proc.pid, sig)
            try:
                n.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.proc.pid, signal.SIGKILL)
                n.proc.wait(30)
        return n.proc.returncode

    def kill_node(self, i: int) -> Optional[int]:
        """SIGKILL: a crash, no shutdown hook, nothing flushed."""
        return self.stop_node(i, timeout=30, sig=signal.SIGKILL)

    def stop(self, timeout: float = 90.0, *, graceful: bool = True) -> None:
        """Stop every running node by PID: SIGTERM to all (Cassandra's shutdown hook drains: seconds per node, up to
        30 s more when its peers went first), then SIGKILL to those still running after ``timeout``.
        ``graceful=False`` sends SIGKILL at once: for a cluster whose data is thrown away."""
        self.close_driver()
        live = [n for n in self.nodes if n.running()]
        for n in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(n.proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
        deadline = time.monotonic() + timeout
        for n in live:
            try:
                n.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.proc.pid, signal.SIGKILL)
                n.proc.wait(30)

    def __enter__(self) -> "LocalCassandra":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -------------------------------------------------------------- tools
    def nodetool(self, i: int, *args: str, timeout: float = 300.0) -> str:
        """``nodetool -h 127.0.0.1 -p <JMX port of node i> args...`` from the same jars; its stdout. Raises
        RuntimeError with the output when it fails."""
        n = self.node(i)
        cmd = [self.java, "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *JDK17_CLIENT_FLAGS,
               f"-Dcassandra.storagedir={n.dir}", f"-Duser.home={self.base_dir}",   # nodetool writes history there
               f"-Dlogback.configurationFile={(self.base_dir / 'logback-tools.xml').as_uri()}",
               "-cp", self.classpath, "org.apache.cassandra.tools.NodeTool", "-h", "127.0.0.1", "-p",
               str(n.jmx_port), *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"nodetool {' '.join(args)} on node {i} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        return r.stdout

    def nodetool_all(self, *args: str) -> None:
        """The same nodetool command on every running node, in parallel (``drain`` takes seconds per node).

        Before ``drain`` the driver (``driver_cluster``) is closed: no drained node takes clients, and an open driver
        would try to reconnect to them, ever more rarely, until the process exits. A later ``session()`` opens a new
        one (on nodes restarted by then)."""
        if args[:1] == ("drain",):
            self.close_driver()
        errors = []

        def one(i):
            try:
                self.nodetool(i, *args)
            except Exception as e:  # noqa: BLE001 - collected, raised below
                errors.append(e)
        threads = [threading.Thread(target=one, args=(n.index,)) for n in self.nodes if n.running()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def driver_cluster(self):
        """One cassandra-driver Cluster on every node (protocol v5; closed by :meth:`stop`)."""
        with self._driver_lock:
            if self._driver is None:
                from cassandra.cluster import Cluster
                self._driver = Cluster(self.contact_points, port=self.native_port, protocol_version=5,
                                       connect_timeout=30, control_connection_timeout=30)
            return self._driver

    def session(self, keyspace: Optional[str] = None):
        """A new session of :meth:`driver_cluster` (60 s request timeout: the machine may be loaded)."""
        s = self.driver_cluster().connect(keyspace)
        s.default_timeout = 60
        return s

    def close_driver(self) -> None:
        with self._driver_lock:
            if self._driver is not None:
                self._driver.shutdown()
                self._driver = None


@contextlib.contextmanager
def start_cluster(nodes: int, base_dir, **kw) -> Iterator[LocalCassandra]:
    """Start a :class:`LocalCassandra` and stop it on leaving the block (also on failure)."""
    cluster = LocalCassandra(base_dir, nodes, **kw)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def describe(session, keyspace: str) -> str:
    """``DESCRIBE KEYSPACE <ks> WITH INTERNALS`` as Cassandra writes it (the ``ID = ...`` of every table, and the
    ``ALTER TABLE ... DROP ... USING TIMESTAMP`` of dropped columns): a schema file the pipeline reads."""
    rows = session.execute(f'DESCRIBE KEYSPACE "{keyspace}" WITH INTERNALS')
    return "\n\n".join(r.create_statement for r in rows) + "\n"


def make_tde_keystore(path: Path, alias: str = "testing:1", password: str = "cassandra") -> Path:
    """A JCEKS keystore with one AES-128 key, made with the JDK's keytool, for
    ``transparent_data_encryption_options`` (see ``tde_options``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    subprocess.run(["keytool", "-genseckey", "-alias", alias, "-keyalg", "AES", "-keysize", "128", "-storetype",
                    "jceks", "-keystore", str(path), "-storepass", password, "-keypass", password],
                   check=True, capture_output=True)
    return path


def tde_options(keystore: Path, alias: str = "testing:1", password: str = "cassandra") -> dict:
    """Yaml overrides that encrypt the commit log with the key ``alias`` of ``keystore``.

    Cassandra 5.0.9 fails at startup with assertions on (``-ea``, as shipped) when the commit log is encrypted
    but not compressed (CASSANDRA-21540: the "legacy" disk access mode resolves to mmap before encryption is
    considered), so a compressor is set too; the segments are then encrypted (their header names both).
    """
    return {
        "commitlog_compression": [{"class_name": "LZ4Compressor"}],
        "transparent_data_encryption_options": {
            "enabled": True, "chunk_length_kb": 64, "cipher": "AES/CBC/PKCS5Padding", "key_alias": alias,
            "key_provider": [{"class_name": "org.apache.cassandra.security.JKSKeyProvider",
                              "parameters": [{"keystore": str(keystore), "keystore_password": password,
                                              "store_type": "JCEKS", "key_password": password}]}]},
    }
