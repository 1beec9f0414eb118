# kvshim scripts: shared helpers. Source it; it sets KVSHIM_ROOT and defines kvs_* functions.
# shellcheck shell=bash

KVSHIM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export KVSHIM_ROOT
KVS_JOBS=$(nproc 2>/dev/null || echo 2)

kvs_say() { printf '==> %s\n' "$*" >&2; }
kvs_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Debian packages each feature needs. Core build and tests:
KVS_PKGS_BUILD="cmake make gcc pkg-config libcriterion-dev libelf-dev libxxhash-dev libhiredis-dev python3"
# Fuzz leg (libFuzzer lives in libclang-rt-14-dev), benchmarks (valgrind for callgrind counts).
KVS_PKGS_EXTRA="clang libclang-rt-14-dev valgrind python3-matplotlib"
# Remote tier tests and demo (ctest label remote): a real Redis server and redis-cli.
KVS_PKGS_REMOTE="redis-server redis-tools"

kvs_pkg_missing() { # prints the packages of "$@" that are not installed
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || printf '%s ' "$p"
  done
}

# kvs_ensure_pkgs PKG...: install what is missing (root), or print the command and stop.
kvs_ensure_pkgs() {
  command -v dpkg-query >/dev/null 2>&1 || {
    kvs_say "not a Debian/Ubuntu system: make sure these are installed: $*"
    return 0
  }
  local missing
  missing=$(kvs_pkg_missing "$@")
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    printf 'kvshim needs these packages: %s\nRun as root:\n  apt-get update && apt-get install -y %s\n' \
      "$missing" "$missing" >&2
    exit 1
  fi
  kvs_say "installing: $missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || kvs_die "apt-get update failed"
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null || kvs_die "apt-get install $missing failed"
}

kvs_check_cuda_headers() {
  local d
  for d in "${KVSHIM_CUDA_INCLUDE_DIR:-}" "${CUDA_HOME:+$CUDA_HOME/include}" /usr/local/cuda/include /usr/include; do
    [ -n "$d" ] && [ -f "$d/cuda.h" ] && return 0
  done
  kvs_die "cuda.h not found: install the CUDA Toolkit headers (only headers are used) or set KVSHIM_CUDA_INCLUDE_DIR"
}

# kvs_build DIR [cmake args...]: configure (once) and build everything in DIR.
kvs_build() {
  local dir=$1; shift
  mkdir -p "$dir"
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S "$KVSHIM_ROOT" -B "$dir" "$@" >"$dir/kvshim-configure.log" 2>&1 || {
      cat "$dir/kvshim-configure.log" >&2; kvs_die "cmake configure failed for $dir"; }
  fi
  cmake --build "$dir" -j"$KVS_JOBS" >"$dir/kvshim-build.log" 2>&1 || {
    tail -n 60 "$dir/kvshim-build.log" >&2; kvs_die "build failed in $dir (full log: $dir/kvshim-build.log)"; }
}
