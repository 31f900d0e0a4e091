#!/usr/bin/env bash
# Run tests/frameworks against each torch in the given virtual environments and print the pass,
# fail and skip counts per torch version.
#
#   tools/torch_versions.sh VENV [VENV ...]
#   tools/torch_versions.sh /work/venv-dev /work/venvs/torch-2.14 /work/venvs/torch-2.15
#
# Each venv needs torch, numpy, pytest and pytest-timeout; tensorcomm is taken from this checkout
# (PYTHONPATH=src), not from the venv. Extra pytest arguments go in PYTEST_ARGS. Exits non-zero
# when any version had a failure.
set -u
if [ "$#" -eq 0 ]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 2
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
status=0
summary=""
for venv in "$@"; do
    python="$venv/bin/python"
    version="$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null)" || {
        summary+="$venv: no torch"$'\n'; status=1; continue; }
    log="$(mktemp -t torch_versions.XXXXXX)"
    start=$(date +%s)
    # shellcheck disable=SC2086
    timeout 3600 "$python" -m pytest -q -m "" -p no:warnings -p no:cacheprovider \
        ${PYTEST_ARGS:-} tests/frameworks >"$log" 2>&1
    code=$?
    line="$(grep -E '^[0-9]+ (passed|failed)|^(=+ )?[0-9]+ (passed|failed)' "$log" | tail -n 1 | tr -d '=')"
    [ "$code" -eq 0 ] || status=1
    summary+="torch $version ($venv): ${line:-no summary, exit $code} [$(( $(date +%s) - start )) s, log $log]"$'\n'
    grep -E '^FAILED|^ERROR' "$log" | sed 's/^/    /' >>"${log}.failed"
    [ -s "${log}.failed" ] && summary+="$(cat "${log}.failed")"$'\n'
done
printf '%s' "$summary"
exit "$status"
