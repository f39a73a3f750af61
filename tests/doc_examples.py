"""Running the code blocks of a Markdown document (README.md, the pages of docs/) against
servers this module starts; tests/test_readme.py and tests/test_docs.py use it.

``python`` blocks run as scripts (a ``test_*.py`` file block with pytest), and the
``console``/``sh`` blocks that call ``sepp-lite`` or ``python`` run as shell commands. A
block marked ``<!-- file: NAME -->`` is also written to NAME in the shared working
directory first; a ``python`` file block that a shell command runs (``$ python NAME``)
runs there, not on its own. Setup commands (``pip install``, ``make ...``, the real
server's ``docker run``) do not run: they would need the network or recurse into this
suite. Without the otel extra, the OpenTelemetry example must stop at its first
OpenTelemetry import.

The blocks see ``SEPP_ADDR`` (a plain server with dead-letter retention) and
``SEPP_TLS_ADDR``, ``SEPP_CA_FILE``, ``SEPP_API_KEY`` (a TLS server that wants that key).
A console command may end with ``# exits N`` to expect that status instead of 0;
``sepp-lite serve`` runs on a free port until it is listening, then gets SIGTERM.

The examples must not lean on each other's leftovers: each section's examples use
queues of their own (``queues_of``, checked statically by the tests).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from tests.pki import ca_pem, server_pem

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # where `sepp-lite` and `python` are installed
SHELLS = ("console", "sh", "shell", "bash")
API_KEY = "readme-key-0123456789"
BLOCK_TIMEOUT = 90


# Shell commands a reader runs to set up, which this suite does not run.
SETUP_COMMANDS = ("pip install ", "make ", "docker run ", "cargo install ")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    file: Optional[str]  # from a <!-- file: NAME --> line right before the fence
    section: str = ""  # the ## heading it is under
    source: str = "README.md"  # the document, relative to the repository
    run_by_command: bool = False  # a file block that a `python NAME` command runs

    @property
    def where(self) -> str:
        return f"{self.source} line {self.line}"

    def commands(self) -> list[str]:
        """Shell commands: ``$ `` lines in a console block, every line in sh; a trailing
        backslash continues a command on the next line."""
        out: list[str] = []
        pending = ""
        for raw in self.text.splitlines():
            line = raw.strip()
            if self.lang == "console":
                if not pending and not line.startswith("$ "):
                    continue  # output shown in the document, not checked
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
            return not self.run_by_command
        return self.lang in SHELLS and any(
            c.startswith(("sepp-lite ", "python ")) for c in self.commands()
        )


FENCE = re.compile(r"^```(\S*)\s*$")
FILE_MARK = re.compile(r"^<!-- file: (\S+) -->$")
PYTHON_FILE_COMMAND = re.compile(r"^python (\S+\.py)\b")


def read_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order, with the ``## `` section each is in."""
    source = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    lines = path.read_text(encoding="utf-8").splitlines()
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
        assert index < len(lines), f"{source} line {start + 1}: unclosed code block"
        mark = FILE_MARK.match(lines[start - 1]) if start else None
        name = mark.group(1) if mark else None
        text = "\n".join(body) + "\n"
        blocks.append(Block(start + 1, match.group(1), text, name, section, source))
        index += 1
    return _mark_run_by_command(blocks)


def _mark_run_by_command(blocks: list[Block]) -> list[Block]:
    ran = {
        match.group(1)
        for block in blocks
        if block.lang in SHELLS
        for command in block.commands()
        for match in [PYTHON_FILE_COMMAND.match(command)]
        if match
    }
    return [
        Block(b.line, b.lang, b.text, b.file, b.section, b.source, True)
        if b.lang == "python" and b.file in ran
        else b
        for b in blocks
    ]


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


def make_env(tmp_path_factory: pytest.TempPathFactory, blocks: Iterable[Block]) -> Iterator[Env]:
    """Both servers, the blocks' working directory (with every file block written)
    and the environment the blocks run with."""
    pki = tmp_path_factory.mktemp("pki")
    pem = server_pem()
    (pki / "ca.pem").write_bytes(ca_pem())
    (pki / "key.pem").write_bytes(pem["tls_key"])
    (pki / "cert.pem").write_bytes(pem["tls_cert"])
    workdir = tmp_path_factory.mktemp("examples")
    for block in blocks:
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
    name = block.file or f"block_{Path(block.source).stem}_{block.line}.py"
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
        elif not command.startswith(SETUP_COMMANDS):
            run(block, env, ["/bin/sh", "-c", command], expected)


def run_block(block: Block, env: Env) -> None:
    if block.lang == "python":
        run_python(block, env)
    else:
        run_shell(block, env)


# -- static checks ----------------------------------------------------------------------


def unrun_blocks(blocks: Iterable[Block]) -> list[str]:
    """The blocks no test runs that are not setup commands, data files for the commands,
    or Python files that a command runs."""
    wrong = []
    for block in blocks:
        if block.runs or block.run_by_command:
            continue
        if block.file is not None:
            if block.lang in SHELLS:
                wrong.append(f"{block.where}: a shell block as a file")
            continue
        commands = block.commands()
        if block.lang not in SHELLS or not commands:
            wrong.append(f"{block.where}: a block no test runs")
        elif not all(c.startswith(SETUP_COMMANDS) for c in commands):
            wrong.append(f"{block.where}: {commands}")
    return wrong


# Where an example names its queues: EnqueueRequest("q", ...) or queue="q", a Worker's
# or ReserveOptions' list, and the command line's QUEUE and --queue.
# A queue named by a request, by a task registry or by one task.
_ONE_QUEUE = re.compile(
    r'(?:EnqueueRequest\(\s*(?:queue=)?|Tasks\(\s*queue=|\.task\([^()]*?\bqueue=)"([^"]+)"'
)
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


def queue_owners(blocks: Iterable[Block]) -> dict[str, str]:
    """Each queue the blocks use, with the one section (``document: heading``) that uses
    it; a queue two sections share fails (a test with a server of its own is left out)."""
    owner: dict[str, str] = {}
    for block in blocks:
        if "SeppTestServer(" in block.text:
            continue  # a test with a server of its own
        here = f"{block.source}: {block.section}"
        for queue in queues_of(block):
            assert owner.setdefault(queue, here) == here, (
                f"{block.where}: queue {queue!r} is used in {owner[queue]!r} too"
            )
    return owner
