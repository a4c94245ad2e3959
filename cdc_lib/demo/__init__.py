"""The demo (``cassandra-cdc demo``, ``scripts/demo.sh``) and the machinery tests share with it: embedded servers
on 127.0.0.1 (``servers``) and generated workloads written as real segments (``workload``). Nothing here is
imported by the library a production deployment runs.
"""
