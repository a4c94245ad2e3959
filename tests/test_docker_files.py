"""docker/: the compose file describes the production-like stack, and every file the images copy exists.

Docker cannot run here, so these checks are structural: they parse the compose file and the Dockerfiles.
"""
from __future__ import annotations

import re
import tomllib
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


def test_cassandra_starts_with_the_script_that_enables_cdc_and_the_agent_runs_beside_it():
    services = _compose()["services"]
    cassandra = services[_find(services, "cassandra:")]
    agent = services[_find(services, "agent")]
    assert cassandra["image"].startswith("cassandra:5.")          # the version the tests run for real
    # cdc_enabled is switched on by the script the container starts with (mounted from docker/)
    mounts = {m.split(":")[1]: m.split(":")[0] for m in cassandra["volumes"]}
    entry = cassandra["entrypoint"][0]
    script = DOCKER / mounts[entry]
    assert script == DOCKER / "cassandra" / "enable-cdc.sh" and script.is_file(), script
    assert agent["command"][:2] == ["cassandra-cdc", "agent"]


def _yaml_setting(script: str, name: str) -> str:
    m = re.search(rf"^setting {name} (\S+)$", script, re.M)
    assert m, f"enable-cdc.sh does not set {name}"
    return m.group(1)


def _volume_of(mounts: list, path: str) -> tuple:
    """(volume source, path inside the volume) of the deepest mount holding ``path``."""
    best = None
    for m in mounts:
        source, target = m.split(":")[0], m.split(":")[1].rstrip("/")
        if path == target or path.startswith(target + "/"):
            if best is None or len(target) > len(best[1]):
                best = (source, target)
    assert best is not None, f"{path} is on no volume"
    return best[0], path[len(best[1]):]


def test_commit_log_and_cdc_raw_share_one_volume_and_the_agent_sees_the_same_files():
    """Cassandra hard-links segments from the commit log into cdc_raw: both must be on one filesystem (one
    volume), and the agent must see cdc_raw on that same volume (it reads, then deletes what it shipped)."""
    compose = _compose()
    services = compose["services"]
    cassandra = services[_find(services, "cassandra:")]
    agent = services[_find(services, "agent")]
    script = (DOCKER / "cassandra" / "enable-cdc.sh").read_text()
    commitlog = _yaml_setting(script, "commitlog_directory")
    cdc_raw = _yaml_setting(script, "cdc_raw_directory")
    assert _yaml_setting(script, "cdc_enabled") == "true"
    volumes = [m for m in cassandra["volumes"] if not m.startswith(".")]
    log_volume, _ = _volume_of(volumes, commitlog)
    raw_volume, raw_inside = _volume_of(volumes, cdc_raw)
    assert log_volume == raw_volume and log_volume in compose["volumes"], (log_volume, raw_volume)
    cmd = agent["command"]
    agent_volume, agent_inside = _volume_of(agent["volumes"], cmd[cmd.index("--cdc-raw") + 1])
    assert (agent_volume, agent_inside) == (raw_volume, raw_inside)
    assert not any(m.endswith(":ro") for m in agent["volumes"] if m.startswith(raw_volume + ":")), \
        "the agent deletes the segments it shipped: its cdc_raw mount cannot be read-only"


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


def _dockerfile(build: dict) -> Path:
    """The Dockerfile a compose service's ``build`` names (its path is relative to the build context)."""
    return (DOCKER / build["context"]).resolve() / build["dockerfile"]


def test_dockerfiles_copy_files_that_exist():
    compose = _compose()
    builds = [svc["build"] for svc in compose["services"].values() if isinstance(svc.get("build"), dict)]
    assert builds
    for build in builds:
        context = (DOCKER / build["context"]).resolve()
        dockerfile = _dockerfile(build)
        assert dockerfile.is_file(), dockerfile
        sources = _copy_sources(dockerfile)
        assert sources, f"{dockerfile} copies nothing"
        for src in sources:
            assert (context / src).exists(), f"{dockerfile.name}: COPY {src} (not in {context})"


def _stages(dockerfile: Path) -> dict:
    """Each stage's lines (comments and blank lines left out), by its name (`FROM ... AS name`; the last stage,
    which the image is, under ``""``)."""
    stages, name = {}, None
    for line in dockerfile.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?\s*$", line, re.I)
        if m:
            name = m.group(2) or ""
            stages[name] = [line]
        else:
            stages[name].append(line)
    return stages


def _project() -> dict:
    """pyproject.toml's ``[project]`` table."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _workdir(stage: list) -> str:
    """The working directory a stage ends in (its last WORKDIR)."""
    return [line.split()[1] for line in stage if line.startswith("WORKDIR")][-1]


# Python of the base images the stages start from: a tag names it, or the distribution's python3 does (Debian 12,
# bookworm: 3.11). An image not listed here fails the check below until its Python is looked up and added.
BASE_PYTHON = {r"^python:3\.11(-slim)?(-bookworm)?$": (3, 11), r"^apache/airflow:[\d.]+-python3\.11$": (3, 11),
               r"^rust:[\d.]+-slim-bookworm$": (3, 11),
               # Ubuntu 22.04's python3 (apache/spark-docker: FROM spark:...-ubuntu, apt-get install python3)
               r"^apache/spark:[\d.]+-python3$": (3, 10)}


def _pipeline_dockerfiles() -> dict:
    """The images that run the transform (Airflow's local Spark and the in-process path, and the Spark
    executors), by service."""
    services = _compose()["services"]
    return {name: _dockerfile(svc["build"]) for name, svc in services.items()
            if isinstance(svc.get("build"), dict) and ("airflow" in name or "spark" in name)}


def test_the_images_that_run_the_pipeline_install_the_compiled_core_built_in_a_builder_stage():
    """Without it, the executors and Airflow's transform would run the pure-Python decoder and engine (README, The
    compiled core): a build fails instead if the wheel does not load."""
    files = _pipeline_dockerfiles()
    assert {n for n in files if "spark" in n} and {n for n in files if "airflow" in n}, sorted(files)
    native = set()
    for dockerfile in files.values():
        stages = _stages(dockerfile)
        builder = " ".join(stages.get("native", []))
        assert "COPY native ./native" in builder and "native/build.py --wheel /wheels" in builder, dockerfile.name
        image = " ".join(stages[""])
        assert re.search(r"COPY --from=native /wheels (\S+)", image), f"{dockerfile.name}: the wheel is not copied"
        assert re.search(r"pip install .*\*\.whl", image) and 'python -c "import cdc_native"' in image, \
            f"{dockerfile.name}: the wheel is not installed, or its import not checked"
        native.add("\n".join(stages["native"]))
    assert len(native) == 1, "Dockerfile.airflow and Dockerfile.spark build the compiled core differently"


def test_every_stage_that_installs_the_package_has_the_python_it_requires():
    """pyproject.toml's requires-python, against each stage's base image (the apache/spark images carry Ubuntu
    22.04's Python 3.10, on which `pip install .` refuses the package)."""
    spec = _project()["requires-python"]
    least = tuple(int(x) for x in re.fullmatch(r">=\s*(\d+)\.(\d+)", spec).groups())
    for dockerfile in sorted(DOCKER.glob("Dockerfile.*")):
        for stage in _stages(dockerfile).values():
            if not any("pip install" in line for line in stage):
                continue
            base = stage[0].split()[1]
            known = [v for pattern, v in BASE_PYTHON.items() if re.match(pattern, base)]
            assert known, f"{dockerfile.name}: which Python does {base} have? (BASE_PYTHON)"
            assert known[0] >= least, f"{dockerfile.name}: {base} has Python {known[0]}, the package needs {spec}"


def test_the_spark_image_runs_the_spark_version_the_driver_is_pinned_to():
    """A standalone cluster's daemons and executors must be the driver's Spark version: the image installs pip's
    pyspark through the package's `spark` extra, constrained by requirements.txt, which pins the driver's."""
    spark = _stages(DOCKER / "Dockerfile.spark")[""]
    text = " ".join(spark)
    assert "-c /tmp/constraints.txt" in text and "requirements.txt > /tmp/constraints.txt" in text
    assert re.search(r'pip install [^&]*"\.\[spark\]"', text)
    extra = _project()["optional-dependencies"]["spark"]
    pinned = re.search(r"^pyspark\S*==(\S+)", (REPO / "requirements.txt").read_text(), re.M).group(1)
    assert extra == [f"pyspark[sql]=={pinned}"], (extra, pinned)
    # the compose file starts the daemons with the image's spark-class
    services = _compose()["services"]
    for name in ("spark-master", "spark-worker"):
        assert services[name]["command"][0] == "/opt/spark/bin/spark-class"
    assert "ENV SPARK_HOME=/opt/spark" in text and "/opt/spark" in text.split("ln -s", 1)[1]


def test_the_build_context_leaves_out_the_virtualenv_and_build_trees():
    """The context is the repository root: without these, every build would send gigabytes, and the builder stage's
    `COPY native` would carry native/target's build products."""
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for entry in (".venv/", ".jvm", "native/target/"):
        assert entry in ignored, entry


def test_the_airflow_image_has_the_spark_jars_where_spark_jars_looks_by_default():
    """A batch run on Spark (a backfill's, one above driver_batch_max_bytes) needs the Delta and s3a jars: the image
    fetches the parts `spark_jars` defaults to with their poms, into .jvm/lib of the directory the package is
    installed from (editable), where the default looks."""
    from cdc_lib.spark.conf import DEFAULT_JAR_DIRS, REPO_ROOT
    stages = _stages(DOCKER / "Dockerfile.airflow")
    fetch = " ".join(stages["jars"])
    parts = re.search(r"for part in ([\w ]+); do", fetch).group(1).split()
    assert sorted(parts) == sorted(d.name for d in DEFAULT_JAR_DIRS)
    assert all(d.parent == REPO_ROOT / ".jvm" / "lib" for d in DEFAULT_JAR_DIRS)
    for part in parts:
        assert f"COPY jvm/{part}/pom.xml /src/jvm/{part}/pom.xml" in fetch
    assert "dependency:copy-dependencies -DoutputDirectory=/jars/$part" in fetch
    image = stages[""]
    workdir = _workdir(image)
    assert "COPY --from=jars /jars ./.jvm/lib" in image
    assert "RUN pip install --no-cache-dir --no-deps -e ." in image and workdir == "/opt/cassandra-cdc"


def test_the_airflow_image_installs_the_package_into_a_directory_its_user_owns():
    """WORKDIR creates directories as root whatever USER is (moby/moby#36677): `pip install -e .`, run as the
    airflow user, writes the package's metadata into the directory, which must be made the user's first."""
    image = _stages(DOCKER / "Dockerfile.airflow")[""]
    workdir = _workdir(image)
    text = "\n".join(image)
    made = text.index(f"chown airflow:0 {workdir}")
    assert made < text.index("USER airflow") < text.index("pip install --no-cache-dir --no-deps -e .")
