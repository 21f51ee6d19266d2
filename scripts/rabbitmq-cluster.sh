#!/usr/bin/env bash
# A three-node RabbitMQ cluster on one machine, beside the test broker on
# 5672: nodes weir-a, weir-b and weir-c @localhost, AMQP on 127.0.0.1:5701,
# 5702 and 5703, Erlang distribution on 25701-25703, each with its own data
# and log directory under $WEIR_CLUSTER_DIR (default /tmp/weir-rabbit-cluster)
# and one Erlang cookie. weir-b and weir-c join weir-a (rabbitmqctl
# join_cluster), as an operator builds a cluster.
#
#   scripts/rabbitmq-cluster.sh start        # idempotent: a running cluster is kept
#   scripts/rabbitmq-cluster.sh stop-node b  # stop one node (rabbitmqctl stop)
#   scripts/rabbitmq-cluster.sh start-node b # start it again (it rejoins)
#   scripts/rabbitmq-cluster.sh ctl a ARGS   # rabbitmqctl against node a
#   scripts/rabbitmq-cluster.sh stop         # stop all three, delete their data
set -euo pipefail

base=${WEIR_CLUSTER_DIR:-/tmp/weir-rabbit-cluster}
nodes=(a b c)
server=/usr/lib/rabbitmq/bin/rabbitmq-server
ctl_bin=/usr/lib/rabbitmq/bin/rabbitmqctl
[ -x "$server" ] || { echo "rabbitmq-cluster: rabbitmq-server is not installed (run scripts/services.sh)" >&2; exit 1; }

port_of() { case $1 in a) echo 5701;; b) echo 5702;; c) echo 5703;; esac; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

env_of() {
  local n=$1 p
  p=$(port_of "$n")
  echo HOME="$base" \
    RABBITMQ_NODENAME="weir-$n@localhost" \
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT="$p" \
    RABBITMQ_DIST_PORT="$((p + 20000))" \
    RABBITMQ_MNESIA_BASE="$base/$n/mnesia" \
    RABBITMQ_LOG_BASE="$base/$n/log" \
    RABBITMQ_PID_FILE="$base/$n/pid" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$base/enabled_plugins" \
    RABBITMQ_CONFIG_FILE="$base/rabbitmq" \
    RABBITMQ_ADVANCED_CONFIG_FILE="$base/advanced.config"
}

ctl() {
  local n=$1; shift
  env HOME="$base" "$ctl_bin" -n "weir-$n@localhost" "$@"
}

start_node() {
  local n=$1 p
  p=$(port_of "$n")
  port_open "$p" && return 0
  mkdir -p "$base/$n/log" "$base/$n/mnesia"
  # The node outlives this script: it must not inherit descriptors beyond
  # stdio (a caller's lock file or pipe would stay held or open).
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null
    done
    # No spin-waiting schedulers: three nodes share 2 cores with weir
    # (scripts/services.sh says why).
    # shellcheck disable=SC2046
    env $(env_of "$n") RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none" \
      "$server" >"$base/$n/console.log" 2>&1 </dev/null &
  )
}

await_node() {
  local n=$1 p
  p=$(port_of "$n")
  for _ in $(seq 1 120); do
    if ctl "$n" -q await_startup --timeout 5 >/dev/null 2>&1 && port_open "$p"; then
      return 0
    fi
    sleep 1
  done
  echo "rabbitmq-cluster: node weir-$n did not start; see $base/$n/console.log" >&2
  exit 1
}

case ${1:-start} in
  start)
    mkdir -p "$base"
    if [ ! -f "$base/.erlang.cookie" ]; then
      head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$base/.erlang.cookie"
      chmod 400 "$base/.erlang.cookie"
    fi
    echo "[]." >"$base/enabled_plugins"
    # guest may log in from loopback (the default); quorum queues and
    # streams need nothing more.
    echo "loopback_users.guest = true" >"$base/rabbitmq.conf"
    echo "[]." >"$base/advanced.config"
    for n in "${nodes[@]}"; do start_node "$n"; done
    for n in "${nodes[@]}"; do await_node "$n"; done
    for n in b c; do
      if ! ctl a -q cluster_status 2>/dev/null | grep -q "weir-$n@localhost"; then
        ctl "$n" -q stop_app
        ctl "$n" -q join_cluster weir-a@localhost
        ctl "$n" -q start_app
      fi
    done
    running=$(ctl a -q cluster_status --formatter json | grep -o '"running_nodes":\[[^]]*\]')
    echo "rabbitmq-cluster: up: $running"
    ;;
  stop-node)
    ctl "$2" -q stop
    ;;
  start-node)
    start_node "$2"
    await_node "$2"
    ;;
  ctl)
    n=$2; shift 2
    ctl "$n" "$@"
    ;;
  stop)
    for n in "${nodes[@]}"; do
      port_open "$(port_of "$n")" && ctl "$n" -q stop || true
    done
    rm -rf "$base"
    ;;
  *)
    echo "usage: $0 start | stop-node N | start-node N | ctl N ARGS | stop" >&2
    exit 2
    ;;
esac
