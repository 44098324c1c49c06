#!/usr/bin/env bash
# cli:options-documented: docs/spec/cli.md and the programs' --help agree.
#
# Usage: options_documented.sh CLI_MD BIN PROGRAM...
#   - every option a program's --help lists (each of its names: -o or
#     --output) is named somewhere in CLI_MD, as `--name` or `-o`;
#   - every long option in CLI_MD's synopsis (its first ``` block) under a
#     program's command line is one that program's --help lists;
#   - every option of a program's --help but --help and --version is on
#     that program's synopsis lines (one of its names).
# Exit 0 when they agree; 1 naming each option that is on one side only.
set -euo pipefail
doc=$1 bin=$2
shift 2
[ "$#" -ge 2 ] || { echo "FAIL: expected at least two programs, got $*" >&2; exit 1; }
[ -r "$doc" ] || { echo "FAIL: cannot read $doc" >&2; exit 1; }

# The synopsis block: the lines between the first two ``` fences.
synopsis=$(awk '/^```/ { n++; next } n == 1' "$doc")
[ -n "$synopsis" ] || { echo "FAIL: $doc has no synopsis block" >&2; exit 1; }

problems=0 checked=0
# names_in OPTION TEXT: whether TEXT names one of OPTION's names as a
# word (one is enough: -o for -o,--output).
names_in() {
  local name
  for name in ${1//,/ }; do
    grep -qE -- "(^|[^a-zA-Z0-9-])$name([^a-zA-Z0-9-]|$)" <<< "$2" && return 0
  done
  return 1
}
for program in "$@"; do
  help=$("$bin/$program" --help) || { echo "FAIL: $program --help exited non-zero" >&2; exit 1; }
  # CLI11 lists each option on a line of its own: two spaces, then its
  # names joined by commas ("  -o,--output TEXT:PATH REQUIRED").
  options=$(sed -n 's/^  \(-[^ ]*\).*/\1/p' <<< "$help")
  names=$(tr ',' '\n' <<< "$options")
  [ "$(wc -l <<< "$names")" -ge 3 ] || { echo "FAIL: $program --help lists fewer than 3 option names" >&2; exit 1; }
  while read -r option; do
    if ! names_in "$option" "$(cat "$doc")"; then
      echo "FAIL: $program $option: in its --help, not in $doc" >&2
      problems=$((problems + 1))
    fi
    checked=$((checked + 1))
  done <<< "$options"

  # The synopsis lines of this program: from a line that names it as the
  # command (first word, or after "mpirun -np N") to the next such line.
  lines=$(awk -v p="$program" '
    /^(mpirun -np [A-Z] )?spindle-[a-z]+ / { cmd = $1 == "mpirun" ? $4 : $1 }
    cmd == p' <<< "$synopsis")
  [ -n "$lines" ] || { echo "FAIL: $program has no command line in $doc's synopsis" >&2; problems=$((problems + 1)); }
  while read -r option; do
    case "$option" in -h,--help | --version) continue ;; esac
    if ! names_in "$option" "$lines"; then
      echo "FAIL: $program $option: in its --help, not in $doc's synopsis" >&2
      problems=$((problems + 1))
    fi
    checked=$((checked + 1))
  done <<< "$options"
  flags=$({ grep -oE -- '--[a-z][a-z0-9-]*' <<< "$lines" || true; } | sort -u)
  for flag in $flags; do
    if ! grep -qE -- "(^|,)$flag(,|$)" <<< "$names"; then
      echo "FAIL: $program $flag: in $doc's synopsis, not in its --help" >&2
      problems=$((problems + 1))
    fi
    checked=$((checked + 1))
  done
done
[ "$problems" = 0 ] || exit 1
echo "ok: $checked option names of $* agree with $doc"
