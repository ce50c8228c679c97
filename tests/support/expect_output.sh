#!/bin/bash
# expect_output.sh REGEX COMMAND [ARGS...]: runs COMMAND, shows its output, and succeeds only
# when it exits 0 AND its output (stdout and stderr) matches the extended regex REGEX.
# ctest's PASS_REGULAR_EXPRESSION alone ignores the exit code: a job whose rank or daemon failed
# after the expected line was printed would pass.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: expect_output.sh REGEX COMMAND [ARGS...]" >&2
  exit 2
fi
regex=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" > "$out" 2>&1
rc=$?
cat "$out"
if [ "$rc" -ne 0 ]; then
  echo "expect_output: '$1' exited with status $rc" >&2
  exit 1
fi
if ! grep -Eq -- "$regex" "$out"; then
  echo "expect_output: '$1' printed nothing matching '$regex'" >&2
  exit 1
fi
echo "expect_output: OK"
