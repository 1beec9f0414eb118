#!/usr/bin/env bash
# kvshim A/B on the real engine: P app.mjs processes (node-llama-cpp 3.21.1) share one prompt
# prefix, run by scripts/ab in arms off (no kvshim: the app shares prefix states as files in a
# cache directory on disk), loaded (libkvshim.so with KVSHIM_ENABLE=0) and on (kvshim with
# KVSHIM_LLAMA_WRITE_THROUGH=0: states go to the pool and reach the other process as a kvshim
# peer; no state file is written). The numbers are in docs/PERF.md (section 6). The kvshim arms run
# with KVSHIM_LLAMA_PREFIX=0 (the state file adapter alone) unless --llama-prefix 1.
#
# Workload: a scripts/tiny-gguf model (default 8 layers x 512 embedding), one shared prefix of
# --prefix-tokens token ids (BOS + seeded random ids), per process --prompts prompts of that
# prefix + 16 process-specific tokens, --tokens generated per prompt, one thread per process.
# Rank i starts --stagger ms after rank i-1; every process waits for the others before it exits
# (app.mjs --barrier-*), so the process that saved a prefix is alive while the others load it,
# and each summary's cache_dir_bytes sees every file of the run. Each run (arm x rep) has its own
# cache directory: cache_dir_bytes is what the run left on disk, state_bytes_written what each
# process wrote (scripts/ab reports their mean over the processes).
#
# Usage: tests/engines/llama/ab_llama.sh [--procs 2] [--reps 3] [--prefix-tokens 500]
#            [--prompts 4] [--tokens 8] [--stagger 1500] [--arms off,loaded,on]
#            [--pool-size 256M] [--env KVSHIM_X=V]... [--layers 8] [--embd 512] [--work DIR]
#            [--out DIR] [--llama-prefix 0|1]
#            (--env: another variable for the kvshim arms, repeatable)
# Needs scripts/llama-setup done and build/preload/libkvshim.so (or --preload PATH).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)

procs=2 reps=3 prefix=500 prompts=4 tokens=8 stagger=1500 arms=off,loaded,on pool=256M
layers=8 embd=512 work=/tmp/kvshim-ab-llama out="" preload=$root/build/preload/libkvshim.so
extra_env=() llama_prefix=0
while [ $# -gt 0 ]; do
  case $1 in
    --procs) procs=$2 ;;  --reps) reps=$2 ;;  --prefix-tokens) prefix=$2 ;;
    --prompts) prompts=$2 ;;  --tokens) tokens=$2 ;;  --stagger) stagger=$2 ;;
    --arms) arms=$2 ;;  --pool-size) pool=$2 ;;  --layers) layers=$2 ;;  --embd) embd=$2 ;;
    --work) work=$2 ;;  --out) out=$2 ;;  --preload) preload=$2 ;;  --env) extra_env+=("$2") ;;
    --llama-prefix) llama_prefix=$2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "ab_llama.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift 2
done
[ -n "$out" ] || out=$work/ab-out
[ -f "$preload" ] || { echo "ab_llama.sh: $preload not built" >&2; exit 1; }
[ -d "$here/node_modules/node-llama-cpp" ] ||
  { echo "ab_llama.sh: run scripts/llama-setup first" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
python3 "$root/scripts/tiny-gguf" -q --layers "$layers" --embd "$embd" --out "$work/model.gguf"
python3 - "$work" "$procs" "$prefix" "$prompts" <<'EOF'
import json, random, sys
work, procs, prefix, prompts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = random.Random(42)
shared = [1] + [r.randrange(300, 4096) for _ in range(prefix - 1)]
for rank in range(procs):
    items = [{"tokens": shared + [r.randrange(300, 4096) for _ in range(16)]}
             for _ in range(prompts)]
    with open("%s/prompts-%d.json" % (work, rank), "w") as f:
        json.dump(items, f)
EOF

set -x
"$root/scripts/ab" --arms "$arms" --reps "$reps" --procs "$procs" --stagger "$stagger" \
  --preload "$preload" --out "$out" \
  --env KVSHIM_LLAMA_WRITE_THROUGH=0 KVSHIM_LLAMA_PREFIX="$llama_prefix" \
        KVSHIM_POOL_SIZE="$pool" ${extra_env[@]+"${extra_env[@]}"} -- \
  node "$here/app.mjs" --model "$work/model.gguf" --prompts "$work/prompts-{rank}.json" \
  --cache-dir "$work/cache-{arm}-{rep}" --barrier-dir "$work/barrier-{arm}-{rep}" \
  --barrier-count "$procs" --tokens "$tokens" --prefix-tokens "$prefix" \
  --ctx-size $((prefix + 16 + tokens + 64))
