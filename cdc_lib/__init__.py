"""cassandra-cdc: change data capture for Apache Cassandra, from commit-log bytes to Delta and Kafka.

Data flows one way: segment bytes (``segment``) -> mutations and cells (``mutation``, ``cqltypes``,
``schema``) -> cell log (``celllog``) -> state merge (``state``) -> events (``events``) -> sinks
(``publish``, ``delta_store``). No module imports from a module downstream of it.
"""

__version__ = "0.1.0"

