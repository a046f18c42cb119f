# Sourced by scripts that need Python packages from PyPI: `ensure_venv DIR REQUIREMENTS WHAT`
# makes the venv DIR from the pinned REQUIREMENTS file, or keeps it if it was made from the
# same file (a copy of which it holds as DIR/.requirements). WHAT names it in the progress.
ensure_venv() {
  local venv=$1 requirements=$2 what=$3
  if ! cmp -s "$requirements" "$venv/.requirements" 2>/dev/null; then
    printf '==> creating %s (%s from PyPI)\n' "$venv" "$what" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/.requirements"
  fi
}
