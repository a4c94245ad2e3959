"""cassandra-driver with every result value as the bytes Cassandra sent (no decoding into Python types).

The driver decodes each value of a result into its own Python types (``util.Date``, naive ``datetime``,
``Duration``, ...) while it reads the response. A scan needs the serialized values instead: they are what cells
hold, and decoding them and serializing them again could only lose something. The driver also fails on some
values Cassandra 5.0 sends: ``TTL()`` of a non-frozen list whose elements have no TTL is a list with null
elements, which cassandra-driver 3.30 rejects ("Length must be positive") and then drops the connection.

``RawRowsProtocolHandler`` is the driver's own protocol handler with one message class replaced: result rows are
read as they arrive (one ``bytes`` or None per column) and left undecoded. It is set on a session of its own
(``Session.client_protocol_handler``), so no other user of the driver is affected.
"""
from __future__ import annotations

from cassandra.protocol import ProtocolHandler, ResultMessage, read_int


class RawRowsResultMessage(ResultMessage):
    """A RESULT message whose rows stay serialized: ``parsed_rows`` is a list of tuples of bytes/None."""

    def recv_results_rows(self, f, protocol_version, user_type_map, result_metadata, column_encryption_policy):
        self.recv_results_metadata(f, user_type_map)
        column_metadata = self.column_metadata or result_metadata
        count = read_int(f)
        width = len(column_metadata)
        self.parsed_rows = [self.recv_row(f, width) for _ in range(count)]
        self.column_names = [c[2] for c in column_metadata]
        self.column_types = [c[3] for c in column_metadata]


class RawRowsProtocolHandler(ProtocolHandler):
    """The driver's protocol handler, with result rows left as bytes (``RawRowsResultMessage``)."""

    message_types_by_opcode = {**ProtocolHandler.message_types_by_opcode,
                               RawRowsResultMessage.opcode: RawRowsResultMessage}
