# shellcheck shell=bash
# Shared by .ci/run and every .ci/stages/<name>: the clone's root, the compiler cache, the build
# configurations the stages share, and the counting each stage reports with. Sourced, not run.
#
# A stage counts checks with pass/fail (one check each) or count_meson (the meson tests of a
# `meson test` run, from meson's logs) and ends with `finish`, which prints its closing line,
#   stage NAME: N passed, N failed
# and exits non-zero on any failure of its own. .ci/run adds those lines up.

ci_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ci_root" || exit 1

# The compiler cache, outside the clone, so that a new clone on the same machine reuses what an
# earlier one compiled: paths under the clone are made relative (CCACHE_BASEDIR) and the build
# folder's own path is left out of the hash (CCACHE_NOHASHDIR; the debug information's
# compilation directory is then the first clone's). Meson uses ccache when it finds it and CC/CXX
# are unset; the clang stages name it in CC/CXX.
export CCACHE_DIR=${CCACHE_DIR:-/var/cache/dma-libfabric-ci/ccache}
export CCACHE_BASEDIR=$ci_root
export CCACHE_NOHASHDIR=true
# Depend mode: a miss compiles once (no separate preprocessor run to hash, which cost about 15 %
# more compile time on a cold cache); hits come from the compiler's own dependency file (-MD).
export CCACHE_DEPEND=true
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-12G}

# Each stage's own logs (git-ignored, as every build* folder is).
ci_logs=$ci_root/build-logs
mkdir -p "$ci_logs"

stage_name=$(basename "$0")
stage_passed=0
stage_failed=0
stage_start=$(date +%s)

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

# Installs the Debian packages named that are missing.
need_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { "${sudo_cmd[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null; }
}

# The packages of ./run deps, and ccache.
base_packages() {
  ./run deps || return 1
  need_packages ccache
}

# Every package any stage installs, at once: .ci/run installs them first, so that no two
# apt-get runs (a stage's and a background build's) meet on dpkg's lock.
all_packages() {
  base_packages &&
    need_packages clang-14 libclang-rt-14-dev clang-format-14 clang-format clang-tidy-14 cmake doxygen \
      autoconf automake libtool make libibverbs-dev
}

# One check: pass NAME, fail NAME.
pass() { stage_passed=$((stage_passed + 1)); echo "== $*: ok"; }
fail() { stage_failed=$((stage_failed + 1)); echo "== $*: FAILED"; }

# The meson tests of one run: count_meson NAME STATUS LOG.json... A non-zero status with no failed
# test (a build failure, a crash outside a test) counts as one failure.
count_meson() {
  local name=$1 status=$2
  shift 2
  local p f s cases
  read -r p f s cases < <(.ci/count-testlog "$@")
  if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  stage_passed=$((stage_passed + p))
  stage_failed=$((stage_failed + f))
  echo "== $name: $p passed, $f failed, $s skipped (exit $status; $cases test cases)"
}

# Several checks counted elsewhere (a script's own ok/FAIL lines): count_checks OK BAD.
count_checks() {
  stage_passed=$((stage_passed + $1))
  stage_failed=$((stage_failed + $2))
}

finish() {
  echo "   $stage_name took $(($(date +%s) - stage_start)) s"
  echo "stage $stage_name: $stage_passed passed, $stage_failed failed"
  [ "$stage_failed" -eq 0 ]
  exit
}

# Prints a failed run's interesting lines: meson's non-passing results, or compiler errors.
show_test_failures() { grep -vE ' (OK|EXPECTEDFAIL|SKIP) ' "$1" | tail -"${2:-80}"; }
show_build_errors() { grep -E 'error|FAILED' "$1" | head -20; }

# --- Build folders. Each is configured once and reused by the stages that share it.

# The README's build (./run test): g++, -Werror, the build type's defaults.
setup_ci_build() {
  [ -f build-ci/build.ninja ] || meson setup build-ci --wrap-mode=nodownload -Dwerror=true >/dev/null
}

# clang 14 with a sanitizer: setup_sanitizer_build DIR SANITIZERS. clang 14 miscompiles coroutines
# under -fsanitize=function, so that one check is off. Debug information is line tables (-g1, as
# the programs always get): reports keep file and line, and the library compiles in less time.
setup_sanitizer_build() {
  local dir=$1 sanitize=$2
  need_packages clang-14 libclang-rt-14-dev || return 1
  [ -f "$dir/build.ninja" ] && return 0
  CC="ccache clang-14" CXX="ccache clang++-14" meson setup "$dir" --wrap-mode=nodownload -Dwerror=true \
    "-Db_sanitize=$sanitize" -Db_lundef=false -Dbuildtype=debug "-Dcpp_args=['-fno-sanitize=function','-g1']" \
    >/dev/null
}
setup_asan_build() { setup_sanitizer_build build-asan address,undefined; }
setup_tsan_build() { setup_sanitizer_build build-tsan thread; }

# libfabric VERSION from ../shared/libfabric/ in /opt/libfabric-VERSION (outside the clone, so a new
# clone reuses it), and the build folder build-VERSION against it, headers as system headers,
# -Werror. 2.6.0: with the efa provider built in (so the efa-getinfo test meets efa's getinfo
# without a device), on Asio's io_uring backend, and with line tables for debug information (-g1,
# the library's compile is shorter). 2.1.0: without the tools, and otherwise the README's options,
# so that the programs, which include nothing of libfabric, compile to what the README's build
# compiled and come from the compiler cache.
libfabric_prefix() { echo "/opt/libfabric-$1"; }
libfabric_provider() { [ "$1" = 2.6.0 ] && echo efa; }
libfabric_options() {
  case $1 in
    2.6.0) echo -Dio_uring=enabled -Dcpp_args=-g1 ;;
    2.1.0) echo -Dtools=disabled ;;
  esac
}
setup_libfabric_build() {
  local version=$1 prefix dir options
  prefix=$(libfabric_prefix "$version")
  dir=build-$version
  read -ra options <<<"$(libfabric_options "$version")"
  # shellcheck disable=SC2046
  .ci/build-libfabric "$version" "$prefix" $(libfabric_provider "$version") >"/tmp/libfabric-$version.log" 2>&1 ||
    { echo "libfabric $version did not build:"; tail -20 "/tmp/libfabric-$version.log"; return 1; }
  [ -f "$dir/build.ninja" ] && return 0
  PKG_CONFIG_PATH=$prefix/lib/pkgconfig meson setup "$dir" --wrap-mode=nodownload -Dwerror=true "${options[@]}" \
    "-Dcpp_link_args=-Wl,-rpath,$prefix/lib" "-Dc_link_args=-Wl,-rpath,$prefix/lib" >/dev/null
}

# Runs the given suites of a build folder, building only what they need (.ci/suite-targets) and
# the extra targets named after `--`: run_suites NAME DIR LOGBASE SUITE... [-- TARGET...].
# Extra `meson test` arguments come from MESON_TEST_ARGS.
# Prints what the cluster suite's events under load report (acknowledged, verified, lost, ...)
# from a meson test log.
print_cluster_ledger() {
  local label=$1 log=$2
  [ -f "$log" ] || return 0
  grep -hE '^(failover|kill|reshard): ' "$log" | grep -vE ': (the clients followed|first refus)' |
    sed "s/^/  $label /" || true
}

run_suites() {
  local name=$1 dir=$2 logbase=$3
  shift 3
  local names=() extra=() suites=() n status
  while [ $# -gt 0 ]; do
    [ "$1" = -- ] && { shift; extra=("$@"); break; }
    names+=("$1")
    shift
  done
  for n in "${names[@]}"; do suites+=(--suite "$n"); done
  local targets
  # Regenerate first: a folder configured before a meson.build change would otherwise name the
  # old set of test programs.
  ninja -C "$dir" build.ninja >/dev/null 2>&1 || true
  mapfile -t targets < <(.ci/suite-targets "$dir" "${names[@]}")
  rm -f "$dir/meson-logs/$logbase.json"
  if ninja -C "$dir" "${targets[@]}" "${extra[@]}" >"$dir/$logbase-build.log" 2>&1; then
    # shellcheck disable=SC2086
    meson test -C "$dir" --no-rebuild --print-errorlogs --logbase "$logbase" "${suites[@]}" ${MESON_TEST_ARGS:-} \
      >"$dir/$logbase.log" 2>&1
    status=$?
    [ $status -ne 0 ] && show_test_failures "$dir/$logbase.log"
  else
    status=1
    show_build_errors "$dir/$logbase-build.log"
  fi
  count_meson "$name" $status "$dir/meson-logs/$logbase.json"
  return $status
}
