# syntax=docker/dockerfile:1.7
# A single-node Apache Kafka broker (KRaft, broker and controller in one process) from Maven
# Central's jars, for clusters that have no Kafka of their own (the local cluster of `make k8s-up`).
#
# The build context is a folder holding `libs/` (the broker's jars, as `python -m
# baton_tools.kafka fetch` copies them) and this folder's files; docker/build.sh prepares it:
#   docker/build.sh kafka
#
# Configuration comes from the environment: KAFKA_ADVERTISED_HOST (the name clients reach this
# broker by), KAFKA_CLUSTER_ID (22 characters, URL-safe base64) and KAFKA_PARTITIONS.

# Pin the base image by digest for production builds: --build-arg JRE_IMAGE=<tag>@sha256:<digest>.
ARG JRE_IMAGE=eclipse-temurin:17.0.15_6-jre-noble

FROM ${JRE_IMAGE}
LABEL org.opencontainers.image.title="baton-kafka" \
      org.opencontainers.image.description="Apache Kafka broker (KRaft, single node) from Maven Central's jars"
RUN groupadd --system --gid 10001 kafka \
    && useradd --system --uid 10001 --gid kafka --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin kafka
COPY libs/ /opt/kafka/libs/
COPY log4j2.properties kafka-start.sh /opt/kafka/
ENV KAFKA_DATA=/var/lib/kafka \
    KAFKA_HEAP_OPTS="-Xms256m -Xmx512m"
USER 10001:10001
EXPOSE 9092 9093
ENTRYPOINT ["/opt/kafka/kafka-start.sh"]
