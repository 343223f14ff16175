#!/usr/bin/env bash
# The parity probe in its four modes against one running server, each witness judged by the
# check and drawn by the report:   bench/parity_modes.sh URL NAME OUTDIR [probe flags...]
# (identical and --mixed, over /v1/chat/completions and /v1/completions; the full 1,4,8,16
# ladder and 128 tokens of the shipped matrix). Writes OUTDIR/{witness,probe,check,report}-NAME-MODE-ROUTE.*
set -u
url=$1 name=$2 out=$3
shift 3
mkdir -p "$out"
for route in chat completions; do
  for mode in identical mixed; do
    flags=()
    if [ "$mode" = mixed ]; then flags=(--mixed); fi
    tag="$name-$mode-$route"
    batchproof probe --url "$url" --route "$route" "${flags[@]}" --witness "$out/witness-$tag.json" "$@" \
      > "$out/probe-$tag.txt" 2>&1
    echo "probe exit $?" >> "$out/probe-$tag.txt"
    batchproof check "$out/witness-$tag.json" > "$out/check-$tag.txt" 2>&1
    echo "check exit $?" >> "$out/check-$tag.txt"
    batchproof report "$out/witness-$tag.json" -o "$out/report-$tag.html" > /dev/null
    echo "$tag: $(head -1 "$out/check-$tag.txt")"
  done
done
