"""cassandra-cdc: change data capture for Apache Cassandra, from commit-log bytes to Delta and Kafka.

One folder per stage; data flows down this list and imports run the other way (a stage imports only the stages
above it here, never one below):

    cql/         CQL types, Murmur3 tokens, table metadata and where it comes from (DDL, a live cluster)
    commitlog/   segment bytes -> typed mutations: container, codecs, encryption, mutation codec, writer
    celllog/     typed mutations -> the Arrow cell log (one row per cell or tombstone)
    state/       cell log -> exact row state (Cassandra's reconcile rules) and change events
    sstable/     SSTable files -> the same typed partitions and Arrow cell log as commit logs
    sinks/       events and state -> Avro/JSON, Delta tables, Kafka
    storage/     the object store and its one key layout (segments, quarantine, ledgers, Delta roots)
    spark/       the transform step on Spark
    agent/       beside each node: cdc_raw -> the object store
    pipeline/    the micro-batch DAG's steps: claim -> transform -> publish -> archive; backfill, maintenance
    cli/         the ``cassandra-cdc`` command
    demo/        the demo and what tests share with it: embedded servers, generated workloads (not for production)

Shared by every stage: ``errors`` (typed errors), ``wire`` (byte primitives), ``settings`` (one settings model),
``gcpause``, ``metrics`` (the Prometheus text format), ``allocator`` (how freed memory goes back to the kernel).
"""

from cdc_lib import allocator as _allocator

__version__ = "0.1.0"

# Before anything here imports pyarrow or the compiled core: mimalloc reads its options when they load.
_allocator.configure()
