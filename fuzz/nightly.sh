#!/usr/bin/env bash
# Nightly fuzz run of the repository it lives in, configured by fuzz/nightly.toml.
# Extra arguments go to `c128a fuzz` and override the file, e.g.
#   fuzz/nightly.sh --minutes 60 --db redis://fuzz-db:6379/0
# Exit status: 0 clean, 1 failures found (new cases in c128a/conformance/regressions), 2 setup
# error, or a run that checked nothing or not every property (docs/how-to/fuzz-overnight.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${C128A_PYTHON:-}" && -x .venv/bin/python ]]; then
    C128A_PYTHON=.venv/bin/python
fi
mkdir -p fuzz/reports
stamp="$(date +%Y%m%d-%H%M%S)"
exec "${C128A_PYTHON:-python3}" -m c128a.cli fuzz --config fuzz/nightly.toml \
    --report "fuzz/reports/nightly-${stamp}.json" "$@"
