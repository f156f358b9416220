# The two commands: `make demo` runs the demo fleet, collector and web UI; `make test` runs the suite.
# Both set up what they need: the virtualenv, the npm packages, and Debian's chromium for the browser tests.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test lint format bench clean system-deps wheel screenshots

# The sampler's native engine is compiled by the install: rebuilt when its sources change.
NATIVE_SOURCES := $(wildcard sampler/_native_src/*.c sampler/_native_src/*.h)

$(STAMP): setup.py $(NATIVE_SOURCES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The web UI's JavaScript (d3, d3-flame-graph) from npm, copied into webui/static/vendor/.
NPM_STAMP := node_modules/.installed-stamp
ASSETS_STAMP := webui/static/vendor/.built-stamp

$(NPM_STAMP): package-lock.json
	npm ci --no-audit --no-fund
	touch $(NPM_STAMP)

$(ASSETS_STAMP): $(NPM_STAMP) webui/build_assets.py
	$(PYTHON) webui/build_assets.py
	touch $(ASSETS_STAMP)

setup: $(STAMP) $(ASSETS_STAMP)

system-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	    echo "installing Debian's chromium for the browser tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

demo: setup
	$(BIN)/python deploy/demo/run.py $(DEMO_ARGS)

# Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE): the
# suite starts hundreds of Python processes (servers, workers, the demo), and compiling the
# project's modules anew in each, and rewriting every test module's asserts at each collection,
# cost ~1 minute of a run. __pycache__ is ignored by git.
test: export PYTHONDONTWRITEBYTECODE =

# Most tests on two processes at once, then those marked `alone` (they measure time or sampled
# shares, which a test busy on the other core would skew) one at a time; both parts always run.
test: setup system-deps
	$(BIN)/python -m pytest -q -n 2 -m "not alone"; first=$$?; \
	$(BIN)/python -m pytest -q -m alone; second=$$?; \
	exit $$(( first > second ? first : second ))

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python bench/run.py

# A wheel with the web UI's assets inside (the build step copies them): lists them to prove it.
wheel: setup
	rm -rf dist
	$(BIN)/python -m pip wheel -q --no-deps -w dist .
	$(BIN)/python -m zipfile -l dist/fleetflame-*.whl | grep -E 'webui/static/(vendor|js)/'

# Screenshots of the flamegraph and compare views in docs/, from a realistic generated profile.
screenshots: setup system-deps
	$(BIN)/python docs/make_screenshots.py docs

clean:
	rm -rf $(VENV) node_modules build *.egg-info
