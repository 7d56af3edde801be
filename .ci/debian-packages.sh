#!/usr/bin/env bash
# Installs the Debian packages that tests run for real: redis-server for tests/resume_redis.rs (the Redis
# store of resumable streams), which fails under CI=true when it is missing.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
if ((${#need[@]})); then
  echo "installing Debian packages: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
redis-server --version
