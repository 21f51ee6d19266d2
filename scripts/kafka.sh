#!/usr/bin/env bash
# Installs and starts a single-node Apache Kafka broker for weir's tests, on
# loopback only: KRaft mode, one JVM as both broker and controller, PLAINTEXT
# on 127.0.0.1:9092 (controller on 127.0.0.1:9093), and SASL over TLS on
# 127.0.0.1:9094 (PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, user `weir`,
# password `weir-secret`), and TLS with client certificates on
# 127.0.0.1:9095 (as Amazon MSK's TLS authentication). The test CA in
# $home/tls/ca.pem, made here with openssl, signs the broker's certificate
# and the client's (client.pem, client.key); other-client.pem and
# other-client.key come from a CA the broker does not trust. Idempotent: does nothing
# when a broker already answers on 9092. `kafka.sh stop` stops it (data is
# kept); `kafka.sh run CLASS ARGS...` runs a Kafka tool main class, e.g.
#   scripts/kafka.sh run org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:9092 --list
# No tarball from apache.org can be fetched here, only package registries, so
# the broker is assembled from Maven Central: the same jars the release's libs/
# folder holds, resolved by `mvn dependency:copy-dependencies`.
set -euo pipefail

# Pinned: the newest 4.x whose whole dependency tree resolved from the registry
# here; its jars are Java 17 class files (major 61), Debian 12's default JDK.
KAFKA_VERSION=4.4.0
# The log4j that kafka-server 4.4.0 itself depends on; Kafka 4.x logs through
# slf4j 1.7, which needs this binding to reach log4j2 (the release ships it).
LOG4J_VERSION=2.25.5
DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1

home=${WEIR_KAFKA_HOME:-/opt/weir-kafka}      # jars and config
data=${WEIR_KAFKA_DATA:-/var/tmp/weir-kafka}  # log.dirs (topic data, metadata)
log=${WEIR_KAFKA_LOG:-/tmp/weir-kafka.log}
pidfile=$home/kafka.pid
libs=$home/libs

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Ours and alive: the pid file's process is still kafka.Kafka (not a reused pid).
running() { [ -f "$pidfile" ] && grep -qa kafka.Kafka "/proc/$(cat "$pidfile")/cmdline" 2>/dev/null; }
# Tools log WARN and up to stderr, so their stdout stays clean for scripts.
tool() {
  java -Xmx256m -Dweir.kafka.level=WARN -Dlog4j2.configurationFile="$home/log4j2.properties" \
    -cp "$libs/*" "$@"
}

case "${1:-start}" in
  stop)
    if running; then
      pid=$(cat "$pidfile")
      echo "kafka: stopping broker (pid $pid)"
      kill "$pid"
      # A clean shutdown lets the next start skip log recovery; give it time.
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -0 "$pid" 2>/dev/null && { echo "kafka: still up after 30 s, killing"; kill -9 "$pid"; }
    elif port_open 9092; then
      echo "kafka: something else listens on 127.0.0.1:9092; not ours to stop" >&2
      exit 1
    fi
    rm -f "$pidfile"
    exit 0 ;;
  run) shift; tool "$@"; exit ;;
  start) ;;
  *) echo "usage: $0 [start|stop|run CLASS ARGS...]" >&2; exit 2 ;;
esac

if port_open 9092; then echo "kafka: already up on 127.0.0.1:9092"; exit 0; fi

need=()
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  echo "kafka: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The jars, once per version: a marker written last means a half-finished
# download (interrupted mvn) is redone rather than trusted.
if [ ! -f "$libs/.kafka-$KAFKA_VERSION" ]; then
  echo "kafka: fetching Kafka $KAFKA_VERSION jars with mvn into $libs"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # kafka_2.13 is the broker (kafka.Kafka, kafka.tools.StorageTool);
  # kafka-tools has TopicCommand and the console producer/consumer. Its
  # connect-runtime dependency (Jetty, Jersey: 10 MB) only serves the
  # Connect plugin tool, so it is left out.
  cat > "$tmp/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>weir</groupId><artifactId>weir-kafka</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version>
      <exclusions><exclusion><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId></exclusion></exclusions></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF
  rm -rf "$libs"
  # mvn's output is kept for a failure only (Maven 3.8 prints colour codes
  # even with -B -q when stdout is no terminal).
  if ! (cd "$tmp" && mvn -B "$DEP_PLUGIN:copy-dependencies" -DincludeScope=runtime \
      -DoutputDirectory="$libs") > "$tmp/mvn.log" 2>&1; then
    tail -40 "$tmp/mvn.log" >&2; echo "kafka: mvn failed" >&2; exit 1
  fi
  touch "$libs/.kafka-$KAFKA_VERSION"
fi

# The SASL_SSL listener's certificate, once: a CA of its own and a server
# certificate for 127.0.0.1, in a PKCS12 keystore (Java reads it natively;
# its PEM keystore wants an encrypted key).
tls=$home/tls
if [ ! -f "$tls/server.p12" ]; then
  mkdir -p "$tls"
  (
    cd "$tls"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=weir test Kafka CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' > server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile server.ext -out server.pem 2>/dev/null
    openssl pkcs12 -export -in server.pem -inkey server.key -certfile ca.pem -name kafka \
      -passout pass:weir-test -out server.p12.tmp
    mv server.p12.tmp server.p12
  )
fi

# Client certificates for the mutual-TLS listener, once: one from the test
# CA, one from a CA of its own that the broker does not trust.
if [ ! -f "$tls/other-client.pem" ]; then
  (
    cd "$tls"
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > client.ext
    openssl req -newkey rsa:2048 -nodes -subj "/CN=weir" -keyout client.key -out client.csr 2>/dev/null
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile client.ext -out client.pem 2>/dev/null
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=another CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout other-ca.key -out other-ca.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=weir" -keyout other-client.key -out other-client.csr 2>/dev/null
    openssl x509 -req -in other-client.csr -CA other-ca.pem -CAkey other-ca.key -CAcreateserial \
      -days 3650 -extfile client.ext -out other-client.pem.tmp 2>/dev/null
    mv other-client.pem.tmp other-client.pem
  )
fi

# Minimal config, rewritten each start so an edit here takes effect. The
# controller quorum is this node alone, found through bootstrap.servers (the
# dynamic quorum that 4.x formats with --standalone).
mkdir -p "$home" "$data"
cat > "$home/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:9093
listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093,SASL_SSL://127.0.0.1:9094,SSL://127.0.0.1:9095
advertised.listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9094,SSL://127.0.0.1:9095
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL
# SASL over TLS, as Event Hubs (PLAIN) and MSK or Confluent (SCRAM) take it.
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_weir="weir-secret";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$tls/server.p12
listener.name.sasl_ssl.ssl.keystore.password=weir-test
listener.name.sasl_ssl.ssl.key.password=weir-test
# TLS with client certificates from the test CA, as MSK's TLS authentication.
listener.name.ssl.ssl.keystore.type=PKCS12
listener.name.ssl.ssl.keystore.location=$tls/server.p12
listener.name.ssl.ssl.keystore.password=weir-test
listener.name.ssl.ssl.key.password=weir-test
listener.name.ssl.ssl.client.auth=required
listener.name.ssl.ssl.truststore.type=PEM
listener.name.ssl.ssl.truststore.location=$tls/ca.pem
log.dirs=$data
num.partitions=1
offsets.topic.replication.factor=1
# One partition, not 50: fewer files, and a consumer group is ready sooner.
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# As in production: topics are created on purpose (the tests create theirs
# through the admin API), so a mistyped topic is an error, not a new topic.
auto.create.topics.enable=false
EOF
# The broker logs INFO to its stdout (the log file); tools pass WARN.
cat > "$home/log4j2.properties" <<'EOF'
shutdownHook=disable
appender.err.type=Console
appender.err.name=err
appender.err.target=SYSTEM_ERR
appender.err.layout.type=PatternLayout
appender.err.layout.pattern=[%d] %p %m (%c)%n
rootLogger.level=${sys:weir.kafka.level:-INFO}
rootLogger.appenderRef.err.ref=err
EOF

# KRaft refuses to start on unformatted storage; format once, keep on restart.
if [ ! -f "$data/meta.properties" ]; then
  cluster=$(tool kafka.tools.StorageTool random-uuid)
  echo "kafka: formatting $data (cluster $cluster)"
  tool kafka.tools.StorageTool format --standalone -t "$cluster" -c "$home/server.properties" >/dev/null
fi

echo "kafka: starting Kafka $KAFKA_VERSION on 127.0.0.1:9092 (log $log)"
# setsid: the broker outlives this script and the shell that ran it.
setsid java -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
  -Dlog4j2.configurationFile="$home/log4j2.properties" \
  -cp "$libs/*" kafka.Kafka "$home/server.properties" > "$log" 2>&1 < /dev/null &
echo $! > "$pidfile"

# Up means the broker serves metadata, not just an open port: create (or
# find) a topic through the admin API. A cold JVM on 2 busy cores is slow.
for _ in $(seq 1 90); do
  if ! running; then
    echo "kafka: broker exited; tail of $log:" >&2; tail -20 "$log" >&2; exit 1
  fi
  if port_open 9092 && tool org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:9092 \
      --create --if-not-exists --topic weir-kafka-ready --partitions 1 --replication-factor 1 >/dev/null 2>&1; then
    # SCRAM credentials live in the cluster's metadata: set (again) here,
    # so a broker formatted before this listener existed has them too.
    # One mechanism per request (the broker refuses two for one user).
    for scram in SCRAM-SHA-256 SCRAM-SHA-512; do
      tool org.apache.kafka.tools.ConfigCommand --bootstrap-server 127.0.0.1:9092 --alter \
        --add-config "$scram=[iterations=4096,password=weir-secret]" \
        --entity-type users --entity-name weir >/dev/null
    done
    echo "kafka: up on 127.0.0.1:9092 (SASL over TLS on 127.0.0.1:9094, client certificates on 127.0.0.1:9095)"
    exit 0
  fi
  sleep 1
done
echo "kafka: no answer on 127.0.0.1:9092 after 90 tries; see $log" >&2
exit 1
