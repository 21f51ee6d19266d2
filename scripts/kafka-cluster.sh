#!/usr/bin/env bash
# A three-node Apache Kafka cluster on one machine, beside the single test
# broker of scripts/kafka.sh (whose jars it uses): KRaft, each JVM both
# broker and controller, a static quorum of the three. Node n (1, 2, 3)
# serves PLAINTEXT on 127.0.0.1:9n91 and its controller on 127.0.0.1:9n93,
# with data under $WEIR_KAFKA_CLUSTER_DIR (default /tmp/weir-kafka-cluster)/n.
# Replicated as production is: topics of replication factor 3 with
# min.insync.replicas 2, so a write acknowledged with acks=all is on two
# nodes at least and survives losing any one.
#
#   scripts/kafka-cluster.sh start          # idempotent: running nodes are kept
#   scripts/kafka-cluster.sh kill-node 2    # SIGKILL one node
#   scripts/kafka-cluster.sh start-node 2   # start it again (it catches up)
#   scripts/kafka-cluster.sh leader TOPIC   # the node leading TOPIC's partition 0
#   scripts/kafka-cluster.sh stop           # stop all three, delete their data
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
home=${WEIR_KAFKA_HOME:-/opt/weir-kafka}
libs=$home/libs
base=${WEIR_KAFKA_CLUSTER_DIR:-/tmp/weir-kafka-cluster}
nodes=(1 2 3)
voters=1@127.0.0.1:9193,2@127.0.0.1:9293,3@127.0.0.1:9393
bootstrap=127.0.0.1:9191,127.0.0.1:9291,127.0.0.1:9391

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pidfile() { echo "$base/$1.pid"; }
running() { [ -f "$(pidfile "$1")" ] && grep -qa kafka.Kafka "/proc/$(cat "$(pidfile "$1")")/cmdline" 2>/dev/null; }
tool() {
  java -Xmx256m -Dweir.kafka.level=WARN -Dlog4j2.configurationFile="$home/log4j2.properties" \
    -cp "$libs/*" "$@"
}

config() {
  local n=$1
  cat <<EOF
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:9${n}91,CONTROLLER://127.0.0.1:9${n}93
advertised.listeners=PLAINTEXT://127.0.0.1:9${n}91
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$base/$n/data
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
# A killed node's partitions move on within seconds, as a managed service's do.
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=500
EOF
}

start_node() {
  local n=$1
  if running "$n"; then return; fi
  mkdir -p "$base/$n"
  config "$n" > "$base/$n/server.properties"
  # setsid: the node outlives this script and the shell that ran it.
  setsid java -Xmx384m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$home/log4j2.properties" \
    -cp "$libs/*" kafka.Kafka "$base/$n/server.properties" > "$base/$n/kafka.log" 2>&1 < /dev/null &
  echo $! > "$(pidfile "$n")"
}

# SIGKILL, then wait until the process is gone (its ports free again).
kill_node() {
  local n=$1 pid
  if running "$n"; then
    pid=$(cat "$(pidfile "$n")")
    kill -9 "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$(pidfile "$n")"
}

# Up means all three serve metadata and a replicated topic can be made.
await_up() {
  for _ in $(seq 1 120); do
    for n in "${nodes[@]}"; do
      if ! running "$n"; then
        echo "kafka-cluster: node $n exited; tail of $base/$n/kafka.log:" >&2
        tail -20 "$base/$n/kafka.log" >&2
        exit 1
      fi
    done
    if tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" \
        --create --if-not-exists --topic weir-cluster-ready --partitions 1 --replication-factor 3 \
        >/dev/null 2>&1; then
      echo "kafka-cluster: up on $bootstrap"
      return
    fi
    sleep 1
  done
  echo "kafka-cluster: no answer after 120 tries; see $base/*/kafka.log" >&2
  exit 1
}

case "${1:-start}" in
  start)
    ls "$libs"/.kafka-* >/dev/null 2>&1 \
      || { echo "kafka-cluster: fetching Kafka's jars through scripts/kafka.sh"; bash "$here/kafka.sh" start; }
    mkdir -p "$base"
    if [ ! -f "$base/cluster-id" ]; then
      tool kafka.tools.StorageTool random-uuid > "$base/cluster-id"
    fi
    for n in "${nodes[@]}"; do
      if [ ! -f "$base/$n/data/meta.properties" ]; then
        mkdir -p "$base/$n"
        config "$n" > "$base/$n/server.properties"
        tool kafka.tools.StorageTool format -t "$(cat "$base/cluster-id")" \
          -c "$base/$n/server.properties" >/dev/null
      fi
    done
    for n in "${nodes[@]}"; do start_node "$n"; done
    await_up ;;
  start-node) start_node "$2" ;;
  kill-node) kill_node "$2" ;;
  leader)
    tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --describe --topic "$2" \
      | sed -n 's/.*Partition: 0\s.*Leader: \([0-9-]*\).*/\1/p' ;;
  stop)
    for n in "${nodes[@]}"; do kill_node "$n"; done
    rm -rf "$base" ;;
  *) echo "usage: $0 [start|start-node N|kill-node N|leader TOPIC|stop]" >&2; exit 2 ;;
esac
