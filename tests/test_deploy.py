"""deploy/ as tested recipes: the Kubernetes manifests against the API's schemas
(kubernetes-validate, offline, strict) and the worker command's own options; the
systemd unit with systemd-analyze; the Dockerfile's steps run as written, with its
default build arguments, on the build context `make dist` leaves (there is no Docker
engine here), after which the installed command runs the example worker against a
real server; and the README's commands that install the wheel with an extra."""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import sepp_lite as sepp
from sepp_lite.cli import build_parser
from sepp_lite.testing import SeppTestServer
from tests.client_helpers import unique_queue
from tests.repo_files import repo_files

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKER = DEPLOY / "docker"


def deploy_files() -> list[Path]:
    """The files under deploy/, without the bytecode a test that imports
    deploy/docker/tasks.py may leave there."""
    return [p for p in DEPLOY.rglob("*") if p.is_file() and "__pycache__" not in p.parts]


PYPY = platform.python_implementation() == "PyPy"
# The oldest Kubernetes minor still commonly run, and the newest the validator knows.
K8S_VERSIONS = ("1.28.0", "1.37.0")


def example_tasks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_example_tasks", DOCKER / "tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker_args(argv: list[str]) -> Any:
    """``sepp-lite worker ARGV`` parsed by the command's own parser (SystemExit on a
    bad option)."""
    args = build_parser().parse_args(["worker", *argv])
    assert args.command == "worker"
    return args


# -- Kubernetes -------------------------------------------------------------------------


def all_manifests() -> list[dict[str, Any]]:
    import yaml

    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


def is_keda(doc: dict[str, Any]) -> bool:
    return str(doc.get("apiVersion", "")).startswith("keda.sh/")


def manifests() -> list[dict[str, Any]]:
    """The built-in kinds, which kubernetes-validate knows."""
    return [doc for doc in all_manifests() if not is_keda(doc)]


def keda_manifests(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in all_manifests() if is_keda(doc) and doc["kind"] == kind]


@pytest.fixture
def kubernetes_validate() -> Any:
    if PYPY:
        pytest.skip("kubernetes-validate's jsonschema needs rpds-py: no wheel for PyPy 3.9")
    import kubernetes_validate

    return kubernetes_validate


def test_manifests_match_the_kubernetes_schema(kubernetes_validate: Any) -> None:
    docs = manifests()
    assert [doc["kind"] for doc in docs] == ["Deployment"]
    for doc in docs:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    # The validator does catch mistakes (so the check above means something).
    broken = copy.deepcopy(docs[0])
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["livenessProbe"]["httpGet"]["paht"] = "/livez"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_the_deployment_probes_the_worker_and_outlasts_its_shutdown() -> None:
    if PYPY:
        pytest.skip("PyYAML comes with kubernetes-validate, which PyPy 3.9 cannot install")
    [deployment] = manifests()
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    args = worker_args(container["args"])
    port = int(args.http.rpartition(":")[2])
    [named] = [p for p in container["ports"] if p["containerPort"] == port]
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": named["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": named["name"]}
    # On CPython a process uses one core: as many processes as CPUs requested.
    assert args.processes == int(container["resources"]["requests"]["cpu"])
    assert args.log_format == "json"  # for the cluster's log pipeline
    assert container["resources"]["limits"]["memory"]
    assert pod["terminationGracePeriodSeconds"] > example_tasks().SHUTDOWN_TIMEOUT + 5
    [key] = [env for env in container["env"] if env["name"] == "SEPP_API_KEY"]
    assert set(key) == {"name", "valueFrom"} and "secretKeyRef" in key["valueFrom"]
    # A read-only root file system needs a writable /tmp for the metrics files.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert any(v["name"] == mount["name"] and "emptyDir" in v for v in pod["volumes"])


# -- KEDA -------------------------------------------------------------------------------
#
# KEDA's kinds are custom resources, which kubernetes-validate does not know: they are
# checked against the openAPIV3Schema of KEDA's CRDs (tests/keda/, from KEDA v2.20.2),
# strictly, as kubectl's server-side field validation would. A trigger's metadata is a
# map of strings there, so its keys are checked against the parameters the scalers
# read (KEDA v2.20.2: pkg/scalers/prometheus_scaler.go, metrics_api_scaler.go and
# authentication/authentication_types.go, their `keda:"name=..."` tags).

KEDA_SCHEMAS = ROOT / "tests" / "keda"
TRIGGER_PARAMETERS = {
    "prometheus": {
        "required": {"serverAddress", "query", "threshold"},
        "optional": {
            "queryParameters", "activationThreshold", "namespace", "customHeaders",
            "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout", "identityOwner",
            "authModes", "authMode",
        },
    },
    "metrics-api": {
        "required": {"url", "valueLocation", "targetValue"},
        "optional": {
            "activationTargetValue", "format", "unsafeSsl", "timeout", "aggregationType",
            "aggregateFromKubeServiceEndpoints", "authModes", "authMode", "apiKey", "method",
            "keyParamName",
        },
    },
}  # fmt: skip
# The bearer token's names among a TriggerAuthentication's parameters.
BEARER_PARAMETERS = {"bearerToken", "token"}
# The sepp server's OpenTelemetry gauges (src/metrics.rs, u64 observable gauges without
# a unit) as opentelemetry-prometheus 0.32 names them: each character that Prometheus
# does not allow becomes "_"; a unit would add a suffix (none here); "_total" is only
# for counters (monotonic sums).
GAUGES = {"sepp.queue.ready": "sepp_queue_ready", "sepp.queue.inflight": "sepp_queue_inflight"}


def strict(schema: Any) -> Any:
    """kubectl's strict field validation: an object schema with properties takes no
    others, unless it says otherwise (additionalProperties, or
    x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        if not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


def keda_validator(kind: str) -> Any:
    import jsonschema
    import yaml

    schema = yaml.safe_load((KEDA_SCHEMAS / f"{kind.lower()}.yaml").read_text())
    return jsonschema.Draft7Validator(strict(schema))


def keda_errors(doc: dict[str, Any]) -> list[str]:
    """What is wrong with a KEDA manifest: its schema's errors, then its triggers'."""
    errors = [e.message for e in keda_validator(doc["kind"]).iter_errors(doc)]
    if doc.get("apiVersion") != "keda.sh/v1alpha1":
        errors.append(f"apiVersion {doc.get('apiVersion')!r} is not keda.sh/v1alpha1")
    for trigger in doc.get("spec", {}).get("triggers", []) if doc["kind"] == "ScaledObject" else []:
        known = TRIGGER_PARAMETERS.get(trigger["type"])
        if known is None:
            errors.append(f"trigger type {trigger['type']!r} is not checked here")
            continue
        keys = set(trigger["metadata"])
        errors += [f"{trigger['type']}: missing {k}" for k in known["required"] - keys]
        unknown = keys - known["required"] - known["optional"]
        errors += [f"{trigger['type']}: unknown parameter {k}" for k in sorted(unknown)]
    return errors


@pytest.fixture
def jsonschema_available() -> None:
    if PYPY:
        pytest.skip("jsonschema comes with kubernetes-validate, which PyPy 3.9 cannot install")


@pytest.mark.usefixtures("jsonschema_available")
def test_the_keda_manifests_match_keda_s_schemas() -> None:
    scaled = keda_manifests("ScaledObject")
    auths = keda_manifests("TriggerAuthentication")
    assert len(scaled) == 2 and len(auths) == 1  # on the gauges, on the admin API
    for doc in scaled + auths:
        assert keda_errors(doc) == [], doc["metadata"]["name"]
    # The checks catch mistakes: a misspelt field, a misspelt or missing trigger
    # parameter, a TriggerAuthentication's secret without its key.
    broken = copy.deepcopy(scaled[0])
    broken["spec"]["minReplicas"] = broken["spec"].pop("minReplicaCount")
    assert any("minReplicas" in error for error in keda_errors(broken))
    broken = copy.deepcopy(scaled[0])
    metadata = broken["spec"]["triggers"][0]["metadata"]
    metadata["treshold"] = metadata.pop("threshold", None) or metadata.pop("targetValue")
    assert {e.split(": ", 1)[1].split()[0] for e in keda_errors(broken)} == {"missing", "unknown"}
    broken = copy.deepcopy(auths[0])
    del broken["spec"]["secretTargetRef"][0]["key"]
    assert any("'key' is a required property" in error for error in keda_errors(broken))


def worker_deployment() -> tuple[dict[str, Any], Any]:
    [deployment] = manifests()
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, worker_args(container["args"])


def capacity() -> int:
    """What one pod of worker.yaml handles at once: its processes times each one's
    max_in_flight (the example worker's)."""
    _, args = worker_deployment()
    return int(args.processes) * int(example_tasks().MAX_IN_FLIGHT)


def target(trigger: dict[str, Any]) -> str:
    return str(trigger["metadata"].get("threshold") or trigger["metadata"]["targetValue"])


def activation(trigger: dict[str, Any]) -> str:
    metadata = trigger["metadata"]
    return str(metadata.get("activationThreshold", metadata.get("activationTargetValue")))


def test_the_scaled_objects_scale_the_worker_by_a_pod_s_capacity() -> None:
    if PYPY:
        pytest.skip("PyYAML comes with kubernetes-validate, which PyPy 3.9 cannot install")
    deployment, _ = worker_deployment()
    scaled_objects = keda_manifests("ScaledObject")
    assert scaled_objects
    for scaled in scaled_objects:
        ref = scaled["spec"]["scaleTargetRef"]
        assert ref["name"] == deployment["metadata"]["name"]
        assert ref.get("kind", "Deployment") == "Deployment"
        assert scaled["spec"]["maxReplicaCount"] >= scaled["spec"].get("minReplicaCount", 0)
        for trigger in scaled["spec"]["triggers"]:
            assert target(trigger) == str(capacity())  # jobs / capacity = pods
            assert activation(trigger) == "0"  # one job wakes a pod


def queue_selector(queues: list[str]) -> str:
    return f'queue="{queues[0]}"' if len(queues) == 1 else f'queue=~"{"|".join(queues)}"'


def test_the_prometheus_trigger_adds_the_gauges_of_the_worker_s_queues() -> None:
    if PYPY:
        pytest.skip("PyYAML comes with kubernetes-validate, which PyPy 3.9 cannot install")
    [trigger] = [
        t for s in keda_manifests("ScaledObject") for t in s["spec"]["triggers"]
        if t["type"] == "prometheus"
    ]  # fmt: skip
    query = trigger["metadata"]["query"]
    assert set(re.findall(r"\bsepp_\w+", query)) == set(GAUGES.values())
    for otel, prometheus in GAUGES.items():
        assert re.sub(r"[^A-Za-z0-9_:]", "_", otel) == prometheus
        # Each gauge is summed over the worker's queues, and empty counts as 0.
        [selector] = re.findall(rf"sum\({prometheus}\{{([^}}]*)\}}\) or vector\(0\)", query)
        assert selector == queue_selector(example_tasks().QUEUES)
    assert re.search(r"\)\s*\+\s*\(", query)  # ready + inflight


def test_the_metrics_api_triggers_read_the_worker_s_queue_as_a_viewer() -> None:
    if PYPY:
        pytest.skip("PyYAML comes with kubernetes-validate, which PyPy 3.9 cannot install")
    [auth] = keda_manifests("TriggerAuthentication")
    [secret] = auth["spec"]["secretTargetRef"]
    assert secret["parameter"] in BEARER_PARAMETERS
    triggers = [
        t for s in keda_manifests("ScaledObject") for t in s["spec"]["triggers"]
        if t["type"] == "metrics-api"
    ]  # fmt: skip
    [queue] = example_tasks().QUEUES
    assert [t["metadata"]["valueLocation"] for t in triggers] == [
        "depths.ready",
        "depths.inflight",
    ]
    for trigger in triggers:
        metadata = trigger["metadata"]
        assert metadata["url"].startswith("https://")  # the key is a bearer token
        assert metadata["url"].endswith(f":9465/admin/api/v1/queues/{queue}")
        assert metadata["format"] == "json" and metadata["authMode"] == "bearer"
        assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}


def test_a_worker_scaled_to_zero_keeps_no_periodic_schedule() -> None:
    """At zero replicas nothing enqueues periodic slots, so nothing would ever wake the
    worker: a ScaledObject may go to zero only for a worker that schedules nothing."""
    if PYPY:
        pytest.skip("PyYAML comes with kubernetes-validate, which PyPy 3.9 cannot install")
    _, args = worker_deployment()
    tasks = example_tasks()
    periodic = [v for v in vars(tasks).values() if isinstance(v, sepp.Tasks) and v.periodic_jobs]
    scaled_objects = keda_manifests("ScaledObject")
    assert scaled_objects
    for scaled in scaled_objects:
        if scaled["spec"].get("minReplicaCount", 0) == 0:
            assert not args.periodic or not periodic


def test_the_production_page_explains_autoscaling_and_queue_depth() -> None:
    """docs/production.md has the recipe's reasons: the query and its gauges, the
    activation threshold, scale to zero and periodic schedules; and where a queue's
    depth can be read, since the client cannot ask for it."""
    text = (ROOT / "docs" / "production.md").read_text(encoding="utf-8")
    sections = dict(re.findall(r"^## (.+)\n((?:(?!^## ).*\n)*)", text, re.MULTILINE))
    keda = " ".join(sections["Autoscaling with KEDA"].split())
    for name in ("keda-prometheus.yaml", "keda-admin-api.yaml", *GAUGES, *GAUGES.values()):
        assert name in keda, name
    for words in ("activation threshold", "`minReplicaCount: 1`", "--no-periodic", "viewer"):
        assert words in keda, words
    depth = " ".join(sections["How many jobs are waiting"].split())
    assert "no call that reports a queue's depth" in depth
    for where in ("admin UI", "/admin/api/v1/queues", "sepp_queue_ready"):
        assert where in depth, where


# -- systemd ----------------------------------------------------------------------------


UNIT = DEPLOY / "systemd" / "sepp-worker.service"


def unit_settings() -> dict[str, str]:
    settings = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def test_the_systemd_unit_runs_the_worker_and_outlasts_its_shutdown() -> None:
    settings = unit_settings()
    command = shlex.split(settings["ExecStart"])
    assert command[0].endswith("/bin/sepp-lite") and command[1] == "worker"
    args = worker_args(command[2:])
    assert args.processes >= 1 and args.http == "127.0.0.1:9464"
    assert settings["KillMode"] == "mixed"  # SIGTERM to the supervisor only
    assert int(settings["TimeoutStopSec"]) > example_tasks().SHUTDOWN_TIMEOUT + 5
    assert settings["Restart"] == "on-failure"
    # The key comes from a root-only file, never from the unit (world-readable).
    assert settings["EnvironmentFile"] and "Environment=SEPP_API_KEY" not in UNIT.read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_analyze_accepts_the_unit(tmp_path: Path) -> None:
    # The same unit, with paths that exist here: verify checks the executable.
    env_file = tmp_path / "env"
    env_file.write_text("SEPP_ADDR=127.0.0.1:50051\n")
    executable = Path(sys.executable).parent / "sepp-lite"
    text = (
        UNIT.read_text()
        .replace("/opt/my-worker/venv/bin/sepp-lite", str(executable))
        .replace("/opt/my-worker", str(tmp_path))
        .replace("/etc/sepp-worker/env", str(env_file))
    )
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert UNIT.name not in done.stderr, done.stderr  # no warning about our unit


# -- the wheel --------------------------------------------------------------------------


def readme_install_commands(page: Path = ROOT / "README.md") -> list[str]:
    """The ``pip install`` lines of the README's Install section that install the wheel
    (or of the documentation site's page that repeats it)."""
    text = page.read_text()
    section = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("pip install") and ".whl" in line]


def wheel_names(text: str) -> set[str]:
    return set(re.findall(r"sepp_lite-[^\s/*]+?-py3-none-any\.whl", text))


def test_every_wheel_named_in_the_docs_is_the_one_make_dist_writes() -> None:
    current = f"sepp_lite-{sepp.__version__}-py3-none-any.whl"
    site = ROOT / "docs" / "getting-started.md"
    texts = [ROOT / "README.md", site, *deploy_files()]
    named = {path: wheel_names(path.read_text()) for path in texts}
    assert named[ROOT / "README.md"] == {current}
    for path, names in named.items():
        assert names <= {current}, path
    assert len(readme_install_commands()) == 3
    assert readme_install_commands(site) == readme_install_commands()  # the ones tested


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("command", readme_install_commands())
def test_the_readme_installs_the_wheel_with_its_extra(
    tmp_path: Path, wheel: Path, command: str
) -> None:
    """The README's commands, run by a shell in a folder holding dist/ as `make dist`
    leaves it, each into a fresh venv (its dependencies from the package index)."""
    (tmp_path / "dist").mkdir()
    shutil.copy(wheel, tmp_path / "dist" / wheel.name)
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    venv_bin = tmp_path / "venv" / "bin"
    env = dict(image_env(), PATH=f"{venv_bin}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        ["/bin/sh", "-c", command.replace("pip install", "pip install -q", 1)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    code = "import sepp_lite, sys; sys.exit('site-packages' not in sepp_lite.__file__)"
    if "[metrics]" in command:
        code += "\nimport prometheus_client"
    check = subprocess.run(
        [str(venv_bin / "python"), "-c", code], cwd=tmp_path, env=env, capture_output=True
    )
    assert check.returncode == 0, check.stderr.decode()


def test_the_glob_with_an_extra_fails_as_the_readme_says(tmp_path: Path, wheel: Path) -> None:
    (tmp_path / "dist").mkdir()
    shutil.copy(wheel, tmp_path / "dist" / wheel.name)
    done = subprocess.run(
        [
            "/bin/sh",
            "-c",
            f"{sys.executable} -m pip install --dry-run dist/sepp_lite-*.whl[metrics]",
        ],
        cwd=tmp_path,
        env=image_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "sepp_lite-*" in done.stderr


# -- the Dockerfile ---------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of deploy/docker/Dockerfile, continuations joined."""
    instructions, pending = [], ""
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        instructions.append((word.upper(), rest.strip()))
        pending = ""
    return instructions


def global_args() -> dict[str, str]:
    """The ``ARG`` defaults before the first ``FROM``, which a stage takes with a bare
    ``ARG NAME``."""
    found: dict[str, str] = {}
    for word, rest in dockerfile():
        if word == "FROM":
            break
        name, _, default = rest.partition("=")
        found[name] = default
    return found


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for instruction in dockerfile():
        if instruction[0] == "FROM":
            found.append([])
        elif found:
            found[-1].append(instruction)
    return found


def expand(text: str, variables: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        return variables.get(match.group(1) or match.group(2), "")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def ignore_pattern(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regular expression over a context-relative path:
    ``*`` and ``?`` stay within one path element, ``**`` crosses them."""
    parts = re.split(r"(\*\*|\*|\?)", pattern.strip("/"))
    wild = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wild.get(part) or re.escape(part) for part in parts))


def sent_to_docker(path: str, patterns: list[str]) -> bool:
    """Whether the build context keeps ``path`` under these .dockerignore lines: the
    last pattern matching the path or a folder above it decides."""
    prefixes = ["/".join(path.split("/")[: n + 1]) for n in range(path.count("/") + 1)]
    kept = True
    for line in patterns:
        keep = line.startswith("!")
        regex = ignore_pattern(line[1:] if keep else line)
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            kept = keep
    return kept


def build_context(target: Path, wheel: Path) -> Path:
    """The context ``docker build -f deploy/docker/Dockerfile .`` sends after ``make
    dist``: the repository's files and the wheel in dist/, filtered by the Dockerfile's
    own ignore file."""
    lines = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    files = {name: ROOT / name for name in repo_files()}
    files[f"dist/{wheel.name}"] = wheel
    for name, source in files.items():
        if sent_to_docker(name, patterns):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target / name)
    return target


class Image:
    """Runs a Dockerfile's stages on this machine: ARG/ENV/WORKDIR/COPY/RUN, with the
    image's absolute paths moved under ``root``, sources taken from ``context`` and
    ``python`` being this interpreter. One file system for every stage, so ``COPY
    --from=build`` finds its files where the build stage left them."""

    # Steps that would change this machine rather than the image's root.
    SKIPPED_RUNS = ("useradd ",)

    def __init__(self, root: Path, context: Path, build_args: dict[str, str]) -> None:
        self.root = root
        self.context = context
        self.build_args = build_args
        self.globals = global_args()
        tools = root / "image-bin"
        tools.mkdir(parents=True)
        (tools / "python").symlink_to(sys.executable)
        self.variables = dict(image_env(), PATH=f"{tools}{os.pathsep}{os.environ['PATH']}")
        self.workdir = root

    def path(self, text: str) -> str:
        """Absolute image paths (``/opt/venv``, ``/tmp/x``) moved under the root."""
        return re.sub(r"(?<![\w.])/(opt|tmp|app)(?=/|$)", lambda m: f"{self.root}/{m[1]}", text)

    def run(self, instructions: list[tuple[str, str]]) -> None:
        ignored = ("USER", "EXPOSE", "STOPSIGNAL", "ENTRYPOINT", "CMD")
        steps = {"ARG": self.arg, "ENV": self.env, "COPY": self.copy, "RUN": self.shell}
        steps["WORKDIR"] = self.cd
        for word, rest in instructions:
            if word not in ignored:
                steps[word](rest)

    def arg(self, rest: str) -> None:
        name, equals, default = rest.partition("=")
        if not equals:
            default = self.globals.get(name, "")
        self.variables[name] = self.build_args.get(name, default)

    def env(self, rest: str) -> None:
        for pair in shlex.split(rest):
            name, _, value = pair.partition("=")
            self.variables[name] = self.path(expand(value, self.variables))

    def cd(self, rest: str) -> None:
        self.workdir = Path(self.path(rest))
        self.workdir.mkdir(parents=True, exist_ok=True)

    def copy(self, rest: str) -> None:
        words = shlex.split(rest)
        if words[0].startswith("--from="):
            return  # the other stage's files are already where they belong
        source, target = expand(words[0], self.variables), self.path(words[1])
        found = self.context / source
        assert found.exists(), f"COPY {rest}: {source} is not in the build context"
        if found.is_dir():
            shutil.copytree(found, target, dirs_exist_ok=True)
        else:
            destination = Path(target) / found.name if target.endswith("/") else Path(target)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(found, destination)

    def shell(self, rest: str) -> None:
        if rest.startswith(self.SKIPPED_RUNS):
            return
        done = subprocess.run(
            ["/bin/sh", "-c", self.path(rest)],
            cwd=self.workdir,
            env=self.variables,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"RUN {rest}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def image_env() -> dict[str, str]:
    """This process's environment without what the image would not have (a venv, a
    PYTHONPATH to this checkout, sepp settings)."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SEPP_")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``make dist`` writes (into a folder of this test run's)."""
    dist = tmp_path_factory.mktemp("dist")
    # Under `make test` the outer make's flags and command-line variables must not leak in.
    outer = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "VENV", "PYTHON", "EXTRAS")
    done = subprocess.run(
        ["make", "-C", str(ROOT), "dist", f"PY={sys.executable}", f"DIST={dist}"],
        env={k: v for k, v in os.environ.items() if k not in outer},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [built] = dist.glob("sepp_lite-*.whl")
    assert built.name == f"sepp_lite-{sepp.__version__}-py3-none-any.whl"
    return built


def test_the_image_runs_the_worker_command() -> None:
    final = stages()[-1]
    entrypoint = [json.loads(rest) for word, rest in final if word == "ENTRYPOINT"][0]
    cmd = [json.loads(rest) for word, rest in final if word == "CMD"][0]
    assert entrypoint == ["sepp-lite", "worker"]
    args = worker_args(cmd)
    assert args.target == "tasks:make_worker" and args.http == ":9464"
    assert ("EXPOSE", "9464") in final and ("USER", "10001:10001") in final


def test_the_ignore_file_sends_only_the_wheel_and_the_worker() -> None:
    patterns = ["*", "!dist/sepp_lite-*.whl", "!deploy/docker/"]
    lines = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    assert [line for line in lines if line and not line.startswith("#")] == patterns
    assert sent_to_docker("dist/sepp_lite-0.2.0-py3-none-any.whl", patterns)
    assert sent_to_docker("deploy/docker/tasks.py", patterns)
    for left_out in ("dist/other-1.0-py3-none-any.whl", ".venv/bin/python", "README.md"):
        assert not sent_to_docker(left_out, patterns)


def test_nothing_in_deploy_installs_sepp_lite_from_the_package_index() -> None:
    """Not published yet: ``pip install sepp-lite`` would find nothing, or someone
    else's package of that name."""
    from_index = re.compile(r"pip install\s+['\"]?sepp-lite\b(?!\S*\s*@)")
    texts = {path: path.read_text() for path in deploy_files()}
    for source in ("_metrics.py", "monitor.py"):
        texts[ROOT / "sepp_lite" / source] = (ROOT / "sepp_lite" / source).read_text()
    for path, text in texts.items():
        assert not from_index.search(text), path
        assert "==0.1.0" not in text, path
    # The check does catch that advice.
    assert from_index.search("pip install 'sepp-lite[metrics]'")
    assert not from_index.search('pip install "sepp-lite[metrics] @ file:///w/x.whl"')


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_the_dockerfile_builds_a_working_worker_from_the_wheel(
    tmp_path: Path, wheel: Path
) -> None:
    """About 20 s: the image's steps with the Dockerfile's default build arguments, on
    the context `make dist` leaves: a venv, the wheel with the metrics extra and its
    dependencies from the package index; then the installed command runs the worker
    module from the image's working directory."""
    context = build_context(tmp_path / "context", wheel)
    image = Image(tmp_path / "image", context, build_args={})
    for stage in stages():
        await asyncio.to_thread(image.run, stage)
    venv_bin = image.root / "opt" / "venv" / "bin"
    assert image.workdir == image.root / "app" and (image.workdir / "tasks.py").exists()
    check = await asyncio.create_subprocess_exec(
        str(venv_bin / "python"),
        "-c",
        "import prometheus_client, sepp_lite, sys\n"
        "sys.exit('site-packages' not in sepp_lite.__file__)",
        cwd=str(tmp_path),
        env=image_env(),
    )
    assert await asyncio.wait_for(check.wait(), 60) == 0  # the metrics extra is in the image
    await run_the_example_worker(venv_bin / "sepp-lite", image.workdir)


@pytest.mark.parametrize("wheels", [0, 2])
def test_the_build_stops_unless_dist_holds_one_wheel(
    tmp_path: Path, wheel: Path, wheels: int
) -> None:
    context = build_context(tmp_path / "context", wheel)
    for extra in range(wheels - 1):
        shutil.copy(wheel, context / "dist" / wheel.name.replace("0", str(extra + 1), 1))
    if wheels == 0:
        shutil.rmtree(context / "dist")
        (context / "dist").mkdir()
    image = Image(tmp_path / "image", context, build_args={})
    with pytest.raises(AssertionError, match=r"expected one sepp_lite wheel in dist/"):
        image.run(stages()[0])


async def run_the_example_worker(executable: Path, workdir: Path) -> None:
    queue = unique_queue()
    async with SeppTestServer() as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            payload = sepp.Payload(b'{"to": "ada@example.com"}', "application/json")
            await client.enqueue(sepp.EnqueueRequest(queue, "send_welcome", payload=payload))
        env = dict(image_env(), SEPP_ADDR=server.addr, WORKER_QUEUES=queue)
        proc = await asyncio.create_subprocess_exec(
            str(executable),
            "worker",
            "tasks:make_worker",
            "--until-idle",
            cwd=str(workdir),
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, err.decode()
        assert "welcoming ada@example.com" in err.decode()
        assert server.counts(queue) == (0, 0, 0, 0)
