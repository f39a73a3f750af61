"""deploy/ as tested recipes: the Kubernetes manifests against the API's schemas
(kubernetes-validate, offline, strict) and the worker command's own options; the
systemd unit with systemd-analyze; and the Dockerfile's build steps run as written in
a fresh venv (there is no Docker engine here), after which the installed command runs
the example worker against a real server."""

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

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
DOCKER = DEPLOY / "docker"
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


def manifests() -> list[dict[str, Any]]:
    import yaml

    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


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
    assert container["resources"]["limits"]["memory"]
    assert pod["terminationGracePeriodSeconds"] > example_tasks().SHUTDOWN_TIMEOUT + 5
    [key] = [env for env in container["env"] if env["name"] == "SEPP_API_KEY"]
    assert set(key) == {"name", "valueFrom"} and "secretKeyRef" in key["valueFrom"]
    # A read-only root file system needs a writable /tmp for the metrics files.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert any(v["name"] == mount["name"] and "emptyDir" in v for v in pod["volumes"])


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


class BuildStage:
    """Runs a Dockerfile stage's ARG/ENV/COPY/RUN on this machine, with the image's
    absolute paths moved under ``root`` and ``python`` being this interpreter."""

    def __init__(self, root: Path, build_args: dict[str, str]) -> None:
        self.root = root
        self.build_args = build_args
        tools = root / "image-bin"
        tools.mkdir()
        (tools / "python").symlink_to(sys.executable)
        self.variables = dict(os.environ, PATH=f"{tools}{os.pathsep}{os.environ['PATH']}")
        self.variables.pop("VIRTUAL_ENV", None)

    def path(self, text: str) -> str:
        """Absolute image paths (``/opt/venv``, ``/tmp/x``) moved under the root."""
        return re.sub(r"(?<![\w.])/(opt|tmp|app)/", lambda m: f"{self.root}/{m.group(1)}/", text)

    def run(self, instructions: list[tuple[str, str]]) -> None:
        steps = {"ARG": self.arg, "ENV": self.env, "COPY": self.copy, "RUN": self.shell}
        for word, rest in instructions:
            steps[word](rest)

    def arg(self, rest: str) -> None:
        name, _, default = rest.partition("=")
        self.variables[name] = self.build_args.get(name, default)

    def env(self, rest: str) -> None:
        for pair in shlex.split(rest):
            name, _, value = pair.partition("=")
            self.variables[name] = self.path(expand(value, self.variables))

    def copy(self, rest: str) -> None:
        source, target = shlex.split(rest)
        destination = Path(self.path(target))
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DOCKER / source, destination)

    def shell(self, rest: str) -> None:
        done = subprocess.run(
            ["/bin/sh", "-c", self.path(rest)],
            env=self.variables,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"RUN {rest}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_image_runs_the_worker_command() -> None:
    final = stages()[-1]
    entrypoint = [json.loads(rest) for word, rest in final if word == "ENTRYPOINT"][0]
    cmd = [json.loads(rest) for word, rest in final if word == "CMD"][0]
    assert entrypoint == ["sepp-lite", "worker"]
    args = worker_args(cmd)
    assert args.target == "tasks:make_worker" and args.http == ":9464"
    assert ("EXPOSE", "9464") in final and ("USER", "10001:10001") in final


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_the_dockerfile_build_steps_install_a_working_worker(tmp_path: Path) -> None:
    """About 20 s: a venv, and sepp-lite[metrics] with its dependencies from PyPI."""
    build = stages()[0]
    assert [word for word, _ in build].count("RUN") == 2
    await asyncio.to_thread(BuildStage(tmp_path, {"SEPP_LITE": f"{ROOT}[metrics]"}).run, build)
    venv_bin = tmp_path / "opt" / "venv" / "bin"
    assert (venv_bin / "sepp-lite").exists()
    check = await asyncio.create_subprocess_exec(
        str(venv_bin / "python"), "-c", "import prometheus_client, sepp_lite"
    )
    assert await asyncio.wait_for(check.wait(), 60) == 0  # the metrics extra is in the image
    await run_the_example_worker(venv_bin / "sepp-lite")


async def run_the_example_worker(executable: Path) -> None:
    queue = unique_queue()
    async with SeppTestServer() as server:
        async with await sepp.SeppClient.connect(server.addr) as client:
            payload = sepp.Payload(b'{"to": "ada@example.com"}', "application/json")
            await client.enqueue(sepp.EnqueueRequest(queue, "send_welcome", payload=payload))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
        env.update(SEPP_ADDR=server.addr, WORKER_QUEUES=queue)
        proc = await asyncio.create_subprocess_exec(
            str(executable),
            "worker",
            "tasks:make_worker",
            "--until-idle",
            cwd=str(DOCKER),
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
