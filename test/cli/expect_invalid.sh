#!/usr/bin/env bash
# Runs a command that must reject its input: exit code 2, every FRAGMENT in
# its stderr, and the output file untouched (a sentinel written before the
# run must still be there afterwards: nothing the user had is lost).
#
# Usage: expect_invalid.sh OUTPUT_FILE FRAGMENT... -- COMMAND [ARGS...]
set -u
out="$1"; shift
fragments=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do fragments+=("$1"); shift; done
shift  # --
mkdir -p "$(dirname "$out")"
echo "sentinel" > "$out"
err="$(mktemp)"
"$@" >/dev/null 2>"$err"
rc=$?
status=0
if [ "$rc" -ne 2 ]; then echo "FAIL: exit code $rc, expected 2"; status=1; fi
for f in "${fragments[@]}"; do
  if ! grep -qF -- "$f" "$err"; then echo "FAIL: stderr lacks '$f'"; status=1; fi
done
if [ "$(cat "$out")" != "sentinel" ]; then echo "FAIL: $out was overwritten"; status=1; fi
if ls "$(dirname "$out")"/*.tmp.* >/dev/null 2>&1; then echo "FAIL: temporary file left behind"; status=1; fi
echo "stderr: $(cat "$err")"
rm -f "$err" "$out"
exit $status
