#!/usr/bin/env bash
# make setup: everything the harness needs on a fresh Debian machine. Idempotent and quiet
# when nothing changed: each step is skipped when its stamp matches its inputs.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*"; }
need_apt=()

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "setup: error: missing Debian package(s): $*; install them (apt-get install $*) or run make setup as root" >&2
    exit 2
  fi
  say "installing $* with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "$@" >/dev/null
}

command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
# PyPI's libfaketime builds its C library on install (the clock the harness moves).
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
command -v make >/dev/null 2>&1 || need_apt+=(make)
# tests/test_live_prometheus.py: a real Prometheus scrapes a run's live metrics.
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
# make bench only: wrk drives benchmarks/bench_event_api.py; h2load (nghttp2-client) drives
# benchmarks/bench_simulators.py against the simulators and nghttpd (nghttp2-server).
if [ "${SETUP_BENCH:-}" = 1 ]; then
  command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
  command -v h2load >/dev/null 2>&1 || need_apt+=(nghttp2-client)
  command -v nghttpd >/dev/null 2>&1 || need_apt+=(nghttp2-server)
fi
if [ ${#need_apt[@]} -gt 0 ]; then apt_install "${need_apt[@]}"; fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PY" -m venv .venv
fi

py_stamp=.venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$py_stamp" ]; then
  say "installing the project, its test tools and the docs site's tools into .venv"
  if ! { .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip &&
         .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,docs]'; } >.venv/pip.log 2>&1; then
    tail -30 .venv/pip.log >&2
    echo "setup: error: pip install failed (full log: .venv/pip.log)" >&2
    exit 1
  fi
  .venv/bin/python -c 'import harness, reference_impl, prometheus_client, libfaketime, locust, boto3, ulid, redis, pandas, matplotlib, moto, h2, jwt, aioapns, pyfcm, uvicorn, uvloop, httptools, schemathesis, granian, mkdocs, material' \
    || { echo "setup: error: python packages failed to install" >&2; exit 1; }
  rm -f .venv/.installed-*
  touch "$py_stamp"
fi

npm_stamp=node_modules/.installed-$(cat package.json package-lock.json | sha256sum | cut -c1-16)
if [ ! -f "$npm_stamp" ]; then
  say "installing pinned npm packages (dynalite, kinesalite, the AWS SDK clients, ioredis) from package-lock.json"
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
  touch "$npm_stamp"
fi
