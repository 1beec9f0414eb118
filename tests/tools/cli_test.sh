#!/usr/bin/env bash
# The kvshim CLI end to end: serve in the background with a private run dir, put/get round
# trips (files, stdin/stdout, both strategies), a missing name exits 1, peers and stats --json
# parse, usage errors exit 2, no reachable peer exits 3, SIGTERM stops serve cleanly and
# removes its socket, a killed serve's stale socket is cleaned up by the next command.
# usage: cli_test.sh /path/to/kvshim
set -u
K=${1:?usage: cli_test.sh /path/to/kvshim}
T=$(mktemp -d /tmp/kvs-cli-XXXXXX)
SP=
cleanup() {
  if [ -n "$SP" ]; then kill -KILL "$SP" 2>/dev/null; wait "$SP" 2>/dev/null; fi
  rm -rf "$T"
}
trap cleanup EXIT
export KVSHIM_RUN_DIR=$T/run KVSHIM_GROUP=cli
unset KVSHIM_STRATEGY KVSHIM_SALT KVSHIM_LOG
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
# expect CODE DESCRIPTION -- COMMAND...: runs COMMAND (stdout/stderr to files), checks its code
expect() {
  local want=$1 what=$2
  shift 3
  "$@" >"$T/out" 2>"$T/err"
  local got=$?
  if [ "$got" -eq "$want" ]; then ok "$what (exit $got)"; else
    fail "$what: exit $got, wanted $want; stderr: $(head -c 300 "$T/err")"; fi
}

start_serve() { # start_serve LOGNAME [args...]: sets SP and SOCK
  local log=$1
  shift
  "$K" serve --pool-size 64M "$@" >"$T/$log.out" 2>"$T/$log.err" &
  SP=$!
  SOCK=
  for _ in $(seq 1 500); do
    SOCK=$(sed -n 's/.*socket \(.*\.sock\)$/\1/p' "$T/$log.out" 2>/dev/null)
    [ -n "$SOCK" ] && [ -S "$SOCK" ] && return 0
    kill -0 "$SP" 2>/dev/null || break
    sleep 0.01
  done
  fail "kvshim serve did not start: $(cat "$T/$log.err")"
  exit 1
}

# ---- before any server: no peer (3) and usage errors (2) --------------------------------
printf 'x' >"$T/one"
expect 3 "get with no peer" -- "$K" get foo
expect 3 "put with no peer" -- "$K" put foo "$T/one"
expect 3 "peers with no peer" -- "$K" peers
expect 3 "stats with no peer" -- "$K" stats
expect 2 "no command" -- "$K"
expect 2 "unknown command" -- "$K" frobnicate
expect 2 "put without FILE" -- "$K" put onlyname
expect 2 "get without NAME" -- "$K" get
expect 2 "get with too many args" -- "$K" get a b c
# More than 64 arguments are refused before any is parsed, by every command (remote parsed
# them into its 64-entry array first, past its end).
expect 2 "remote with 70 arguments" -- "$K" remote $(seq 70)
grep -q 'too many arguments' "$T/err" || fail "remote with 70 arguments: stderr $(head -c 300 "$T/err")"
expect 2 "peers with an argument" -- "$K" peers extra
expect 2 "serve with an argument" -- "$K" serve extra
expect 2 "unknown option" -- "$K" get foo --no-such-option 1
expect 2 "bad option value" -- "$K" serve --pool-size banana
grep -qx "kvshim: bad value for --pool-size: 'banana' is not a size in bytes (suffix K/M/G/T, KiB/MiB/GiB/TiB)" "$T/err" ||
  fail "bad size said: $(head -c 300 "$T/err")"
expect 2 "bad choice" -- "$K" serve --disk-sync sometimes
grep -qx "kvshim: bad value for --disk-sync: 'sometimes' is not one of none|batch|always" "$T/err" ||
  fail "bad choice said: $(head -c 300 "$T/err")"
expect 2 "value out of range" -- "$K" serve --lease-ms=5
grep -qx "kvshim: bad value for --lease-ms: '5' is out of range \[10, 86400000\] ms" "$T/err" ||
  fail "out of range said: $(head -c 300 "$T/err")"
expect 2 "option without value" -- "$K" get foo --group
expect 2 "--json on put" -- "$K" put a "$T/one" --json
expect 0 "help" -- "$K" help get
grep -q "usage: kvshim get" "$T/out" || fail "help get printed: $(head -c 200 "$T/out")"
expect 0 "--version" -- "$K" --version
grep -Eqx 'kvshim [0-9]+\.[0-9]+\.[0-9]+' "$T/out" || fail "--version printed: $(head -c 200 "$T/out")"
expect 0 "version" -- "$K" version
grep -Eqx 'kvshim [0-9]+\.[0-9]+\.[0-9]+' "$T/out" || fail "version printed: $(head -c 200 "$T/out")"
expect 2 "version with an argument" -- "$K" version extra
[ -e "$T/run" ] && [ -n "$(ls -A "$T/run/cli" 2>/dev/null)" ] && fail "a client left files in the run dir"

# ---- a server -----------------------------------------------------------------------------
start_serve serve1
ok "serve started (pid $SP, socket $SOCK)"
[ "$(stat -c %a "$T/run/cli")" = 700 ] || fail "group dir mode $(stat -c %a "$T/run/cli")"
[ "$(stat -c %a "$SOCK")" = 600 ] || fail "socket mode $(stat -c %a "$SOCK")"

head -c 3000017 /dev/urandom >"$T/in"
expect 0 "put a 3 MB file" -- "$K" put blob1 "$T/in"
expect 0 "get it back" -- "$K" get blob1 "$T/got"
cmp -s "$T/in" "$T/got" && ok "put/get bytes identical" || fail "get returned different bytes"
rm -f "$T/got"
expect 0 "get it back inline" -- "$K" get blob1 "$T/got" --strategy inline
cmp -s "$T/in" "$T/got" && ok "inline get bytes identical" || fail "inline get: different bytes"
head -c 70001 /dev/urandom >"$T/in2"
"$K" put blob2 - <"$T/in2" 2>"$T/err" || fail "put from stdin: $(cat "$T/err")"
"$K" get blob2 >"$T/got2" 2>"$T/err" || fail "get to stdout: $(cat "$T/err")"
cmp -s "$T/in2" "$T/got2" && ok "stdin/stdout round trip" || fail "stdin/stdout round trip differs"
"$K" put blob3 - --strategy inline <"$T/in2" 2>"$T/err" || fail "inline put: $(cat "$T/err")"
"$K" get blob3 - >"$T/got3" 2>"$T/err" || fail "get blob3: $(cat "$T/err")"
cmp -s "$T/in2" "$T/got3" && ok "inline put round trip" || fail "inline put round trip differs"
expect 0 "put again (already present)" -- "$K" put blob1 "$T/in"
grep -q "already present" "$T/err" || fail "second put said: $(cat "$T/err")"
expect 1 "get of a missing name" -- "$K" get no-such-blob
[ -s "$T/out" ] && fail "a miss wrote to stdout"
expect 1 "salted name is another name" -- "$K" get blob1 --salt tenant2
: >"$T/empty"
expect 1 "put of an empty file" -- "$K" put e "$T/empty"
expect 1 "put of a missing file" -- "$K" put e "$T/does-not-exist"

"$K" peers --json >"$T/peers.json" 2>"$T/err" || fail "peers --json: exit $?"
python3 - "$T/peers.json" "$SP" "$SOCK" <<'EOF' && ok "peers --json parses and describes the server" || fail "peers --json: $(cat "$T/peers.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert isinstance(d, list) and len(d) == 1, d
p = d[0]
assert p["pid"] == int(sys.argv[2]), p
assert p["role"] == "cache" and p["strategy"] == "shm", p
assert p["socket"] == sys.argv[3], p
assert p["arena_bytes"] == 64 << 20 and 0 < p["used_bytes"] <= p["arena_bytes"], p
EOF
"$K" peers >"$T/peers.txt" 2>&1 || fail "peers: exit $?"
grep -q "cache" "$T/peers.txt" && grep -q "$SP" "$T/peers.txt" && ok "peers table" || fail "peers table: $(cat "$T/peers.txt")"

"$K" stats --json >"$T/stats.json" 2>"$T/err" || fail "stats --json: exit $?"
python3 - "$T/stats.json" <<'EOF' && ok "stats --json parses" || fail "stats --json: $(head -c 300 "$T/stats.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert isinstance(d, list) and len(d) == 1, d
s = d[0]
assert s["kvshim_stats_version"] == 1, s
assert s["store_objects"] == 3, s["store_objects"]
assert s["store_arena_bytes"] == 64 << 20
assert s["coord_requests"] > 0 and s["coord_bad_frames"] == 0, s
EOF
"$K" stats "$SP" --json >"$T/stats1.json" 2>"$T/err" || fail "stats PID --json: exit $?"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert isinstance(d, dict) and d["store_objects"] == 3, d' "$T/stats1.json" \
  && ok "stats PID --json is one object" || fail "stats PID --json: $(head -c 300 "$T/stats1.json")"
"$K" stats >"$T/stats.txt" 2>&1 || fail "stats: exit $?"
grep -q "^store_objects:3" "$T/stats.txt" && ok "stats INFO text" || fail "stats text: $(head -c 300 "$T/stats.txt")"
expect 1 "stats of an unknown peer" -- "$K" stats 999999999

# ---- SIGTERM: clean stop, socket removed ------------------------------------------------------
kill -TERM "$SP"
wait "$SP"
rc=$?
SP=
[ "$rc" -eq 0 ] && ok "serve exited 0 on SIGTERM" || fail "serve exited $rc on SIGTERM"
[ -e "$SOCK" ] && fail "serve left its socket $SOCK" || ok "socket removed"
grep -q "SIGTERM received" "$T/serve1.err" || fail "serve said: $(cat "$T/serve1.err")"
expect 3 "get after the server stopped" -- "$K" get blob1

# ---- a killed server: its stale socket is removed by the next command ------------------------
start_serve serve2
kill -KILL "$SP"
wait "$SP" 2>/dev/null
SP=
[ -S "$SOCK" ] && ok "killed serve left a stale socket" || fail "no stale socket to clean up"
expect 3 "peers with only a stale socket" -- "$K" peers
[ -e "$SOCK" ] && fail "stale socket not removed" || ok "stale socket removed by discovery"

# ---- SIGINT too; a tier's option without its tier is warned about, and serve runs ------------
KVSHIM_REMOTE_TTL=5000 start_serve serve3 --disk-size 2G
kill -INT "$SP"
wait "$SP"
rc=$?
SP=
[ "$rc" -eq 0 ] && [ ! -e "$SOCK" ] && ok "SIGINT stops serve cleanly" || fail "SIGINT: exit $rc"
for want in "kvshim serve: --disk-size (KVSHIM_DISK_SIZE) is ignored without --disk (KVSHIM_DISK)" \
            "kvshim serve: --remote-ttl (KVSHIM_REMOTE_TTL) is ignored without --remote (KVSHIM_REMOTE)"; do
  grep -qxF "$want" "$T/serve3.err" && ok "warned: $want" || fail "serve3 said: $(cat "$T/serve3.err")"
done
[ "$(grep -c "is ignored without" "$T/serve3.err")" -eq 2 ] || fail "serve3 warned: $(cat "$T/serve3.err")"
grep -q "is ignored without" "$T/serve1.err" && fail "serve1 (no tier options) warned: $(cat "$T/serve1.err")"

if [ "$fails" -ne 0 ]; then
  echo "cli_test: $fails failure(s)"
  exit 1
fi
echo "cli_test: all passed"
