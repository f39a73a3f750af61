#!/usr/bin/env bash
# Runs sepp-py 0.1.0's own integration tests (from its sdist on PyPI) against
# `python -m sepp_lite.testing`, twice:
#   1. with sepp-py itself as the client: our in-process server must behave like sepp;
#   2. with `import sepp` aliased to sepp_lite: our client must behave like sepp-py.
# Usage: tests/official/run.sh [PYTHON]   (default .venv/bin/python, which has sepp-py)
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${1:-.venv/bin/python}
work=.official
mkdir -p "$work"
if [ ! -d "$work/sepp_py-0.1.0" ]; then
    "$python" -m pip download -q --no-deps --no-binary :all: -d "$work" sepp-py==0.1.0
    tar -xzf "$work/sepp_py-0.1.0.tar.gz" -C "$work"
fi
"$python" -m pip install -q "testcontainers>=4" 2>&1 | grep -v "^WARNING: Location" || true  # their conftest imports it
port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$python" -m sepp_lite.testing --port "$port" > "$work/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do grep -q "queue server listening" "$work/server.log" && break; sleep 0.1; done
grep -q "queue server listening" "$work/server.log"
export SEPP_TEST_ADDR="127.0.0.1:$port"
suite="$work/sepp_py-0.1.0/tests/integration"
opts=(-q -p no:cacheprovider -o asyncio_mode=auto -o asyncio_default_fixture_loop_scope=function
      -W ignore::DeprecationWarning --rootdir "$work/sepp_py-0.1.0" -c /dev/null)
echo "== sepp-py 0.1.0 client against sepp-lite serve"
"$python" -m pytest "${opts[@]}" "$suite"
echo "== the same tests with 'import sepp' giving sepp_lite"
PYTHONPATH=tests/official "$python" -m pytest "${opts[@]}" -p alias_sepp "$suite"
