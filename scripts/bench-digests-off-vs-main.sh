#!/bin/sh
# Decode with op digests off: this build's `lockstep` vs another build's (main before issue 37),
# alternating, N pairs on one model; prints each pair's decode-time ratio and the median
# (tests/bench/README.md, "Op digests").
#   scripts/bench-digests-off-vs-main.sh NEW_LOCKSTEP OLD_LOCKSTEP MODEL_DIR [PAIRS]
set -eu
new=$1 old=$2 model=$3 pairs=${4:-6}
prompt=$(mktemp)
seq 1 32 | tr '\n' ' ' > "$prompt"
ms() { "$1" generate --model "$model" --prompt-tokens "$prompt" --max-new 48 --ignore-eos --threads 2 \
  --json - 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["timings"]["decode_ms"])'; }
ratios=""
i=0
while [ $i -lt "$pairs" ]; do
  if [ $((i % 2)) -eq 0 ]; then a=$(ms "$new"); b=$(ms "$old"); else b=$(ms "$old"); a=$(ms "$new"); fi
  r=$(python3 -c "print(round($a / $b, 4))")
  echo "pair $i: new ${a} ms, old ${b} ms, ratio $r"
  ratios="$ratios $r"
  i=$((i + 1))
done
python3 -c "import statistics,sys; print('median ratio (new / old):', statistics.median(map(float, sys.argv[1:])))" $ratios
rm -f "$prompt"
