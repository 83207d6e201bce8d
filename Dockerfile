# streamalert: one image for every role. The entry point runs the supervisor;
# override the command to run one role (see docker-compose.yml).

# Stage 1: compile the evaluator's hot path with mypyc (app/runtime/native.py). It needs a C
# compiler, which the runtime image does not carry; the runtime loads the build only
# while its manifest matches the sources copied below, and runs plain Python otherwise.
FROM python:3.11 AS native
WORKDIR /opt/streamalert
COPY pyproject.toml requirements.txt requirements-dev.txt ./
RUN pip install --no-cache-dir -r requirements-dev.txt
COPY app ./app
RUN python -c "from app.runtime import native; raise SystemExit(native.build())" \
 && python -c "from app.runtime import native; native.activate(); print(native.status())" | grep '^compiled'
# ... and Spark's local file system (jobs/local_fs.py): Hadoop's, without a chmod process per
# file it creates. Compiled with a JDK against this pyspark's Hadoop client; the runtime image
# carries a JRE only, and the jar.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
COPY jobs ./jobs
COPY deps/local-fs ./deps/local-fs
RUN python -m jobs.local_fs && ls .cache/jars/local-fs/nio-local-fs-*.jar

# Stage 2: the JVM artifacts from Maven Central (deps/*/pom.xml), fetched as `make jars`
# does: Apache Kafka for the all-in-one `run` without KAFKA_BOOTSTRAP_SERVERS, and Spark's
# Kafka connector (docs/spark-kafka.md), passed to Spark as local jars at run time.
FROM maven:3.9-eclipse-temurin-17 AS jars
WORKDIR /opt/streamalert
COPY scripts/fetch-jars.sh ./scripts/
COPY deps ./deps
RUN bash scripts/fetch-jars.sh kafka spark-kafka

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYTHONPATH=/opt/streamalert \
    APP_DATA_DIR=/var/lib/streamalert \
    APP_DATASETS_DIR=/data/datasets

# Java for the PySpark engine; tini reaps zombies and forwards signals.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 streamalert \
 && mkdir -p /var/lib/streamalert /data/datasets \
 && chown -R streamalert:streamalert /var/lib/streamalert

WORKDIR /opt/streamalert
COPY requirements.txt .
RUN pip install -r requirements.txt
COPY app ./app
COPY agents ./agents
COPY ingest ./ingest
COPY dashboard ./dashboard
COPY rules ./rules
COPY jobs ./jobs
COPY config ./config
COPY --from=native /opt/streamalert/build ./build
COPY --from=jars /opt/streamalert/.cache/jars ./.cache/jars
COPY --from=native /opt/streamalert/.cache/jars/local-fs ./.cache/jars/local-fs
COPY deps/local-fs ./deps/local-fs

USER streamalert
ENV PYSPARK_PYTHON=/usr/local/bin/python \
    PYSPARK_DRIVER_PYTHON=/usr/local/bin/python
EXPOSE 8501
ENTRYPOINT ["/usr/bin/tini", "--", "python", "-m", "app"]
CMD ["run"]
