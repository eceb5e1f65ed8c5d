# Sourced by the scripts: the project's own .venv, created on first use and installed into only when what it
# was installed from (requirements-ci.txt, pyproject.toml, the install kind) has changed since.
#   ensure_venv demo   mtpdiag[verify] (torch, megatron-core), held to requirements-ci.txt's pins
#   ensure_venv test   everything in requirements-ci.txt (pytest, hypothesis, ray, ruff, mypy, ...) and mtpdiag
# A test install serves the demo too. Never touches the python3 that is active.
VENV="${MTPDIAG_VENV:-$PWD/.venv}"

_venv_hash() {
  cat requirements-ci.txt pyproject.toml | python3 -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}

_venv_fresh() {  # $1: a stamp kind that would do
  [ -x "$VENV/bin/python" ] && [ -f "$VENV/.stamp-$1" ] && [ "$(cat "$VENV/.stamp-$1")" = "$(_venv_hash)" ]
}

ensure_venv() {
  local kind="$1"
  if _venv_fresh "$kind" || { [ "$kind" = demo ] && _venv_fresh test; }; then
    export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
    return 0
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
      echo "setup: mtpdiag needs Python >= 3.10 (python3 is $(python3 --version 2>&1))" >&2
      return 1
    fi
    echo "setup: creating $VENV" >&2
    python3 -m venv "$VENV" || { echo "setup: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; return 1; }
  fi
  local log pins
  log="$(mktemp)"
  echo "setup: installing the $kind dependencies into $VENV (once; again only when requirements-ci.txt or pyproject.toml change)" >&2
  if [ "$kind" = test ]; then
    set -- -r requirements-ci.txt -e .
  else
    pins="$VENV/constraints.txt"  # pip's constraints take no extras: ray[default]==x becomes ray==x
    sed -E 's/\[[^]]*\]//' requirements-ci.txt >"$pins"
    set -- -c "$pins" -e ".[verify]"
  fi
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "setup: pip install failed" >&2
    return 1
  fi
  rm -f "$log"
  "$VENV/bin/python" -W ignore -c "import torch, megatron.core, mtpdiag" || return 1
  _venv_hash >"$VENV/.stamp-$kind"
  export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
}
