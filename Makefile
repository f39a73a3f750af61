# sepp_lite developer commands. Every target creates what it needs itself, so
# `make test` and `make demo` work on a fresh machine with only python3.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev
PROTO_VENV ?= .venv-proto
PROTO_PY := $(PROTO_VENV)/bin/python
DOCS_VENV ?= .venv-docs
DOCS_PY := $(DOCS_VENV)/bin/python
DOCS_PORT ?= 8000

.DEFAULT_GOAL := check
.PHONY: install install-runtime proto proto-check lint format typecheck test official demo \
	dist bench bench-against soak docs docs-serve foreign-arch platforms check clean

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $@ $(VENV)/.installed-runtime

install: $(VENV)/.installed-$(EXTRAS)

# sepp_lite and its runtime dependencies only, for `make demo` on a fresh clone (a venv
# that has the extras already has them: the rule above marks this one done too).
$(VENV)/.installed-runtime: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

install-runtime: $(VENV)/.installed-runtime

$(PROTO_VENV)/.installed: proto/requirements.txt
	test -x $(PROTO_PY) || $(PYTHON) -m venv $(PROTO_VENV)
	$(PROTO_PY) -m pip install -q -r proto/requirements.txt
	touch $@

# Regenerate sepp_lite/_proto from proto/ with the pinned betterproto compiler.
proto: $(PROTO_VENV)/.installed
	rm -rf sepp_lite/_proto
	mkdir -p sepp_lite/_proto
	PATH="$(CURDIR)/$(PROTO_VENV)/bin:$$PATH" $(PROTO_PY) -m grpc_tools.protoc -Iproto \
		--python_betterproto_out=sepp_lite/_proto proto/sepp/v1/queue.proto

# CI: regenerating must leave the committed code untouched.
proto-check: proto
	git diff --exit-code -- sepp_lite/_proto
	test -z "$$(git status --porcelain -- sepp_lite/_proto)"

lint: install
	$(VENV)/bin/ruff check sepp_lite _sepp_lite_pytestplugin.py tests bench docs/_gen
	$(VENV)/bin/ruff format --check sepp_lite _sepp_lite_pytestplugin.py tests bench docs/_gen

format: install
	$(VENV)/bin/ruff check --fix sepp_lite _sepp_lite_pytestplugin.py tests bench docs/_gen
	$(VENV)/bin/ruff format sepp_lite _sepp_lite_pytestplugin.py tests bench docs/_gen

typecheck: install
	$(VENV)/bin/mypy

# Two pytest-xdist workers by default (most tests wait on sockets and timers, so two
# suit a 2-core machine); PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# sepp-py 0.1.0's own integration tests (from its sdist) against our server, run with
# sepp-py and again with `import sepp` giving sepp_lite.
official: install
	tests/official/run.sh $(PY)

# An embedded server, a mixed workload of a few thousand jobs through a Worker, and a
# summary (DEMO_ARGS="--jobs N" to change the size).
demo: install-runtime
	$(VENV)/bin/sepp-lite demo $(DEMO_ARGS)

# A wheel of sepp_lite in dist/ (DIST=dir for another folder), to `pip install` on
# machines without a clone, and what deploy/docker/Dockerfile installs.
DIST ?= dist
dist:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	rm -rf $(DIST)
	$(PY) -m pip wheel -q --no-deps --wheel-dir $(DIST) .
	@ls $(DIST)/*.whl

# ... and the chart and tables of docs/benchmarks.md from its bench/results/latest.json.
bench: install
	$(PY) bench/run.py $(BENCH_ARGS)
	$(PY) docs/_gen/bench_chart.py --update

# This tree against sepp_lite at an earlier commit, alternating, every sepp_lite
# workload (AGAINST=04c66af; BENCH_ARGS="--workloads worker,enqueue64 --rounds 3").
AGAINST ?= HEAD
bench-against: install
	$(PY) bench/against.py $(AGAINST) $(BENCH_ARGS)

# 100,000 jobs over 10 minutes through 4 worker processes, checked job by job, with
# worker memory sampled (SOAK_ARGS="--minutes 3 --jobs 30000" for a shorter run).
soak: install
	$(PY) bench/soak.py $(SOAK_ARGS)

# The documentation site (mkdocs.yml, docs/) into site/, with the pinned tools of the
# `docs` extra in a venv of their own. Strict: a warning, a broken link or an unresolved
# reference fails the build. (Material's banner about its successor is switched off.)
$(DOCS_VENV)/.installed: pyproject.toml
	test -x $(DOCS_PY) || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_PY) -m pip install -q --upgrade pip
	$(DOCS_PY) -m pip install -q -e '.[docs]'
	touch $@

docs: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --clean --site-dir site

# Serve the site on 127.0.0.1:$(DOCS_PORT), rebuilt on every change.
docs-serve: $(DOCS_VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

# `sepp-lite demo` and the client test suites on another CPU architecture (a Debian
# name: s390x, riscv64 with SUITE=trixie, ...) under qemu user emulation, in a Debian
# root of it; needs root or sudo (.ci/foreign-arch says what it installs and where).
ARCH ?= s390x
foreign-arch:
	.ci/foreign-arch $(ARCH)

# The test runs of docs/platforms.md's table: CPython 3.14 in a Debian sid root, CPython
# built against musl, and s390x, ppc64el and riscv64 under qemu, one after another, each
# with its log in $(PLATFORM_LOGS)/ (the tail of a failed one shown), each recording its
# counts in docs/platforms/results/; then the table. A failed run does not stop the
# others; the target fails at the end if any did. Needs root or sudo; an hour or more.
CI_SCRIPTS ?= .ci
PLATFORM_LOGS ?= logs
PLATFORM_RESULTS ?= docs/platforms/results
PLATFORMS_TABLE ?= $(PYTHON) docs/_gen/platforms.py --update
platforms:
	@mkdir -p $(PLATFORM_LOGS) $(PLATFORM_RESULTS); failed=""; \
	run() { name=$$1; shift; echo "== $$name: $$* (log: $(PLATFORM_LOGS)/$$name.log)"; \
		if PLATFORM_RESULTS=$(PLATFORM_RESULTS) "$$@" >$(PLATFORM_LOGS)/$$name.log 2>&1; \
		then echo "   passed"; else echo "   FAILED:"; tail -n 20 $(PLATFORM_LOGS)/$$name.log; \
		failed="$$failed $$name"; fi; }; \
	run cpython-3.14 $(CI_SCRIPTS)/sid-suite python3.14; \
	run musl $(CI_SCRIPTS)/platform-suite musl; \
	run s390x $(CI_SCRIPTS)/foreign-arch s390x; \
	run ppc64el $(CI_SCRIPTS)/foreign-arch ppc64el; \
	run riscv64 env SUITE=trixie $(CI_SCRIPTS)/foreign-arch riscv64; \
	$(PLATFORMS_TABLE); \
	if [ -n "$$failed" ]; then echo "FAILED:$$failed" >&2; exit 1; fi

check: lint typecheck test

clean:
	rm -rf $(VENV) $(PROTO_VENV) $(DOCS_VENV) site .mypy_cache .ruff_cache .hypothesis dist
