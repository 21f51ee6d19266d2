#!/usr/bin/env bash
# Installs (Debian packages) and starts the brokers weir's tests run against,
# on loopback only: Mosquitto on 127.0.0.1:1883, RabbitMQ on
# 127.0.0.1:5672 and Kafka on 127.0.0.1:9092 (scripts/kafka.sh). Idempotent:
# does nothing for a broker already answering.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

need=()
command -v mosquitto >/dev/null || need+=(mosquitto mosquitto-clients)
command -v mosquitto_pub >/dev/null || need+=(mosquitto-clients)
command -v rabbitmq-server >/dev/null || need+=(rabbitmq-server)
# The TLS tests make their certificates with openssl, as an operator would.
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
# The unit file test runs `systemd-analyze verify`.
command -v systemd-analyze >/dev/null || need+=(systemd)
# The clock tests fake weir's wall clock with libfaketime.
[ -n "$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null)" ] || need+=(faketime)
# weir-lab's cluster test builds network namespaces and shapes them with tc.
{ command -v ip && command -v tc; } >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "services: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! port_open 1883; then
  echo "services: starting mosquitto on 127.0.0.1:1883"
  mosquitto -c "$here/mosquitto.conf" -d
fi

if ! port_open 5672; then
  echo "services: starting rabbitmq-server on 127.0.0.1:5672"
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  # RabbitMQ stands in for the cloud broker on the same 2-core box: its
  # schedulers must not spin-wait on cores weir and the load generator need
  # (RabbitMQ's advice for shared CPUs). Paced 50k/s into it, spinning cost
  # RabbitMQ 0.34 cores instead of 0.25 and weir's PUBACK p99 1.14 ms
  # instead of 0.66 (docs/benchmarks.md).
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"
  (rabbitmq-server > /tmp/weir-rabbitmq.log 2>&1 &)
  # await_startup waits for the node to boot; give it a generous bound
  # because a cold Erlang start on a busy 2-core machine can take a while.
  for _ in $(seq 1 120); do
    if rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1 && port_open 5672; then
      break
    fi
    sleep 1
  done
fi

for p in 1883 5672; do
  if ! port_open "$p"; then
    echo "services: nothing listens on 127.0.0.1:$p; see /tmp/weir-rabbitmq.log" >&2
    exit 1
  fi
done
echo "services: mosquitto and rabbitmq are up"
bash "$here/kafka.sh"
