#!/usr/bin/env bash
# Installs what the suite and the embedded default need on a fresh Debian
# machine: PostgreSQL 15 server binaries (the ephemeral cluster), Debian's
# pg_cron for that server (the ephemeral cluster preloads it), PgBouncer
# (pooler tests), an unprivileged OS user to run the cluster as when we are
# root (initdb refuses root), and the real pgmq extension from a vendored
# release folder when one is there. Does nothing that is already in place.
#
#   PGMQ_VENDOR_DIR   folder with pgmq.control and pgmq--*.sql (default: the
#                     checkout's ../shared/vendor/pgmq-1.5.1); when it is absent
#                     the tests use the project's pgmq stand-in and say so.
#   PGMQ_UPDATES_DIR  folder with pgmq's update scripts pgmq--A--B.sql (default:
#                     ../shared/vendor/pgmq-updates-1.13.1), installed next to
#                     the release above: CREATE EXTENSION still gives 1.5.1
#                     (the control file is the release's), and a test reaches
#                     a later pgmq with ALTER EXTENSION pgmq UPDATE TO '1.13.1'.
#                     When it is absent the tests that need a later pgmq fail
#                     and say to run this script.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
pgmq_dir="${PGMQ_VENDOR_DIR:-$repo/../shared/vendor/pgmq-1.5.1}"
pgmq_updates_dir="${PGMQ_UPDATES_DIR:-$repo/../shared/vendor/pgmq-updates-1.13.1}"

need=()
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  need+=(postgresql-15 postgresql-contrib)
fi
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
# pg_cron for Debian's PostgreSQL 15, when that is the server (found or
# about to be installed).
if [ ! -e /usr/lib/postgresql/15/lib/pg_cron.so ] && { [ -d /usr/lib/postgresql/15 ] || [[ " ${need[*]:-} " == *" postgresql-15 "* ]]; }; then
  need+=(postgresql-15-cron)
fi

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

# The real pgmq: pure SQL, installed by copying its control and script files
# into the server's extension directory; its update scripts go next to it.
# install_checked DIR FILE...: DIR must match its SHA256SUMS, then each FILE
# not already there as it is is copied into $ext.
install_checked() {
  local dir="$1"; shift
  if [ -f "$dir/SHA256SUMS" ]; then
    (cd "$dir" && sha256sum --quiet -c SHA256SUMS) || { echo "setup: $dir does not match its SHA256SUMS" >&2; exit 3; }
  fi
  local f
  for f in "$@"; do
    if ! cmp -s "$f" "$ext/$(basename "$f")"; then
      if [ ! -w "$ext" ]; then
        echo "setup: cannot write $ext; install pgmq as root: cp $* $ext/" >&2
        exit 3
      fi
      cp "$f" "$ext/"
      chmod 0644 "$ext/$(basename "$f")"
    fi
  done
}
if [ -f "$pgmq_dir/pgmq.control" ]; then
  pg_config_bin=""
  for c in /usr/lib/postgresql/15/bin/pg_config $(command -v pg_config || true); do
    [ -x "$c" ] && { pg_config_bin="$c"; break; }
  done
  if [ -n "$pg_config_bin" ]; then
    ext="$("$pg_config_bin" --sharedir)/extension"
    if [ -d "$ext" ]; then
      install_checked "$pgmq_dir" "$pgmq_dir"/pgmq.control "$pgmq_dir"/pgmq--*.sql
      # Only the update scripts (pgmq--A--B.sql): never a control file, so
      # the default version stays the release's.
      if ls "$pgmq_updates_dir"/pgmq--*--*.sql >/dev/null 2>&1; then
        install_checked "$pgmq_updates_dir" "$pgmq_updates_dir"/pgmq--*--*.sql
      else
        echo "setup: no pgmq update scripts at $pgmq_updates_dir (set PGMQ_UPDATES_DIR); the tests that take pgmq past 1.5.1 will fail" >&2
      fi
    fi
  fi
elif ! ls /usr/share/postgresql/*/extension/pgmq.control >/dev/null 2>&1; then
  echo "setup: no pgmq release at $pgmq_dir (set PGMQ_VENDOR_DIR); the tests will use the pgmq stand-in" >&2
fi

if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin postgres
fi
command -v go >/dev/null 2>&1 || { echo "setup: Go is not on PATH (expected /usr/local/go/bin)" >&2; exit 3; }
