"""Where events and state go: ``avro`` (Avro/JSON envelopes), ``delta`` (state tables and the events outbox),
``kafka`` (the exactly-once publisher). Each is imported on its own, so a process pays only for the sinks it uses.
"""
