"""docker/: the compose file describes the production-like stack, and every file the images copy exists.

Docker cannot run here, so these checks are structural: they parse the compose file and the Dockerfiles.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def _find(services: dict, *needles: str) -> str:
    for name, svc in services.items():
        text = f"{name} {svc.get('image', '')} {svc.get('build', '')}".lower()
        if any(n in text for n in needles):
            return name
    raise AssertionError(f"no service matching {needles} in {sorted(services)}")


def test_compose_has_the_whole_stack():
    services = _compose()["services"]
    for needles in (("cassandra:",), ("minio", "seaweedfs"), ("kafka",), ("schema-registry",), ("airflow",),
                    ("spark",), ("agent",)):
        _find(services, *needles)


def test_cassandra_runs_with_cdc_enabled_and_shares_cdc_raw_with_the_agent():
    services = _compose()["services"]
    cassandra = services[_find(services, "cassandra:")]
    agent = services[_find(services, "agent")]
    # cdc_enabled is switched on by the script the container starts with (mounted from docker/)
    mounts = {m.split(":")[1]: m.split(":")[0] for m in cassandra["volumes"]}
    entry = cassandra["entrypoint"][0]
    script = DOCKER / mounts[entry]
    assert script.is_file(), script
    assert re.search(r"cdc_enabled: true", script.read_text())
    cdc_raw = [m.split(":")[0] for m in cassandra["volumes"] if m.split(":")[1].rstrip("/").endswith("cdc_raw")]
    assert cdc_raw, "cassandra has no cdc_raw volume"
    agent_vols = {m.split(":")[0]: m.split(":")[1] for m in agent["volumes"]}
    assert cdc_raw[0] in agent_vols, "the agent sidecar does not mount cassandra's cdc_raw volume"
    cmd = agent["command"]
    assert cmd[:2] == ["cassandra-cdc", "agent"]
    assert cmd[cmd.index("--cdc-raw") + 1] == agent_vols[cdc_raw[0]]
    assert cdc_raw[0] in _compose()["volumes"]


def test_airflow_gets_connections_and_the_dags():
    services = _compose()["services"]
    airflow = services[_find(services, "airflow")]
    env = airflow["environment"]
    for conn in ("AIRFLOW_CONN_CASSANDRA_CDC_KAFKA", "AIRFLOW_CONN_CASSANDRA_CDC_S3",
                 "AIRFLOW_CONN_CASSANDRA_CDC_CASSANDRA"):
        assert conn in env, conn
    assert any(v.startswith("../dags:") for v in airflow["volumes"])


def test_airflow_processes_what_the_agent_ships():
    """Scheduled runs have no conf: the store and the cluster must reach them as settings, the agent's own."""
    services = _compose()["services"]
    env = services[_find(services, "airflow")]["environment"]
    cmd = services[_find(services, "agent")]["command"]
    assert env["CASSANDRA_CDC_STORE_URL"] == cmd[cmd.index("--store-url") + 1]
    assert env["CASSANDRA_CDC_CLUSTER"] == cmd[cmd.index("--cluster") + 1]
    assert env["CASSANDRA_CDC_SCHEMA_SOURCE"] == "driver" and "AIRFLOW_CONN_CASSANDRA_CDC_CASSANDRA" in env


def _copy_sources(dockerfile: Path) -> list:
    out = []
    for line in dockerfile.read_text().splitlines():
        m = re.match(r"^\s*COPY\s+(?!--from)(.+)$", line)
        if m:
            parts = m.group(1).split()
            out += [p for p in parts[:-1] if not p.startswith("--")]
    return out


def test_dockerfiles_copy_files_that_exist():
    compose = _compose()
    builds = [svc["build"] for svc in compose["services"].values() if isinstance(svc.get("build"), dict)]
    assert builds
    for build in builds:
        context = (DOCKER / build["context"]).resolve()
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), dockerfile
        sources = _copy_sources(dockerfile)
        assert sources, f"{dockerfile} copies nothing"
        for src in sources:
            assert (context / src).exists(), f"{dockerfile.name}: COPY {src} (not in {context})"
