#!/usr/bin/env bash
# The published parity board: every server of bench/board.yaml (and the board's negative controls)
# probed in each configuration twice, into bench/results/board/ (board.html, board.json, and each
# run's witness and report). Hours of CPU: run it on a quiet machine, nothing else on the cores.
#   bench/board.sh [OUT_DIR] [--resume]      (BOARD_FILE=bench/board-quick.yaml for the quick board;
#                                            --resume: go on with an interrupted board in OUT_DIR)
# Needs the serve extra (ours), the fleet extra (the 2-replica row), transformers (its row) and
# llama-server at $LLAMA_SERVER (default /work/peer/llama-server). Prepares, once, under
# ${BOARD_MODELS:-$HOME/.cache/batchproof-board}: the F16 copy of the default model
# (bench/f16_copy.py) and the float32 Hugging Face directory transformers serve reads.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/board}
models=${BOARD_MODELS:-$HOME/.cache/batchproof-board}
mkdir -p "$models"
resolve() { python -c "import sys; from batchproof.engine.model.known_models import resolve_model; print(resolve_model(sys.argv[1]))" "$1"; }
export LLAMA_SERVER=${LLAMA_SERVER:-/work/peer/llama-server}
# The build, as llama-server says it ("Version: 0.5.0-dev (build 1, commit 0c1e570)"), for the witnesses.
export LLAMA_COMMIT=${LLAMA_COMMIT:-$("$LLAMA_SERVER" --version 2>&1 | grep -o 'commit [0-9a-f]*' | head -1 | cut -d' ' -f2)}
export SMOLLM2_Q4_1=$(resolve smollm2-135m)
export GEMMA_Q4_K_M=$(resolve gemma3-270m)
export TRANSFORMERS_VERSION=$(python -c "import transformers; print(transformers.__version__)")
export SMOLLM2_F16=$models/SmolLM2-135M-Instruct.F16.gguf
export SMOLLM2_HF=$models/SmolLM2-135M-Instruct-hf
[ -f "$SMOLLM2_F16" ] || python bench/f16_copy.py "$SMOLLM2_Q4_1" "$SMOLLM2_F16"
[ -f "$SMOLLM2_HF/model.safetensors" ] || python -c "
import sys, torch
from pathlib import Path
from tests.hf.checkpoints import convert_gguf
convert_gguf(Path(sys.argv[1]), {torch.float32: Path(sys.argv[2])})" "$SMOLLM2_Q4_1" "$SMOLLM2_HF"
echo "machine: $(hostname) · $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) · $(nproc) cores" >&2
batchproof board "${BOARD_FILE:-bench/board.yaml}" --out "$out" "${@:2}"
