#!/usr/bin/env bash
# Installs the Debian packages that tests run for real: redis-server for tests/resume_redis.rs and
# tests/resume_instances.rs (the Redis store of resumable streams), which fail under CI=true when it is missing.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
if ((${#need[@]})); then
  echo "installing Debian packages: ${need[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
redis-server --version
