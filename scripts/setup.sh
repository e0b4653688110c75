#!/usr/bin/env bash
# Installs what the suite and the embedded default need on a fresh Debian
# machine: PostgreSQL 15 server binaries (the ephemeral cluster), PgBouncer
# (pooler tests) and an unprivileged OS user to run the cluster as when we are
# root (initdb refuses root). Does nothing that is already in place.
set -euo pipefail

need=()
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  need+=(postgresql-15 postgresql-contrib)
fi
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing ${need[*]}; install them (Debian: sudo apt-get install ${need[*]})" >&2
    exit 3
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's postgresql-common would create and start a cluster of its own;
  # we only want the binaries.
  mkdir -p /etc/postgresql-common
  echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # pgbouncer's package starts a system service we do not use.
  if command -v service >/dev/null 2>&1; then service pgbouncer stop >/dev/null 2>&1 || true; fi
fi

if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin postgres
fi
command -v go >/dev/null 2>&1 || { echo "setup: Go is not on PATH (expected /usr/local/go/bin)" >&2; exit 3; }
