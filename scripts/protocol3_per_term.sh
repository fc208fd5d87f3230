#!/bin/sh
# Protocol 3's per-term endpoint (docs/faithfulness/v3/PROTOCOL.md), both models one after the other:
#   nohup scripts/protocol3_per_term.sh > /tmp/p3_run.log 2>&1 &
# Rerun the same line to resume: a model whose folder holds a progress record continues with --resume
# (the saved documents are checked first, geolens.resume); each model logs to /tmp/p3_<model>.log.
cd "$(dirname "$0")/.." || exit 1
for m in smollm2-135m gemma3-270m; do
  out=docs/faithfulness/v3/$m
  extra=""
  [ -f "$out/per_term_progress.json" ] && extra="--resume"
  python3 -m geolens faithfulness --protocol docs/faithfulness/v3/protocol.json --stage per_term \
    --model "$m" --out "$out" --threads 1 $extra > "/tmp/p3_$m.log" 2>&1 || { echo "$m failed: see /tmp/p3_$m.log"; exit 1; }
done
