#!/bin/sh
# Turns CDC on in the image's cassandra.yaml, then starts Cassandra as the image normally does.
# Tables still need `WITH cdc = true` to have their mutations kept in cdc_raw.
#
# The commit log and cdc_raw are set explicitly, both under /var/lib/cassandra, which docker-compose.yml mounts
# as ONE volume: Cassandra hard-links each segment from the commit log into cdc_raw, and a hard link cannot
# cross filesystems (two volumes are two filesystems; the segment would not reach cdc_raw).
set -e
CONF=/etc/cassandra/cassandra.yaml
setting() {   # setting NAME VALUE: replace the (possibly commented) line, or append it
    if grep -q "^#\{0,1\} *$1:" "$CONF"; then
        sed -i -e "s|^#\{0,1\} *$1:.*|$1: $2|" "$CONF"
    else
        echo "$1: $2" >> "$CONF"
    fi
}
setting cdc_enabled true
setting commitlog_directory /var/lib/cassandra/commitlog
setting cdc_raw_directory /var/lib/cassandra/cdc_raw
exec /usr/local/bin/docker-entrypoint.sh cassandra -f
