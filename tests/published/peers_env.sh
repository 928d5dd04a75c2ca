#!/usr/bin/env bash
# The other projects' environment (their pins clash with the project's: speculators needs transformers <= 5.19,
# eagle-llm pins accelerate 0.21, specforge sglang): each installed without its dependencies, with only what their
# model classes and speculators' trainer import. About 3 minutes the first time; nothing when it exists.
#   tests/published/peers_env.sh [ENV_FOLDER]    (default: ~/.cache/hf_specdec/peers-venv)
set -euo pipefail
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
