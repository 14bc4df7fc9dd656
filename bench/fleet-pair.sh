#!/usr/bin/env bash
# Two fleet nodes under load (SPEC §7, issue 37): the peer harness's client (oha) against
#   single: one postern, no [cluster]          (the baseline)
#   one:    one postern with [cluster]         (what the shared store costs)
#   pair:   two postern nodes with [cluster] behind a round-robin TCP balancer (haproxy)
# all on this machine's PostgreSQL (started here, fsync on) and the harness's nginx origin.
#
#   bench/fleet-pair.sh [--bin target/release/postern] [--modes "single one pair"] [run.sh options]
#   e.g. bench/fleet-pair.sh --scenarios "small-c32 post1k-c32" --duration 10s
#
# Needs root (PostgreSQL runs as user postgres), the harness set up once
# (`../shared/bench-peers/run.sh --setup-only`) and haproxy (installed when missing).
# On a 2-core host the nodes, PostgreSQL, the balancer, the client and the origin all share
# the same two cores: the pair shows what coordination costs, not what a second machine adds.
set -uo pipefail
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
peers=${PEERS_DIR:-$here/../../shared/bench-peers}
bin=target/release/postern
modes="single one pair"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
bin=$(readlink -f "$bin")
[ -x "$bin" ] || { echo "no postern binary at $bin (cargo build --release first)" >&2; exit 1; }
[ -x "$peers/run.sh" ] || { echo "no peer harness at $peers (set PEERS_DIR)" >&2; exit 1; }
command -v haproxy >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$pgbin/postgres" ] || { echo "PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 1; }
"$peers/run.sh" --setup-only >&2 || exit 1
PB_DIR=${PB_DIR:-/tmp/peerbench}
https_port=${ORIGIN_HTTPS_PORT:-18443}
front=${PB_OURS_PORT:-18090}   # what the client talks to: a node, or the balancer
pg_port=$((front + 20))
work=$(mktemp -d /tmp/fleetpair.XXXXXX)
chmod 755 "$work"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT

# One PostgreSQL data directory for every mode (each mode starts its own server on it).
mkdir -p "$work/pg" && chown postgres:postgres "$work/pg"
su postgres -s /bin/sh -c "$pgbin/initdb -D $work/pg/data -A trust -U postgres" >"$work/initdb.log" 2>&1 \
  || { cat "$work/initdb.log" >&2; exit 1; }
export POSTERN_PG_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
export POSTERN_VAULT_KEY=bench-vault-key

# node_config NAME PORT [cluster node id]
node_config() {
  local home=$work/$1 port=$2 node=${3:-}
  mkdir -p "$home"
  {
    printf '[proxy]\nlisten = "127.0.0.1:%s"\n[admin]\nlisten = "127.0.0.1:%s"\n' "$port" $((port + 1))
    printf '[ssh]\nlisten = "127.0.0.1:%s"\n[journal]\ndurability = "fsync"\n' $((port + 2))
    [ -n "$node" ] && printf '[cluster]\npostgres = "env:POSTERN_PG_URL"\nnode = "%s"\n' "$node"
    printf '[[credentials]]\nid = "bench"\nsecret = "bench-token"\n'
    printf 'inject = { header = "Authorization", format = "Bearer {secret}" }\n'
    printf '[[routes]]\nid = "origin-https"\ncredential = "bench"\n'
    printf 'match = { scheme = "https", host = "localhost", port = %s }\n' "$https_port"
    printf 'resolve = "127.0.0.1:%s"\nupstream_ca = "%s/pki/upstream-ca.pem"\n' "$https_port" "$PB_DIR"
  } >"$home/postern.toml"
  POSTERN_HOME=$home "$bin" init --config "$home/postern.toml" >/dev/null || exit 1
  printf 'peerbench-injected-token' | POSTERN_HOME=$home "$bin" secret set bench-token \
    --config "$home/postern.toml" >/dev/null || exit 1
}

# launcher MODE: the command the harness starts as "ours" (everything it needs, as children).
launcher() {
  local mode=$1 l=$work/$1.sh
  {
    echo '#!/usr/bin/env bash'
    echo 'pids=()'
    echo 'trap '"'"'kill -TERM "${pids[@]}" 2>/dev/null; wait'"'"' TERM INT EXIT'
    if [ "$mode" != single ]; then
      # Its own pid (no su in between), so the trap's SIGINT is PostgreSQL's fast shutdown.
      echo "setpriv --reuid postgres --regid postgres --clear-groups -- $pgbin/postgres -D $work/pg/data -p $pg_port -k $work/pg -c listen_addresses=127.0.0.1 >$work/pg.log 2>&1 & pg=\$!"
      echo 'trap '"'"'kill -INT $pg 2>/dev/null; kill -TERM "${pids[@]}" 2>/dev/null; wait'"'"' TERM INT EXIT'
      echo "for _ in \$(seq 100); do (echo > /dev/tcp/127.0.0.1/$pg_port) 2>/dev/null && break; sleep 0.1; done"
    fi
    case $mode in
      single|one) echo "POSTERN_HOME=$work/$mode $bin serve --config $work/$mode/postern.toml >$work/$mode.log 2>&1 & pids+=(\$!)" ;;
      pair)
        for n in a b; do
          echo "POSTERN_HOME=$work/pair-$n $bin serve --config $work/pair-$n/postern.toml >$work/pair-$n.log 2>&1 & pids+=(\$!)"
        done
        # The balancer listens once both nodes do (the harness starts measuring then).
        for p in $((front + 10)) $((front + 13)); do
          echo "for _ in \$(seq 100); do (echo > /dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done"
        done
        echo "haproxy -db -f $work/haproxy.cfg >$work/haproxy.log 2>&1 & pids+=(\$!)" ;;
    esac
    echo 'wait'
  } >"$l"
  chmod +x "$l"
  echo "$l"
}

node_config single "$front"
node_config one "$front" one
node_config pair-a $((front + 10)) a
node_config pair-b $((front + 13)) b
# One CA for the pair: the client trusts one.
cp "$work/pair-a/certs/"* "$work/pair-b/certs/"
cat >"$work/haproxy.cfg" <<EOT
global
  maxconn 4096
defaults
  mode tcp
  timeout connect 5s
  timeout client 120s
  timeout server 120s
listen postern
  bind 127.0.0.1:$front
  balance roundrobin
  server a 127.0.0.1:$((front + 10))
  server b 127.0.0.1:$((front + 13))
EOT

for mode in $modes; do
  # The previous mode's PostgreSQL is gone before the next starts on the same data.
  for _ in $(seq 100); do [ -e "$work/pg/data/postmaster.pid" ] || break; sleep 0.1; done
  ca=$work/$mode/certs/ca.pem
  [ "$mode" = pair ] && ca=$work/pair-a/certs/ca.pem
  echo "=== $mode"
  "$peers/run.sh" --no-install "http://127.0.0.1:$front" "$ca" \
    --ours-cmd "exec $(launcher "$mode")" "${args[@]}" 2>&1 | tail -n 12
  for log in "$work"/*.log; do
    grep -qiE "error|panic" "$log" && { echo "--- $(basename "$log")"; tail -n 5 "$log"; }
  done
done
