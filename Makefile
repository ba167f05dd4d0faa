# AutoRL — one-command set-up, run and test.
PYTHON ?= python3.11
VENV := .venv
OC_VENV := .venv-opencompass
AGENT_VENV := .venv-agent
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
SERVICES := services/grader services/evaluator-worker services/agent-runner services/agents services/controller services/local-run
RUN_TIMEOUT ?= 300

.PHONY: setup setup-run system-packages browser vendor-chartjs run test test-containers test-fast reliability lint bench mutation chart crd images clean help

# Each target's line in `make help` is the `## ` comment on its rule (a test checks every target has one).
help: ## list every target with what it does
	@awk -F':.*## ' '/^[a-zA-Z0-9_.-]+:.*## / { printf "make %-16s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# The three Python environments install side by side (each pip process mostly waits on one core or
# on the disk); the system packages and the browser one after the other (apt-get takes one lock).
setup: system-packages browser ## install everything the tests need: system packages, the three Python environments, the browser
	@echo "make setup: the Python environments $(VENV), $(AGENT_VENV) and $(OC_VENV), side by side (each one's output once it is done)"
	@$(MAKE) --no-print-directory -j3 --output-sync=target $(VENV)/.installed $(AGENT_VENV)/.installed $(OC_VENV)/.installed

# What running needs and no more: no browser (only the dashboard's browser test drives one), no
# OpenCompass environment (`autorl run` evaluates with the hf backend unless --backend opencompass),
# and no root (the sandbox's missing system packages are named, and the run falls back as it says).
setup-run: system-packages ## install what `make run` needs: .venv and .venv-agent (no root, no browser, no OpenCompass)
	@$(MAKE) --no-print-directory -j2 --output-sync=target $(VENV)/.installed $(AGENT_VENV)/.installed

# The agent's sandbox: bubblewrap (namespaces), slirp4netns and nftables (--egress), util-linux
# (setpriv, unshare, nsenter), iproute2. Installed with apt-get where missing; without root or
# apt-get, the exact command is printed with the fallback (docs/LOCAL.md, "Sandbox"), and set-up goes on.
SYSTEM_PACKAGES := bubblewrap slirp4netns nftables util-linux iproute2
system-packages: ## install the agent sandbox's system packages (bubblewrap, slirp4netns, nftables, ...); without root, name them
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; missing=$$(echo $$missing); \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q $$missing >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q $$missing >/dev/null; }; \
	else echo "make: the agent sandbox's system packages are missing (installing them takes root and apt-get): run" \
		"'sudo apt-get install $$missing' (Debian/Ubuntu). Until then autorl run (--sandbox auto) runs the agent" \
		"without a sandbox, with a warning naming what it can reach (docs/LOCAL.md, \"Sandbox\"), and --egress" \
		"is refused" >&2; fi

# The dashboard's browser test drives Debian's headless Chromium through its chromedriver
# (browser builds that tools download for themselves cannot be fetched here).
BROWSER_PACKAGES := chromium chromium-driver
browser: | system-packages ## install Debian's chromium and chromium-driver for the dashboard's browser test
	@if ! test -x /usr/bin/chromium || ! test -x /usr/bin/chromedriver; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES); \
	  else echo "install Debian's $(BROWSER_PACKAGES): sudo apt-get install $(BROWSER_PACKAGES)" >&2; exit 1; fi; \
	fi

# The dashboard serves Chart.js itself (no CDN). This fetches the pinned release from the npm registry,
# checks the registry's integrity hash, and vendors its UMD build and licence; a test pins the file's sha256.
CHARTJS_VERSION := 4.6.1
CHARTJS_INTEGRITY := sha512-hJyniucsFmq//EvXYvJ6c6mahPoI3kaxdjVH8awTaJ/fDNWeSqqqArixMJWkWNN6fcYvPU3HneSANFNYtRi61g==
CHARTJS_DIR := services/grader/autorl_grader/dashboard/static/vendor
vendor-chartjs: ## re-vendor the pinned Chart.js release from the npm registry (integrity checked)
	tmp=$$(mktemp -d) && cd $$tmp && npm pack --silent chart.js@$(CHARTJS_VERSION) >/dev/null && \
	  test "sha512-$$(openssl dgst -sha512 -binary chart.js-$(CHARTJS_VERSION).tgz | base64 -w0)" = "$(CHARTJS_INTEGRITY)" && \
	  tar xzf chart.js-$(CHARTJS_VERSION).tgz package/dist/chart.umd.min.js package/LICENSE.md && \
	  cp package/dist/chart.umd.min.js $(CURDIR)/$(CHARTJS_DIR)/chart.umd.min.js && \
	  cp package/LICENSE.md $(CURDIR)/$(CHARTJS_DIR)/chart.js.LICENSE.md && rm -rf $$tmp

$(VENV)/.installed: pyproject.toml constraints.txt requirements-test.txt $(wildcard services/*/pyproject.toml)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -c constraints.txt -e '.[ml,dev]' $(foreach s,$(SERVICES),-e $(s)) -r requirements-test.txt
	touch $@

# The agents' Python (docs/AGENTS.md): what agents import, and copies (not editable links) of the
# core and the agent runner, so that no path into this repository (test fixtures) is on its sys.path
# and none of the platform's services or database drivers is in it.
AGENT_SOURCES := $(shell find autorl services/agents/autorl_agents -type f \( -name '*.py' -o -name '*.json' \) 2>/dev/null)
$(AGENT_VENV)/.installed: requirements-agent.txt constraints.txt pyproject.toml services/agents/pyproject.toml $(AGENT_SOURCES)
	test -x $(AGENT_VENV)/bin/python || $(PYTHON) -m venv $(AGENT_VENV)
	$(AGENT_VENV)/bin/python -m pip --disable-pip-version-check -q install -c constraints.txt -r requirements-agent.txt
	$(AGENT_VENV)/bin/python -m pip --disable-pip-version-check -q install --no-deps --force-reinstall . ./services/agents
	# The supervisor is not the agents' (an environment made before the agents had their own distribution held it).
	$(AGENT_VENV)/bin/python -m pip --disable-pip-version-check -q uninstall -y autorl-agent-runner 2>/dev/null || true
	touch $@

# Versions of the OpenCompass environment: the only combination found that installs and runs beside TRL's.
# Under the pins of the evaluator image's lock (its OpenCompass side), so both hold one set of versions.
$(OC_VENV)/.installed: requirements-opencompass.txt docker/evaluator-worker.lock docker/lock_cpu_side.py
	test -x $(OC_VENV)/bin/python || $(PYTHON) -m venv $(OC_VENV)
	$(PYTHON) docker/lock_cpu_side.py --constraints docker/evaluator-worker.lock > $(OC_VENV)/lock-constraints.txt
	$(OC_VENV)/bin/python -m pip --disable-pip-version-check -q install -c $(OC_VENV)/lock-constraints.txt -r requirements-opencompass.txt
	$(OC_VENV)/bin/opencompass --help >/dev/null
	touch $@

run: setup-run ## install what running needs (make setup-run), then run the embedded default experiment end to end (offline, CPU)
	$(VENV)/bin/autorl run -t arith -m builtin:tiny-qwen2 -a example_grpo --timeout $(RUN_TIMEOUT)

# CI=1: a test whose dependency is missing fails instead of skipping (tests/support/requirements.py):
# `make setup` installs every one, `make images GPU=0` builds what the container tests run. The reverse
# pass runs what order can break: it leaves out the container tests (they start the same images again,
# in no order of their own) and the slow, integration and end-to-end tests that share nothing a test can
# change (order_independent, tests/conftest.py): every quick unit test and every test sharing state runs again.
# Each module's tests run in one process (loadscope): a module-wide fixture (an OpenCompass run, a
# sandboxed agent's run, the module's database) is built once, the costliest modules handed out first
# (tests/support/suite_order.py). Each pass prints its 25 slowest tests.
test: setup ## install, build the CPU images, run `make lint`, then the whole suite over two processes, then again in reverse order what order can break
	$(MAKE) --no-print-directory images GPU=0
	$(MAKE) --no-print-directory lint
	CI=1 $(PY) -m pytest -n 2 --dist loadscope --no-loadscope-reorder --durations=25
	CI=1 $(PY) -m pytest -n 2 --dist loadscope --no-loadscope-reorder --durations=25 --reverse -m "not containers and not order_independent"

test-containers: setup ## build the CPU images, then run only the container tests (tests/containers/)
	$(MAKE) --no-print-directory images GPU=0
	CI=1 $(PY) -m pytest -m containers

# The fault tests with their outcomes recorded in bench/results/faults/, then docs/RELIABILITY.md
# rewritten from them.
reliability: $(VENV)/.installed ## run the fault tests and rewrite docs/RELIABILITY.md from their outcomes
	AUTORL_RECORD_RESULTS=1 $(PY) -m pytest -m faults
	$(PY) -m tools.reliability_doc

test-fast: $(VENV)/.installed ## the test suite without the slow and OpenCompass tests
	$(PY) -m pytest -m "not slow and not opencompass"

lint: $(VENV)/.installed ## ruff check, ruff format --check, mypy --strict (pyproject.toml)
	$(VENV)/bin/ruff check autorl services tests bench tools
	$(VENV)/bin/ruff format --check autorl services tests bench tools
	$(VENV)/bin/mypy

# The CRD is generated from the pydantic models in autorl/experiment.py (a test fails on drift).
crd: $(VENV)/.installed ## regenerate the Experiment CRD from the pydantic models
	$(PY) -m autorl.crd > charts/autorl/crds/experiments.autorl.io.yaml

# Lint (strict) and package the chart into dist/ with Helm's own Go SDK (no helm binary needed).
chart: crd ## lint (strict) and package the Helm chart into dist/
	$(PY) -c 'import sys, helm_python as h; r = h.lint("charts/autorl", strict=True); [print(m) for m in r["messages"]]; sys.exit(bool(r["errors"]))'
	$(PY) -c 'import helm_python as h; print(h.package("charts/autorl", destination="dist"))'

# The images of docker/, built with podman and tagged as the chart expects: by default every tag the
# chart's default values name (the CUDA variants); GPU=0: the CPU variants, which the tests run
# (docs/KUBERNETES.md, "Building and pushing the images").
GPU ?= 1
images: ## build every image the chart's defaults name with podman (GPU=0: the CPU variants the tests run)
	GPU=$(GPU) docker/build-images.sh

bench: setup ## run every CPU benchmark (bench/results/*.json), print the GPU benchmarks' commands, refresh docs/PERFORMANCE.md
	$(PY) bench/run_all.py

# Mutation testing of the checks that guard scores ([tool.mutmut] and [tool.autorl.mutation] in
# pyproject.toml); not part of `make test`. Starts afresh in .mutation/ each time; writes
# bench/results/mutation.json and its section of docs/RELIABILITY.md.
mutation: setup ## mutation testing (mutmut) of scoring, checkpoint checks, submissions, the sandbox view; survivors in docs/RELIABILITY.md
	nice -n 10 $(PY) -m tools.mutation
	$(PY) -m tools.reliability_doc

clean: ## remove the Python environments and tool caches
	rm -rf $(VENV) $(AGENT_VENV) $(OC_VENV) .pytest_cache .mypy_cache .ruff_cache mutants .mutation
