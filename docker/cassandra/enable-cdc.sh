#!/bin/sh
# Turns CDC on in the image's cassandra.yaml, then starts Cassandra as the image normally does.
# Tables still need `WITH cdc = true` to have their mutations kept in cdc_raw.
set -e
CONF=/etc/cassandra/cassandra.yaml
sed -i -e 's/^#\{0,1\} *cdc_enabled:.*/cdc_enabled: true/' "$CONF"
grep -q '^cdc_enabled: true' "$CONF" || echo 'cdc_enabled: true' >> "$CONF"
grep -q '^cdc_raw_directory:' "$CONF" || echo 'cdc_raw_directory: /var/lib/cassandra/cdc_raw' >> "$CONF"
exec /usr/local/bin/docker-entrypoint.sh cassandra -f
