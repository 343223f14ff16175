#!/usr/bin/env bash
# Ours against llama.cpp's llama-server on one model, in one interleaved run (issue 26's table):
# single stream, 16 streams, peak resident memory, TTFT of a ~600-token prompt, and the roofline.
#   bench/vs_llama_server.sh LLAMA_SERVER MODEL OUT.json
# MODEL: a packaged name (smollm2-135m, gemma3-270m) or a GGUF path, such as the 1B-class file
# `batchproof bench --write-model llama-1b-q4_k_m.gguf` writes. SERVE_ARGS: extra flags for our
# server (SERVE_ARGS="--numerics int8"); NUMERICS="float32 int8" runs ours once per numerics against
# the same peer. The JSON's "machine" names the CPU and its ISA flags.
# Run it on a quiet machine: nothing else on the cores while it measures.
set -euo pipefail
server=$1 model=$2 out=$3 port=${PORT:-8099}
file=$(python -c "import sys; from batchproof.engine.model.known_models import resolve_model; print(resolve_model(sys.argv[1]))" "$model")
log=/tmp/llama-server-$(basename "$file" .gguf).log
"$server" -m "$file" --port "$port" -t 2 -np 16 -c 32768 --metrics >"$log" 2>&1 &
peer=$!
trap 'kill $peer 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
serve_args=()
for arg in ${SERVE_ARGS:-}; do serve_args+=("--serve-arg=$arg"); done
# NUMERICS="float32 int8": one run of ours per numerics against the same peer process, each with
# the peer measured right after it (OUT-float32.json, OUT-int8.json).
if [ -z "${NUMERICS:-}" ]; then
    batchproof bench --model "$model" --serve "${serve_args[@]}" --vs "http://127.0.0.1:$port" --vs-pid "$peer" \
        --max-tokens "${MAX_TOKENS:-128}" --concurrency 1,16 --repeats "${REPEATS:-3}" --band-repeats 3 --json "$out"
else
    for numerics in $NUMERICS; do
        batchproof bench --model "$model" --serve "${serve_args[@]}" "--serve-arg=--numerics=$numerics" \
            --vs "http://127.0.0.1:$port" --vs-pid "$peer" --max-tokens "${MAX_TOKENS:-128}" --concurrency 1,16 \
            --repeats "${REPEATS:-3}" --band-repeats 3 --json "${out%.json}-$numerics.json"
    done
fi
