#!/usr/bin/env bash
# The parity probe in its modes against one running server, each witness judged by the check and
# drawn by the report:   bench/parity_modes.sh URL NAME OUTDIR [probe flags...]
# Modes (MODES, default "identical mixed cache stream-parity"): identical, --mixed, --cache,
# --stream-parity, and "all" (identical with --cache and --stream-parity in one run). Routes (ROUTES,
# default "chat completions"). CONTRACT, when set, is passed to the check and the report.
# Writes OUTDIR/{witness,probe,check,report}-NAME-MODE-ROUTE.* and appends each command to
# OUTDIR/commands.txt. Other probe flags (--matrix, --extra-body, --server-log ...) follow NAME.
set -u
url=$1 name=$2 out=$3
shift 3
mkdir -p "$out"
contract=()
if [ -n "${CONTRACT:-}" ]; then contract=(--contract "$CONTRACT"); fi
for route in ${ROUTES:-chat completions}; do
  for mode in ${MODES:-identical mixed cache stream-parity}; do
    case $mode in
      identical) flags=() ;;
      mixed) flags=(--mixed) ;;
      cache) flags=(--cache) ;;
      stream-parity) flags=(--stream-parity) ;;
      all) flags=(--cache --stream-parity) ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    tag="$name-$mode-$route"
    cmd=(batchproof probe --url "$url" --route "$route" "${flags[@]}" --witness "$out/witness-$tag.json" "$@")
    printf '%q ' "${cmd[@]}" >> "$out/commands.txt"; echo >> "$out/commands.txt"
    "${cmd[@]}" > "$out/probe-$tag.txt" 2>&1
    echo "probe exit $?" >> "$out/probe-$tag.txt"
    batchproof check "$out/witness-$tag.json" "${contract[@]}" > "$out/check-$tag.txt" 2>&1
    echo "check exit $?" >> "$out/check-$tag.txt"
    batchproof report "$out/witness-$tag.json" "${contract[@]}" -o "$out/report-$tag.html" > /dev/null
    echo "$tag: $(grep -m1 '^batchproof probe:' "$out/probe-$tag.txt") / $(head -1 "$out/check-$tag.txt")"
  done
done
