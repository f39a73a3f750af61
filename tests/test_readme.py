"""Every code block of README.md runs, in document order, against servers this module
starts: ``python`` blocks as scripts (a ``test_*.py`` file block with pytest), and the
``console``/``sh`` blocks that call ``sepp-lite`` as shell commands. A block marked
``<!-- file: NAME -->`` is also written to NAME in the shared working directory first.
Only the first block (``make demo``, ``make test``) and ``pip install`` lines do not
run: they would recurse into this suite or need the network. Without the otel extra,
the OpenTelemetry example must stop at its first OpenTelemetry import.

The blocks see ``SEPP_ADDR`` (a plain server with dead-letter retention) and
``SEPP_TLS_ADDR``, ``SEPP_CA_FILE``, ``SEPP_API_KEY`` (a TLS server that wants that key).
A console command may end with ``# exits N`` to expect that status instead of 0;
``sepp-lite serve`` runs on a free port until it is listening, then gets SIGTERM.

The examples must not lean on each other's leftovers: each section's examples use
queues of their own (checked statically), and the sections also run in reverse order
on fresh servers. Setup commands that need the network or other software (``pip
install``, ``make dist``, the real server's ``docker run``) are not run here; CI
(``.ci/run``) runs the Install section's.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from tests.pki import ca_pem, server_pem

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # where the `sepp-lite` console script is installed
SHELLS = ("console", "sh", "shell", "bash")
API_KEY = "readme-key-0123456789"
BLOCK_TIMEOUT = 90


# Shell commands a reader runs to set up, which this suite does not run.
SETUP_COMMANDS = ("pip install ", "make dist", "docker run ", "cargo install ")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    file: Optional[str]  # from a <!-- file: NAME --> line right before the fence
    section: str = ""  # the ## heading it is under

    @property
    def where(self) -> str:
        return f"README.md line {self.line}"

    def commands(self) -> list[str]:
        """Shell commands: ``$ `` lines in a console block, every line in sh; a trailing
        backslash continues a command on the next line."""
        out: list[str] = []
        pending = ""
        for raw in self.text.splitlines():
            line = raw.strip()
            if self.lang == "console":
                if not pending and not line.startswith("$ "):
                    continue  # output shown in the README, not checked
                line = line[2:] if not pending else line
            elif not pending and (not line or line.startswith("#")):
                continue
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip() + " "
                continue
            out.append(pending)
            pending = ""
        return out

    @property
    def runs(self) -> bool:
        if self.lang == "python":
            return True
        return self.lang in SHELLS and any(c.startswith("sepp-lite ") for c in self.commands())


FENCE = re.compile(r"^```(\S*)\s*$")
FILE_MARK = re.compile(r"^<!-- file: (\S+) -->$")


def read_blocks() -> list[Block]:
    lines = README.read_text().splitlines()
    blocks: list[Block] = []
    index = 0
    section = ""
    while index < len(lines):
        if lines[index].startswith("## "):
            section = lines[index][3:]
        match = FENCE.match(lines[index])
        if not match or not match.group(1):
            index += 1
            continue
        start, body = index, []
        index += 1
        while index < len(lines) and lines[index] != "```":
            body.append(lines[index])
            index += 1
        assert index < len(lines), f"README.md line {start + 1}: unclosed code block"
        mark = FILE_MARK.match(lines[start - 1]) if start else None
        name = mark.group(1) if mark else None
        blocks.append(Block(start + 1, match.group(1), "\n".join(body) + "\n", name, section))
        index += 1
    return blocks


BLOCKS = read_blocks()
RUNNABLE = [block for block in BLOCKS if block.runs]


# -- the servers and the working directory ----------------------------------------------


def start_server(*args: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sepp_lite.testing", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"addr=127\.0\.0\.1:(\d+) ", line)
    if not match:
        stop(proc)
        raise AssertionError(f"the test server did not start: {line!r}")
    return proc, int(match.group(1))


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@dataclass
class Env:
    workdir: Path
    vars: dict[str, str]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from make_env(tmp_path_factory)


def make_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """Both servers, the blocks' working directory (with every file block written)
    and the environment the blocks run with."""
    pki = tmp_path_factory.mktemp("pki")
    pem = server_pem()
    (pki / "ca.pem").write_bytes(ca_pem())
    (pki / "key.pem").write_bytes(pem["tls_key"])
    (pki / "cert.pem").write_bytes(pem["tls_cert"])
    workdir = tmp_path_factory.mktemp("readme")
    for block in BLOCKS:
        if block.file is not None:
            (workdir / block.file).write_text(block.text)
    plain, plain_port = start_server("--dead-letter-retention", "3600")
    try:
        tls_args = ["--tls-cert", str(pki / "cert.pem"), "--tls-key", str(pki / "key.pem")]
        secure, tls_port = start_server(*tls_args, "--api-key", API_KEY)
    except BaseException:
        stop(plain)
        raise
    variables = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
    variables.update(
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        SEPP_ADDR=f"127.0.0.1:{plain_port}",
        SEPP_TLS_ADDR=f"localhost:{tls_port}",
        SEPP_CA_FILE=str(pki / "ca.pem"),
        SEPP_API_KEY=API_KEY,
    )
    try:
        yield Env(workdir, variables)
    finally:
        stop(plain)
        stop(secure)


# -- running blocks -------------------------------------------------------------------


def have_otel_sdk() -> bool:
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def run(block: Block, env: Env, argv: list[str], expected: int = 0, must_say: str = "") -> None:
    try:
        done = subprocess.run(
            argv,
            cwd=env.workdir,
            env=env.vars,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: still running after {BLOCK_TIMEOUT} s: {argv}")
    if done.returncode != expected or must_say not in done.stderr:
        pytest.fail(
            f"{block.where}: {' '.join(argv)} exited {done.returncode}, expected {expected}"
            + (f" saying {must_say!r}" if must_say else "")
            + "\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )


def run_python(block: Block, env: Env) -> None:
    name = block.file or f"readme_block_{block.line}.py"
    path = env.workdir / name
    path.write_text(block.text)
    if Path(name).name.startswith("test_"):
        run(block, env, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name])
    elif "opentelemetry" in block.text and not have_otel_sdk():
        # The suite also runs without the otel extra (.ci/run): there the block must
        # stop at its first OpenTelemetry import and nowhere else.
        run(block, env, [sys.executable, name], 1, "No module named 'opentelemetry")
    elif "cron=" in block.text and importlib.util.find_spec("cronsim") is None:
        # Likewise without the cron extra: the first cron= schedule says what is missing.
        run(block, env, [sys.executable, name], 1, "need the cron extra")
    else:
        run(block, env, [sys.executable, name])


def expected_status(command: str) -> tuple[str, int]:
    """The command without its comment, and the ``# exits N`` status (default 0)."""
    text, _, comment = command.partition(" #")
    match = re.match(r"\s*exits (\d+)", comment)
    return text.strip(), int(match.group(1)) if match else 0


def run_serve(block: Block, env: Env, command: str) -> None:
    # A free port instead of the documented one (the last --port wins).
    proc = subprocess.Popen(
        ["/bin/sh", "-c", f"exec {command} --port 0"],
        cwd=env.workdir,
        env=env.vars,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        if "queue server listening" not in ready:
            pytest.fail(f"{block.where}: {command} did not start: {ready!r}")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(BLOCK_TIMEOUT)
        if code != 0:
            pytest.fail(f"{block.where}: {command} exited {code} after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.communicate()


def run_shell(block: Block, env: Env) -> None:
    for line in block.commands():
        command, expected = expected_status(line)
        if command.startswith("sepp-lite serve"):
            run_serve(block, env, command)
        else:
            run(block, env, ["/bin/sh", "-c", command], expected)


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"line{b.line}" for b in RUNNABLE])
def test_readme_block(block: Block, env: Env) -> None:
    if block.lang == "python":
        run_python(block, env)
    else:
        run_shell(block, env)


# -- the README's shape -----------------------------------------------------------------


def test_readme_begins_with_make_demo_and_make_test() -> None:
    lines = README.read_text().splitlines()
    assert lines[0] == "# sepp_lite" and lines[1] == ""
    first = BLOCKS[0]
    assert first.line == 3 and first.lang == "sh"
    assert [command.split("#")[0].strip() for command in first.commands()] == [
        "make demo",
        "make test",
    ]


def test_every_block_runs_or_is_a_setup_command() -> None:
    """No block is left untested by accident: what does not run is the first block,
    ``pip install`` lines, and data files the commands read."""
    for block in BLOCKS:
        if block.runs or block is BLOCKS[0]:
            continue
        if block.file is not None:
            assert block.lang not in SHELLS, f"{block.where}: a shell block as a file"
            continue
        commands = block.commands()
        assert block.lang in SHELLS and commands, f"{block.where}: a block no test runs"
        assert all(c.startswith(SETUP_COMMANDS) for c in commands), f"{block.where}: {commands}"


def test_the_block_reader_finds_what_it_should() -> None:
    """The runner's own parsing, so a README edit cannot make blocks vanish quietly."""
    langs = [block.lang for block in BLOCKS]
    assert langs.count("python") >= 8 and langs.count("console") >= 5
    assert {b.file for b in BLOCKS} >= {"tasks.py", "jobs.jsonl", "test_billing.py"}
    text = "$ sepp-lite a \\\n  --b\noutput\n$ sepp-lite c # exits 1\n"
    console = Block(1, "console", text, None)
    assert console.commands() == ["sepp-lite a --b", "sepp-lite c # exits 1"]
    assert expected_status("sepp-lite c # exits 1") == ("sepp-lite c", 1)
    assert expected_status("sepp-lite c # a comment") == ("sepp-lite c", 0)


# -- examples that stand alone ----------------------------------------------------------

# Where an example names its queues: EnqueueRequest("q", ...) or queue="q", a Worker's
# or ReserveOptions' list, and the command line's QUEUE and --queue.
_ONE_QUEUE = re.compile(r'EnqueueRequest\(\s*(?:queue=)?"([^"]+)"')
_QUEUE_LIST = re.compile(r"(?:Worker\(\s*client,\s*|ReserveOptions\(\s*)\[([^\]]*)\]")
_CLI_QUEUES = re.compile(r"sepp-lite (?:enqueue|drain-dead-letters)(?: --\S+)* (?!-)(\S+)")
_CLI_QUEUE_OPTION = re.compile(r"--queue (\S+)")


def queues_of(block: Block) -> set[str]:
    """The queue names a block uses (on the shared servers)."""
    if block.lang in SHELLS:
        text = "\n".join(block.commands())
        return set(_CLI_QUEUES.findall(text)) | set(_CLI_QUEUE_OPTION.findall(text))
    names = set(_ONE_QUEUE.findall(block.text))
    for listed in _QUEUE_LIST.findall(block.text):
        names.update(re.findall(r'"([^"]+)"', listed))
    return names


def test_each_section_uses_queues_of_its_own() -> None:
    owner: dict[str, str] = {}
    for block in RUNNABLE + [b for b in BLOCKS if b.file == "tasks.py"]:
        if "SeppTestServer(" in block.text:
            continue  # a test with a server of its own
        for queue in queues_of(block):
            assert owner.setdefault(queue, block.section) == block.section, (
                f"{block.where}: queue {queue!r} is used in {owner[queue]!r} too"
            )
    # The parsing above finds what the examples use.
    assert {"emails", "billing", "reports", "payments", "newsletters", "exports"} <= set(owner)


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield from make_env(tmp_path_factory)


@pytest.mark.slow
def test_the_sections_also_run_in_reverse_order(fresh_env: Env) -> None:
    """Each section's examples work whatever ran before them: here on fresh servers,
    last section first (within a section, in order: the command line's drain needs
    its worker)."""
    sections: dict[str, list[Block]] = {}
    for block in RUNNABLE:
        sections.setdefault(block.section, []).append(block)
    assert len(sections) >= 8
    for name in reversed(list(sections)):
        for block in sections[name]:
            test_readme_block(block, fresh_env)


# -- what a user looks for --------------------------------------------------------------


def test_the_sections_a_user_looks_for_are_there() -> None:
    headings = {block.section for block in BLOCKS} | set(
        re.findall(r"^## (.+)$", README.read_text(), re.MULTILINE)
    )
    for wanted in (
        "Install",
        "Running the real sepp server",
        "Consuming",
        "At-least-once delivery: make handlers idempotent",
        "Logging",
        "Testing your code",
        "Troubleshooting",
        "Versions and changes",
    ):
        assert wanted in headings, wanted
    text = README.read_text()
    assert "pytest-asyncio" in text and "run_until_drained" in text
    assert "| 130 |" in text  # the exit status of an interrupted command
    # `pip install sepp-lite` is not a command to run yet: no index serves it. Only the
    # prose may name it, as what comes once it is published.
    assert not [b.where for b in BLOCKS if "install sepp-lite" in b.text]
    prose = " ".join(text.split())
    assert "Once sepp_lite is published on PyPI (not yet), `pip install sepp-lite`" in prose


def test_the_changelog_has_a_versioning_policy_and_this_version() -> None:
    from sepp_lite import __version__

    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", changelog, re.MULTILINE)
    assert headings[:2] == ["Versioning", "[Unreleased]"]
    assert f"[{__version__}]" in [heading.split(" - ")[0] for heading in headings]
    assert "Semantic Versioning" in changelog
