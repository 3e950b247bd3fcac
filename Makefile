# Local development entry points. Every step is idempotent and skips itself
# quickly when its work is already done.
#
#   make install   virtualenv + Python deps, Prometheus, nginx and Chromium (Debian), Triton and perf_analyzer (.stack/)
#   make run       install, then start the whole local stack (scripts/stack.sh)
#   make stop      stop what `make run` started
#   make status    one line per service, up or down
#   make test      install, then lint and the whole test suite (scripts/test.sh), as CI runs it
#   make test-fast lint and the fast tier: unit and database tests, no servers (scripts/test.sh --fast)
#   make lint      ruff, the import layers (lint-imports) and the migrations check
#   make bench     benchmarks (bench/run.sh), when present
#   make screenshots  the fleet, model, compare, version, host and rollout pages at 1440 and 390 px into var/screenshots/

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV := .venv
PYTHON := $(VENV)/bin/python
# Rebuilt whenever a requirements file is newer than the last install.
VENV_MARKER := $(VENV)/.requirements-installed

.PHONY: help install install-python install-prometheus install-nginx install-triton install-perf-analyzer install-localstack install-browser run stop status test test-fast lint bench screenshots

help:
	@sed -n 's/^#   //p' $(MAKEFILE_LIST)

install: install-python install-prometheus install-nginx install-triton install-perf-analyzer install-localstack install-browser

install-python: $(VENV_MARKER)

$(PYTHON):
	python3 -m venv $(VENV)

$(VENV_MARKER): requirements.txt requirements-dev.txt pyproject.toml modelyard_agent/pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install --disable-pip-version-check -r requirements-dev.txt
	touch $@

install-prometheus:
	@if command -v prometheus >/dev/null 2>&1; then \
		echo "prometheus: already installed ($$(command -v prometheus))"; \
	else \
		apt-get update && apt-get install -y --no-install-recommends prometheus; \
	fi

# Debian's nginx with its Lua module: BentoML host agents run their own master in front of their
# bentoml serve processes, and Triton host agents their gateway, whose routes live in Lua shared
# memory (never the system service; the package's start is refused where there is no init).
NGINX_PACKAGES = nginx libnginx-mod-http-lua lua-cjson
install-nginx:
	@if [ -x /usr/sbin/nginx ] && [ -e /usr/lib/nginx/modules/ngx_http_lua_module.so ] \
			&& [ -n "$$(find /usr/lib -path "*lua/5.1/cjson.so" -print -quit)" ]; then \
		echo "nginx: already installed with its Lua module (/usr/sbin/nginx)"; \
	else \
		apt-get install -y --no-install-recommends $(NGINX_PACKAGES) \
			|| { apt-get update && apt-get install -y --no-install-recommends $(NGINX_PACKAGES); }; \
	fi

# The script keeps its own marker in .stack/ and exits at once when done.
install-triton:
	scripts/install_triton.sh

# Triton's perf_analyzer (unpacked from the tritonclient 2.41 wheel) and Debian's wrk, which
# performance cards are measured with; marker in .stack/, exits at once when done.
install-perf-analyzer: install-python
	scripts/install_perf_analyzer.sh

# LocalStack's S3 in its own Python 3.13 virtualenv: it checks part checksums on arrival and serves
# ranged GETs as S3 does (tests of the upload checks, and `bench/run.sh upload`); marker in .stack/.
install-localstack:
	scripts/install_localstack.sh

# Debian's Chromium, which the browser tests drive through Playwright (whose own browser
# download is not used). The package lists are refreshed only when the install needs it.
install-browser:
	@if [ -x /usr/bin/chromium ]; then \
		echo "chromium: already installed (/usr/bin/chromium)"; \
	else \
		apt-get install -y --no-install-recommends chromium \
			|| { apt-get update && apt-get install -y --no-install-recommends chromium; }; \
	fi

run: install
	scripts/stack.sh start

stop:
	scripts/stack.sh stop

status:
	scripts/stack.sh status

test: install
	scripts/test.sh

test-fast: install-python
	scripts/test.sh --fast

lint: install-python
	$(PYTHON) -m ruff check .
	$(VENV)/bin/lint-imports
	$(PYTHON) manage.py makemigrations --check --dry-run

bench:
	@if [ -x bench/run.sh ]; then \
		bench/run.sh; \
	elif [ -f bench/run.sh ]; then \
		bash bench/run.sh; \
	else \
		echo "bench: no bench/run.sh yet, nothing to run"; \
	fi

# The browser test that draws the pages with data (a real Prometheus, see tests/browser/) writes them here.
screenshots: install
	MODELYARD_SCREENSHOTS_DIR=$(CURDIR)/var/screenshots scripts/test.sh tests/browser/test_screenshots.py -p no:cacheprovider
