#!/bin/sh
# Writes the broker's configuration from the environment, formats the storage on first start and
# runs the broker in the foreground (it stops cleanly on SIGTERM).
set -eu

: "${KAFKA_ADVERTISED_HOST:?KAFKA_ADVERTISED_HOST must name the host clients reach this broker by}"
: "${KAFKA_CLUSTER_ID:?KAFKA_CLUSTER_ID must be 22 characters of URL-safe base64}"
PORT="${KAFKA_PORT:-9092}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
mkdir -p "$KAFKA_DATA/log" "$KAFKA_DATA/config"
CONFIG="$KAFKA_DATA/config/server.properties"
cat >"$CONFIG" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://0.0.0.0:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$KAFKA_ADVERTISED_HOST:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$KAFKA_DATA/log
offsets.topic.replication.factor=1
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=5
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
default.replication.factor=1
min.insync.replicas=1
PROPS
JVM="-Dlog4j2.configurationFile=/opt/kafka/log4j2.properties -Dkafka.logs.dir=$KAFKA_DATA -Djava.awt.headless=true"
# -g: a restarted broker keeps the data it has.
# shellcheck disable=SC2086
java -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmx128m $JVM -cp "/opt/kafka/libs/*" \
    kafka.tools.StorageTool format -g -t "$KAFKA_CLUSTER_ID" -c "$CONFIG"
# shellcheck disable=SC2086
exec java $KAFKA_HEAP_OPTS -XX:+UseG1GC $JVM -cp "/opt/kafka/libs/*" kafka.Kafka "$CONFIG"
