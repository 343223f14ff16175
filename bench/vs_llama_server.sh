#!/usr/bin/env bash
# Ours against llama.cpp's llama-server on one model, in one interleaved run (issue 26's table):
# single stream, 16 streams, peak resident memory, TTFT of a ~600-token prompt, and the roofline.
#   bench/vs_llama_server.sh LLAMA_SERVER MODEL OUT.json      (MODEL: smollm2-135m or gemma3-270m)
# Run it on a quiet machine: nothing else on the cores while it measures.
set -euo pipefail
server=$1 model=$2 out=$3 port=${PORT:-8099}
file=$(python -c "from batchproof.engine.model.known_models import resolve_model; print(resolve_model('$model'))")
"$server" -m "$file" --port "$port" -t 2 -np 16 -c 32768 --metrics >/tmp/llama-server-$model.log 2>&1 &
peer=$!
trap 'kill $peer 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
batchproof bench --model "$model" --serve --vs "http://127.0.0.1:$port" --vs-pid "$peer" --concurrency 1,16 \
    --repeats "${REPEATS:-3}" --band-repeats 3 --json "$out"
