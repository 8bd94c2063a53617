# shellcheck shell=bash
# Sourced by .ci/run: the step timer and summary table, and the runs on the other torch releases
# of the supported range (pyproject.toml: torch>=2.11,<2.16).
#
# For each release in CI_TORCHES (default below; REDIST_OPT_CI_TORCHES="2.15.0" rehearses one,
# "" none): a fresh venv, torch==X with the machine's pip constraint lifted, then
# `pip install -e ".[test]"`, which must leave that torch as it is; `redist-opt demo` and its
# equality line; the quick tier plus the differential suites (-m "not slow or differential"),
# with one share of two of the exhaustive differential cases (--case-share, alternating over the
# releases in order: every case runs on 2.13.0 and on two releases of the range) and the
# hypothesis properties' "range" profile (fewer examples, a seed per release); then the venv is
# deleted (each is ~6 GB: PyPI's torch is the CUDA build, whose nvidia libraries `import torch`
# loads even on CPU). docs/ci.md has the budget and the reasons.
#
# The releases' venvs are installed one after the other in the background (ci_range_install_start,
# once the torch 2.13 venv has its test extras), while the torch 2.13 run tests: each release then
# waits only for its own install, which is usually done.
#
# Downloads. This machine's registry answers without caching headers (no Cache-Control, ETag or
# Last-Modified), so pip's HTTP cache never stores a wheel here: ~/.cache/pip stays empty and
# every run would download ~4-5 GB per release again. So the releases' wheels (torch and its
# dependencies) are kept in a wheelhouse inside pip's cache directory, which CI shares with the
# machine (REDIST_OPT_CI_WHEELS=DIR puts it elsewhere, =off installs straight from the index):
# `pip download` fills it in the background while the torch 2.13 run tests (downloads overlap
# the CPU-bound tests), skipping files it already holds, and each venv installs from it with
# --no-index. A wheelhouse that does not install is deleted and the venv installs from the index.

CI_TORCHES_DEFAULT="2.11.0 2.12.1 2.14.1 2.15.0"
CI_TORCHES="${REDIST_OPT_CI_TORCHES-$CI_TORCHES_DEFAULT}"
CI_TORCHES="${CI_TORCHES//,/ }"
CI_BUDGET_S="${REDIST_OPT_CI_BUDGET_S:-5400}" # CI's limit: no step starts a timeout past it
CI_T0=$(date +%s)
CI_ROWS=()   # "part<TAB>seconds<TAB>status" per step, printed by ci_summary
CI_FAILED=() # the parts that failed

ci_elapsed() { echo $(($(date +%s) - CI_T0)); }

# ci_limit WANT: WANT seconds, or less so that the step ends 2 minutes before CI's budget.
ci_limit() {
  local left=$((CI_BUDGET_S - 120 - $(ci_elapsed)))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

ci_record() { # PART SECONDS STATUS: a step's row; a STATUS other than "ok" fails the run
  CI_ROWS+=("$1"$'\t'"$2"$'\t'"$3")
  [ "$3" = ok ] || CI_FAILED+=("$1")
  echo "ci: [$1] $3 after ${2}s (CI at $(ci_elapsed)s)"
}

ci_note() { # PART SECONDS NOTE: a row for the summary that fails nothing
  CI_ROWS+=("$1"$'\t'"$2"$'\t'"$3")
}

# ci_step PART LIMIT_S CMD...: run CMD (a program, or one of the functions exported below) under a
# time limit, record its time and outcome; returns its status. timeout signals CMD's whole process
# group (pytest's workers, gloo ranks) when the limit passes.
ci_step() {
  local part=$1 limit t0 rc=0
  limit=$(ci_limit "$2")
  shift 2
  if [ "$limit" -le 0 ]; then
    ci_record "$part" 0 "not run: CI's ${CI_BUDGET_S}s spent"
    return 1
  fi
  echo "ci: [$part] $*"
  t0=$(date +%s)
  if [ "$(type -t "$1")" = function ]; then
    timeout --kill-after=30 "$limit" bash -c '"$@"' "$1" "$@" || rc=$?
  else
    timeout --kill-after=30 "$limit" "$@" || rc=$?
  fi
  local took=$(($(date +%s) - t0))
  if [ "$rc" -eq 0 ]; then
    ci_record "$part" "$took" ok
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    ci_record "$part" "$took" "FAILED: timed out (${limit}s)"
  else
    ci_record "$part" "$took" "FAILED: exit $rc"
  fi
  return "$rc"
}

ci_summary() {
  local row part secs status
  echo
  echo "ci: summary (total $(ci_elapsed)s of CI's ${CI_BUDGET_S}s)"
  printf 'ci:   %-34s %7s  %s\n' part seconds status
  for row in "${CI_ROWS[@]}"; do
    IFS=$'\t' read -r part secs status <<<"$row"
    printf 'ci:   %-34s %7s  %s\n' "$part" "$secs" "$status"
  done
  if [ "${#CI_FAILED[@]}" -gt 0 ]; then
    echo "ci: FAILED: ${CI_FAILED[*]}"
  fi
}

# ---------------------------------------------------------------------------
# The wheelhouse and its background download
# ---------------------------------------------------------------------------

# An empty constraints file: PIP_CONSTRAINT pointing at it lifts the machine's global pip
# constraint (torch<=2.14.1 here) for one command.
ci_wheels_init() { # WORK
  CI_WORK=$1
  CI_NO_CONSTRAINT="$CI_WORK/no-constraints.txt"
  : >"$CI_NO_CONSTRAINT"
  CI_WHEELS="${REDIST_OPT_CI_WHEELS:-}"
  if [ -z "$CI_WHEELS" ]; then
    local pip_cache
    if pip_cache=$("${PYTHON:-python3}" -m pip cache dir 2>/dev/null) && [ -n "$pip_cache" ]; then
      CI_WHEELS="$pip_cache/redist-opt-ci"
    else # pip's cache is off (PIP_NO_CACHE_DIR)
      CI_WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/redist-opt-ci"
    fi
  fi
  if [ "$CI_WHEELS" != off ] && ! mkdir -p "$CI_WHEELS" 2>/dev/null; then
    echo "ci: cannot create the wheelhouse $CI_WHEELS"
    CI_WHEELS=off
  fi
  export CI_WORK CI_WHEELS CI_NO_CONSTRAINT
  if [ "$CI_WHEELS" = off ]; then
    echo "ci: no wheelhouse: each release installs from the index"
    return
  fi
  # Keep the wheels of the default range only (a rehearsal with another list prunes nothing).
  if [ "$CI_TORCHES" = "$CI_TORCHES_DEFAULT" ]; then
    local d keep v
    for d in "$CI_WHEELS"/torch-*; do
      [ -d "$d" ] || continue
      keep=0
      for v in $CI_TORCHES; do [ "$d" = "$CI_WHEELS/torch-$v" ] && keep=1; done
      [ "$keep" -eq 1 ] || { echo "ci: pruning $d"; rm -rf "$d"; }
    done
  fi
  echo "ci: wheelhouse $CI_WHEELS ($(du -sh "$CI_WHEELS" 2>/dev/null | cut -f1) before this run)"
}

# Download every release's wheels, one after the other, in the background; each writes
# $CI_WORK/prefetch-X.rc (pip's status) when done.
ci_prefetch_start() {
  [ "$CI_WHEELS" != off ] || return 0
  [ -n "$CI_TORCHES" ] || return 0
  (
    for v in $CI_TORCHES; do
      t0=$(date +%s)
      rc=0
      PIP_CONSTRAINT="$CI_NO_CONSTRAINT" timeout 1800 "${PYTHON:-python3}" -m pip download -q \
        --progress-bar off -d "$CI_WHEELS/torch-$v" "torch==$v" >"$CI_WORK/prefetch-$v.log" 2>&1 || rc=$?
      echo "$(($(date +%s) - t0))" >"$CI_WORK/prefetch-$v.s"
      echo "$rc" >"$CI_WORK/prefetch-$v.rc"
    done
  ) &
  CI_PREFETCH_PID=$!
  export CI_PREFETCH_PID
  echo "ci: downloading torch $CI_TORCHES into the wheelhouse in the background (pid $CI_PREFETCH_PID)"
}

ci_prefetch_stop() { # the download loop and its pip (timeout passes the signal on to pip)
  if [ -n "${CI_PREFETCH_PID:-}" ] && kill -0 "$CI_PREFETCH_PID" 2>/dev/null; then
    pkill -TERM -P "$CI_PREFETCH_PID" 2>/dev/null || true
    kill "$CI_PREFETCH_PID" 2>/dev/null || true
  fi
}

# Wait (at most LIMIT seconds) for release V's download; its status (non-zero: install from the index).
ci_prefetch_wait() { # V LIMIT
  local v=$1 waited=0
  [ "$CI_WHEELS" != off ] || return 1
  while [ ! -f "$CI_WORK/prefetch-$v.rc" ]; do
    if [ "$waited" -ge "$2" ] || ! kill -0 "${CI_PREFETCH_PID:-0}" 2>/dev/null; then
      [ -f "$CI_WORK/prefetch-$v.rc" ] && break
      echo "ci: [$v] the background download did not finish; installing from the index"
      return 1
    fi
    sleep 5
    waited=$((waited + 5))
  done
  local rc
  rc=$(cat "$CI_WORK/prefetch-$v.rc")
  echo "ci: [$v] background download: exit $rc after $(cat "$CI_WORK/prefetch-$v.s")s" \
    "(waited ${waited}s for it; $(du -sh "$CI_WHEELS/torch-$v" | cut -f1) of wheels)"
  if [ "$rc" -ne 0 ]; then
    tail -n 20 "$CI_WORK/prefetch-$v.log" | grep -v 'is ignored' || true
    return 1
  fi
}

# ---------------------------------------------------------------------------
# One release of the range
# ---------------------------------------------------------------------------

# Install torch==V into the venv: from the wheelhouse when its download succeeded, else (or when
# that fails) from the index.
ci_install_torch() { # VENV V
  local venv=$1 v=$2
  if ci_prefetch_wait "$v" "$(ci_limit 1800)"; then
    if PIP_CONSTRAINT="$CI_NO_CONSTRAINT" "$venv/bin/python" -m pip install -q --progress-bar off \
      --no-index --find-links "$CI_WHEELS/torch-$v" "torch==$v"; then
      return 0
    fi
    echo "ci: [$v] the wheelhouse did not install; deleting it, installing from the index"
    rm -rf "${CI_WHEELS:?}/torch-$v"
  fi
  PIP_CONSTRAINT="$CI_NO_CONSTRAINT" "$venv/bin/python" -m pip install -q --progress-bar off "torch==$v"
}

ci_torch_version() { "$1/bin/python" -c 'import torch; print(torch.__version__)'; }

# ci_install V VENV: a fresh venv with torch==V and the package with its test extras, which must
# leave torch as it is.
ci_install() {
  local v=$1 venv=$2 before after
  "${PYTHON:-python3}" -m venv "$venv" || return 1
  ci_install_torch "$venv" "$v" || return 1
  before=$(ci_torch_version "$venv") || return 1
  if [ "${before%%+*}" != "$v" ]; then
    echo "ci: [$v] installed torch $before, not $v" >&2
    return 1
  fi
  # The cap stays lifted here too: what keeps torch must be our range, not the machine's cap.
  PIP_CONSTRAINT="$CI_NO_CONSTRAINT" "$venv/bin/python" -m pip install -q --progress-bar off -e ".[test]" ||
    return 1
  after=$(ci_torch_version "$venv") || return 1
  if [ "$after" != "$before" ]; then
    echo "ci: [$v] pip install -e \".[test]\" changed torch from $before to $after" >&2
    return 1
  fi
  echo "ci: [$v] torch $after kept by pip install -e \".[test]\""
}

ci_demo() { # VENV LOG
  "$1/bin/redist-opt" demo 2>&1 | tee "$2"
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  if ! grep -q "every rank's result equals torch's redistribute" "$2"; then
    echo "ci: the demo did not print its comparison line" >&2
    return 1
  fi
}

# The range's hypothesis examples (tests/runtime/test_properties.py, profile "range"): 2.13.0 runs
# 1,000 and 5,000 ("ci").
CI_RANGE_N_EXEC=500
CI_RANGE_N_PLAN=1000

ci_range_tests() { # VENV V SHARE
  # the venv's bin first on PATH, as an activated venv (tests start `python` and `redist-opt`);
  # the hypothesis seed is the release's digits (2.15.0: 2150), so a failure reproduces
  local seed=${2//./}
  PATH="$1/bin:$PATH" VIRTUAL_ENV="$1" HYPOTHESIS_PROFILE=range REDIST_OPT_N_EXEC=$CI_RANGE_N_EXEC \
    REDIST_OPT_N_PLAN=$CI_RANGE_N_PLAN "$1/bin/python" -m pytest -q -m "not slow or differential" \
    --case-share "$3" --hypothesis-seed="$seed"
}

# Install every release's venv, one after the other, in the background (their pip runs use one
# core while the torch 2.13 tests use both); each writes $CI_WORK/install-V.rc (its status), .s
# (its seconds) and .log. Started once; a no-op without releases.
ci_range_install_start() {
  [ -z "${CI_INSTALL_PID:-}" ] || return 0
  [ -n "$CI_TORCHES" ] || return 0
  (
    for v in $CI_TORCHES; do
      t0=$(date +%s)
      rc=0
      timeout --kill-after=30 "$(ci_limit 2400)" bash -c 'ci_install "$@"' _ "$v" "$CI_WORK/venv-$v" \
        >"$CI_WORK/install-$v.log" 2>&1 || rc=$?
      echo "$(($(date +%s) - t0))" >"$CI_WORK/install-$v.s"
      echo "$rc" >"$CI_WORK/install-$v.rc"
    done
  ) &
  CI_INSTALL_PID=$!
  export CI_INSTALL_PID
  echo "ci: installing the venvs of torch $CI_TORCHES in the background (pid $CI_INSTALL_PID)"
}

ci_range_install_stop() {
  if [ -n "${CI_INSTALL_PID:-}" ] && kill -0 "$CI_INSTALL_PID" 2>/dev/null; then
    pkill -TERM -P "$CI_INSTALL_PID" 2>/dev/null || true
    kill "$CI_INSTALL_PID" 2>/dev/null || true
  fi
}

# Wait for release V's background install; its status, and its log on stdout.
ci_install_wait() { # V
  local v=$1
  while [ ! -f "$CI_WORK/install-$v.rc" ]; do
    if ! kill -0 "${CI_INSTALL_PID:-0}" 2>/dev/null && [ ! -f "$CI_WORK/install-$v.rc" ]; then
      echo "ci: [$v] the background install loop ended without installing it" >&2
      return 1
    fi
    sleep 5
  done
  grep -v 'is ignored' "$CI_WORK/install-$v.log" || true
  return "$(cat "$CI_WORK/install-$v.rc")"
}

ci_run_release() { # V SHARE
  local v=$1 share=$2 venv="$CI_WORK/venv-$1"
  echo
  echo "ci: ===== torch $v: install, demo, quick tier + differential suites (case share $share) ====="
  local ok=0
  ci_range_install_start
  ci_step "torch $v: install (wait for it)" 2400 ci_install_wait "$v" || ok=$?
  if [ -f "$CI_WORK/install-$v.s" ]; then
    ci_note "torch $v: install (background)" "$(cat "$CI_WORK/install-$v.s")" \
      "exit $(cat "$CI_WORK/install-$v.rc") (while the runs before it tested)"
  fi
  if [ -f "$CI_WORK/prefetch-$v.rc" ]; then
    local rc
    rc=$(cat "$CI_WORK/prefetch-$v.rc")
    ci_note "torch $v: download (background)" "$(cat "$CI_WORK/prefetch-$v.s")" \
      "$([ "$rc" -eq 0 ] && echo "ok (in the background; the install waits for it)" || echo "exit $rc: installed from the index")"
  fi
  if [ "$ok" -eq 0 ]; then
    ci_step "torch $v: demo" 600 ci_demo "$venv" "$CI_WORK/demo-$v.log" || true
    ci_step "torch $v: tests (not slow or differential)" 2400 ci_range_tests "$venv" "$v" "$share" || true
  fi
  rm -rf "$venv"
}

# Shell functions that ci_step runs (timeout starts a new bash for them) and what they read.
export -f ci_elapsed ci_limit ci_prefetch_wait ci_install_torch ci_torch_version ci_install ci_demo \
  ci_range_tests ci_install_wait
export CI_T0 CI_BUDGET_S CI_RANGE_N_EXEC CI_RANGE_N_PLAN
