#!/usr/bin/env bash
# kvshim: A/B of the transparent llama.cpp prefix cache (design §10.3) on the real engine.
#
# 4 node-llama-cpp processes (prefix_app.mjs, unmodified engine, threads 1, CPU) start together
# (--stagger apart), each answering 3 prompts that share a system prefix of about 1,100 tokens
# (generated English-like text; each process asks its own questions), on a generated 8-layer x
# 512 model, through scripts/ab: arms off (no preload), loaded (KVSHIM_ENABLE=0), on. In the on
# arm, rank 0 first starts `kvshim serve` in the run's KVSHIM_RUN_DIR (the cache peer), detached;
# it stops once every rank is done (the last rank keeps its `kvshim stats --json` in
# --out/serve-stats/serve-<rep>.json). Prints scripts/ab's table; results in --out.
#
# usage: tests/engines/llama/prefix_ab.sh [--reps N] [--batch N] [--stagger MS] [--out DIR]
#                                         [--build DIR] [--prefix WORDS] [--layers N --embd N]
#   --batch N    node-llama-cpp batch size (default 2048: one batch per prompt)
#   --prefix N   words of the shared system prefix (default 1100, about as many tokens)
#   --layers N, --embd N  the generated model's shape (default 8 x 512)
#   --build DIR  the kvshim build directory holding preload/libkvshim.so and tools/kvshim
#                (default build)
# Internal: prefix_ab.sh rank KVSHIM_CLI MODEL PROMPTS_DIR BATCH  (one engine process of a run)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)

if [ "${1:-}" = rank ]; then
  cli=$2 model=$3 prompts=$4 batch=$5
  rank=${AB_RANK:?} procs=${AB_PROCS:?} arm=${AB_ARM:?}
  if [ "$arm" = on ] && [ "$rank" = 0 ]; then
    # The cache peer lives beside the run, detached, so no rank's wall time waits for it: it
    # stops once every rank left its done file (or after 10 minutes).
    log="$KVSHIM_RUN_DIR/serve.log"
    mkdir -p "$KVSHIM_RUN_DIR"
    (
      env -u LD_PRELOAD -u KVSHIM_STATS "$cli" serve --pool-size 256M > "$log" 2>&1 &
      serve_pid=$!
      for _ in $(seq 12000); do
        [ "$(ls "$KVSHIM_RUN_DIR"/done.* 2>/dev/null | wc -l)" -ge "$procs" ] && break
        kill -0 "$serve_pid" 2>/dev/null || break
        [ -d "$KVSHIM_RUN_DIR" ] || break  # scripts/ab removed the run's directory
        sleep 0.05
      done
      kill -TERM "$serve_pid" 2>/dev/null || true
      wait "$serve_pid" 2>/dev/null || true
    ) < /dev/null > /dev/null 2>&1 &
    for _ in $(seq 200); do grep -q socket "$log" 2>/dev/null && break; sleep 0.05; done
  fi
  rc=0
  node "$HERE/prefix_app.mjs" --model "$model" --prompts "$prompts/prompts-$rank.json" \
    --batch-size "$batch" --tokens 16 || rc=$?
  if [ -n "${KVSHIM_RUN_DIR:-}" ] && [ -d "$KVSHIM_RUN_DIR" ]; then
    : > "$KVSHIM_RUN_DIR/done.$rank"
    # The last rank to finish keeps the cache peer's counters (the node's copy when engines
    # keep none, README "One copy per node") before scripts/ab removes the run directory:
    # every engine has left, so serve is the run's only live peer.
    if [ "$arm" = on ] && [ -n "${PREFIX_AB_SERVE_STATS:-}" ] &&
       [ "$(ls "$KVSHIM_RUN_DIR"/done.* 2>/dev/null | wc -l)" -ge "$procs" ]; then
      f="$PREFIX_AB_SERVE_STATS/serve-${AB_REP:-0}.json"
      env -u LD_PRELOAD -u KVSHIM_STATS "$cli" stats --json > "$f.$rank" 2>/dev/null &&
        mv "$f.$rank" "$f" || rm -f "$f.$rank"
    fi
  fi
  exit $rc
fi

reps=5 batch=2048 stagger=300 out="" build="$ROOT/build" prefix=1100 layers=8 embd=512
while [ $# -gt 0 ]; do
  case $1 in
    --reps) reps=${2:?}; shift ;;
    --batch) batch=${2:?}; shift ;;
    --stagger) stagger=${2:?}; shift ;;
    --prefix) prefix=${2:?}; shift ;;
    --layers) layers=${2:?}; shift ;;
    --embd) embd=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --build) build=$(cd "${2:?}" && pwd); shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "prefix_ab.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$out" ] || out="$ROOT/ab-out/prefix-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
data="$out/data"
mkdir -p "$data"
export PREFIX_AB_SERVE_STATS="$out/serve-stats"  # serve-<rep>.json per repetition of the on arm
mkdir -p "$PREFIX_AB_SERVE_STATS"
model="$data/model-${layers}x${embd}.gguf"
[ -f "$model" ] || python3 "$ROOT/scripts/tiny-gguf" -q --layers "$layers" --embd "$embd" --out "$model"
python3 - "$data" "$HERE" "$prefix" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[2])
from llama_e2e import text  # the words check_prefix.py's prompts are made of
system = text(1, int(sys.argv[3]))
for rank in range(4):
    prompts = [system + " question " + text(100 + 10 * rank + i, 12) for i in range(3)]
    with open(f"{sys.argv[1]}/prompts-{rank}.json", "w") as f:
        json.dump(prompts, f)
EOF
cd "$ROOT"
exec scripts/ab --arms off,loaded,on --reps "$reps" --procs 4 --stagger "$stagger" \
  --preload "$build/preload/libkvshim.so" --out "$out" \
  --env KVSHIM_POOL_SIZE=256M KVSHIM_HOST_POOL_SIZE=0 \
  -- "$HERE/prefix_ab.sh" rank "$build/tools/kvshim" "$model" "$data" "$batch"
