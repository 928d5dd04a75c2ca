#!/usr/bin/env bash
# Regenerates tests/published/fixtures/ with the other projects' own code, in an environment of their own
# (peers_env.sh).
# Then tests/published/exports/: hf_specdec's exports (written with the project's `python`), and what the peers compute
# with them.
#   tests/published/make_fixtures.sh [ENV_FOLDER]    (default: ~/.cache/hf_specdec/peers-venv)
set -euo pipefail
cd "$(dirname "$0")"
env_dir="${1:-$HOME/.cache/hf_specdec/peers-venv}"
bash peers_env.sh "$env_dir"
rm -rf fixtures && mkdir fixtures
(cd ../.. && python -c "from tests.test_published import export_inputs; export_inputs()")
"$env_dir/bin/python" make_fixtures.py
"$env_dir/bin/python" -m pip freeze | grep -iE "^(torch|transformers|speculators|eagle-llm|medusa-llm|specforge)==" \
    > fixtures/written_by.txt
du -sh fixtures
