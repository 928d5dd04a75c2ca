#!/usr/bin/env bash
# Regenerates tests/published/fixtures/ with the other projects' own code, in an environment of their own (their pins
# clash with the project's: speculators needs transformers <= 5.19, eagle-llm pins accelerate 0.21, specforge sglang).
# Each is installed without its dependencies, with only what its model classes import. About 3 minutes the first time.
# Then tests/published/exports/: hf_specdec's exports (written with the project's `python`), and what the peers compute
# with them.
#   tests/published/make_fixtures.sh [ENV_FOLDER]    (default: ~/.cache/hf_specdec/peers-venv)
set -euo pipefail
cd "$(dirname "$0")"
env_dir="${1:-$HOME/.cache/hf_specdec/peers-venv}"
if [ ! -x "$env_dir/bin/python" ]; then
    python -m venv "$env_dir"
    pip="$env_dir/bin/python -m pip install --quiet"
    $pip torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    $pip transformers==5.19.0 safetensors accelerate
    $pip --no-deps speculators==0.9.0 hs-connectors==0.9.0 eagle-llm==1.2.1 medusa-llm==0.1 specforge==0.2.0
    $pip pydantic pydantic-settings "loguru<=0.7.3" httpx "datasets>=4,<=5.1" "openai>=2" click rich typer psutil \
        aiohttp protobuf
fi
rm -rf fixtures && mkdir fixtures
(cd ../.. && python -c "from tests.test_published import export_inputs; export_inputs()")
"$env_dir/bin/python" make_fixtures.py
"$env_dir/bin/python" -m pip freeze | grep -iE "^(torch|transformers|speculators|eagle-llm|medusa-llm|specforge)==" \
    > fixtures/written_by.txt
du -sh fixtures
