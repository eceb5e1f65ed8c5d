# Sourced by the scripts: the project's own .venv, created on first use and installed into only when what it
# was installed from (requirements-ci.txt, pyproject.toml, the install kind, the Python) has changed since.
#   ensure_venv demo   mtpdiag[verify] (torch, megatron-core), held to requirements-ci.txt's pins
#   ensure_venv test   everything in requirements-ci.txt (pytest, hypothesis, ray, ruff, mypy, ...) and mtpdiag
# A test install serves the demo too. Never touches the python3 that is active.
#
# The dependencies are installed once per machine and kept in a cache outside the clone, one venv per hash of
# requirements-ci.txt + pyproject.toml and the Python it is made from (and kind): $MTPDIAG_VENV_CACHE, default
# ~/.cache/mtpdiag/venvs. A clone's .venv is a hard-linked copy of the cached one (a copy where links cannot be
# made), with mtpdiag then installed into it in editable mode from that clone: a fresh clone on the same machine
# gets its .venv in seconds; a fresh machine, or changed pins, builds the cached venv first; a cached venv is
# used only when its hash is the clone's, never a stale one. MTPDIAG_VENV_CACHE=off builds .venv in place.
VENV="${MTPDIAG_VENV:-$PWD/.venv}"
VENV_CACHE="${MTPDIAG_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mtpdiag/venvs}"

# The Python the venv is made from: $MTPDIAG_PYTHON if set; else the distribution's /usr/bin/python3 where it is
# python3's minor version and can make a venv; else python3. Distributions build their Python with PGO and LTO,
# pyenv by default without: on this project's 2-core CI machines (pyenv's 3.11.7 first on PATH, Debian's 3.11.2
# beside it) Debian's used 14% less CPU to start a rank (import torch and megatron-core) and 27% less in a
# pure-Python loop, and the test suite is mostly such processes.
_venv_python() {
  if [ -n "${MTPDIAG_PYTHON:-}" ]; then
    echo "$MTPDIAG_PYTHON"
    return
  fi
  local system=/usr/bin/python3 minor='import sys; print("%d.%d" % sys.version_info[:2])'
  if [ -x "$system" ] && [ "$("$system" -c "$minor" 2>/dev/null)" = "$(python3 -c "$minor")" ] \
    && "$system" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "$system"
    return
  fi
  echo python3
}
VENV_PYTHON="$(_venv_python)"

_venv_hash() {  # of what the venv is installed from, and with
  { cat requirements-ci.txt pyproject.toml; "$VENV_PYTHON" -c 'import sys; print(sys.version)'; } \
    | python3 -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

_venv_fresh() {  # $1: a stamp kind that would do
  [ -x "$VENV/bin/python" ] && [ -f "$VENV/.stamp-$1" ] && [ "$(cat "$VENV/.stamp-$1")" = "$(_venv_hash)" ]
}

_venv_create() {  # $1: where
  if ! "$VENV_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "setup: mtpdiag needs Python >= 3.10 ($VENV_PYTHON is $("$VENV_PYTHON" --version 2>&1))" >&2
    return 1
  fi
  echo "setup: creating $1 with $VENV_PYTHON ($("$VENV_PYTHON" --version 2>&1); MTPDIAG_PYTHON chooses another)" >&2
  "$VENV_PYTHON" -m venv "$1" || {
    echo "setup: $VENV_PYTHON -m venv failed (Debian: apt-get install python3-venv)" >&2
    return 1
  }
}

_venv_pip() {  # $1: the venv; the rest: pip install's arguments
  local venv="$1" log
  shift
  log="$(mktemp)"
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "setup: pip install failed" >&2
    return 1
  fi
  rm -f "$log"
}

_venv_dependencies() {  # $1: kind; sets the arguments that install its dependencies (and mtpdiag, editable)
  if [ "$1" = test ]; then
    DEPENDENCIES=(-r requirements-ci.txt -e .)
  else
    local pins="$2/constraints.txt"  # pip's constraints take no extras: ray[default]==x becomes ray==x
    sed -E 's/\[[^]]*\]//' requirements-ci.txt >"$pins"
    DEPENDENCIES=(-c "$pins" -e ".[verify]")
  fi
}

# The cached venv of this hash and kind: built (dependencies only) when missing, under a lock.
_venv_cached() {  # $1: kind; prints the cached venv's path
  local kind="$1" key dir
  key="$(_venv_hash | cut -c1-20)-$kind-$("$VENV_PYTHON" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')"
  dir="$VENV_CACHE/$key"
  mkdir -p "$VENV_CACHE"
  (
    flock 9
    if [ -f "$dir/.complete" ]; then
      exit 0
    fi
    rm -rf "$dir"
    _venv_create "$dir" || exit 1
    echo "setup: installing the $kind dependencies into $dir (once per machine and pins)" >&2
    _venv_dependencies "$kind" "$dir"
    _venv_pip "$dir" "${DEPENDENCIES[@]}" || exit 1
    "$dir/bin/python" -W ignore -c "import torch, megatron.core, mtpdiag" || exit 1
    "$dir/bin/python" -m pip uninstall -q -y mtpdiag >/dev/null 2>&1 || exit 1  # each clone installs its own
    touch "$dir/.complete"
    # Keep the three newest cached venvs: clones made from older ones keep their own links.
    ls -1dt "$VENV_CACHE"/*/ 2>/dev/null | tail -n +4 | while read -r old; do rm -rf "$old"; done
  ) 9>"$VENV_CACHE/.lock" >&2 || return 1
  echo "$dir"
}

# .venv as a copy of the cached venv (hard links), its paths rewritten, and this clone's mtpdiag installed into it.
_venv_from_cache() {  # $1: kind
  local kind="$1" cached file
  cached="$(_venv_cached "$kind")" || return 1
  rm -rf "$VENV"
  echo "setup: $VENV from the cached $cached" >&2
  (  # a shared lock: no cached venv is pruned while a clone copies it
    flock -s 9
    cp -al "$cached" "$VENV" 2>/dev/null || { rm -rf "$VENV" && cp -a "$cached" "$VENV"; }
  ) 9>"$VENV_CACHE/.lock" || return 1
  rm -f "$VENV/.complete"
  # The scripts in bin/ name their venv: rewrite them as new files (sed -i renames), never through a link.
  for file in "$VENV"/bin/*; do
    if [ -f "$file" ] && [ ! -L "$file" ] && grep -qI -F "$cached" "$file" 2>/dev/null; then
      sed -i "s#$cached#$VENV#g" "$file"
    fi
  done
  _venv_pip "$VENV" --no-deps --no-build-isolation -e . || _venv_pip "$VENV" --no-deps -e . || return 1
  "$VENV/bin/python" -W ignore -c "import mtpdiag" || return 1
}

ensure_venv() {
  local kind="$1"
  if _venv_fresh "$kind" || { [ "$kind" = demo ] && _venv_fresh test; }; then
    export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
    return 0
  fi
  if [ "$VENV_CACHE" != off ] && command -v flock >/dev/null; then
    _venv_from_cache "$kind" || return 1
  else
    if [ ! -x "$VENV/bin/python" ]; then
      _venv_create "$VENV" || return 1
    fi
    echo "setup: installing the $kind dependencies into $VENV (once; again only when requirements-ci.txt or pyproject.toml change)" >&2
    _venv_dependencies "$kind" "$VENV"
    _venv_pip "$VENV" "${DEPENDENCIES[@]}" || return 1
    "$VENV/bin/python" -W ignore -c "import torch, megatron.core, mtpdiag" || return 1
  fi
  _venv_hash >"$VENV/.stamp-$kind"
  export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
}
