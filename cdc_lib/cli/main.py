"""The ``cassandra-cdc`` command.

    cassandra-cdc inspect [--schema FILE | --schema-from-log] [--keystore PATH --keystore-password PW |
                          --key ALIAS=HEX] [--format json|text] [--strict] SEGMENT|SSTABLE...
    cassandra-cdc agent ...          (see ``cassandra-cdc agent --help``)
    cassandra-cdc demo [--mutations N] (the main job on embedded defaults; see ``cdc_lib.demo``)

``inspect`` exit status: 0 when every byte was read (entries of tables the schema does not know are reported
as ``kind: "error"`` records but are not damage), 2 when a segment is damaged (CRC mismatch, broken framing,
undecodable section or entry), 1 for usage errors.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

from cdc_lib.errors import CdcError

EXIT_OK = 0
EXIT_USAGE = 1
EXIT_DAMAGED = 2


def _load_keys(args):
    if args.key and args.keystore:
        raise CdcError("give either --key or --keystore, not both")
    from cdc_lib.commitlog.encryption import EncryptionKeys
    if args.key:
        return EncryptionKeys.from_hex(",".join(args.key))
    if args.keystore:
        if args.keystore_password is None:
            raise CdcError("--keystore needs --keystore-password")
        return EncryptionKeys.from_keystore(args.keystore, args.keystore_password, args.key_password)
    return None


def _inspect(args) -> int:
    from cdc_lib.commitlog.reader import read_mutations
    from cdc_lib.commitlog.segment import DAMAGE_KINDS, Damage
    from cdc_lib.sstable import is_sstable_input, read_sstable_mutations

    from .render import damage_json_record, mutation_json_records, text_lines
    sstables = [p for p in args.segments if is_sstable_input(p)]
    segments = [p for p in args.segments if not is_sstable_input(p)]
    schema = None
    if args.schema:
        from cdc_lib.cql.schema_from_ddl import load_cql_schema
        from cdc_lib.sstable.table import load_schema_file
        schema = load_cql_schema(args.schema) if segments else load_schema_file(args.schema)
    keys = _load_keys(args)
    out = sys.stdout
    damaged = False
    as_text = args.format == "text"

    def emit(rec):
        if as_text:
            out.write("\n".join(text_lines(rec)) + "\n")
        else:
            out.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")

    records = read_mutations(sorted(segments, key=_segment_order), schema, schema_from_log=args.schema_from_log,
                             keys=keys, strict=args.strict) if segments else iter(())
    for rec in itertools.chain(records, read_sstable_mutations(sstables, schema, strict=args.strict)):
        if isinstance(rec, Damage):
            if rec.kind in DAMAGE_KINDS:
                damaged = True
            emit(damage_json_record(rec))
            continue
        for r in mutation_json_records(rec):
            emit(r)
    out.flush()
    return EXIT_DAMAGED if damaged else EXIT_OK


def _segment_order(path):
    """Segments are read oldest first (by segment id) so the schema from the log is in force in order."""
    from cdc_lib.commitlog.segment import parse_segment_name
    try:
        return (0, parse_segment_name(str(path))[1], str(path))
    except CdcError:
        return (1, 0, str(path))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cassandra-cdc", description="Cassandra change data capture")
    sub = p.add_subparsers(dest="command", required=True)
    ins = sub.add_parser("inspect", help="decode commit-log segments or SSTables and print their contents")
    src = ins.add_mutually_exclusive_group()
    src.add_argument("--schema", help="CQL schema file (DESCRIBE output; segments need the tables' ID = ... "
                                      "options, SSTables do not)")
    src.add_argument("--schema-from-log", action="store_true",
                     help="take the schema from system_schema mutations inside the segments")
    ins.add_argument("--keystore", help="JCEKS keystore with the commit-log encryption key")
    ins.add_argument("--keystore-password")
    ins.add_argument("--key-password", help="key password if it differs from the keystore password")
    ins.add_argument("--key", action="append", metavar="ALIAS=HEX", help="an encryption key given directly")
    ins.add_argument("--format", choices=("json", "text"), default="json")
    ins.add_argument("--strict", action="store_true", help="stop with an error at the first damaged byte")
    ins.add_argument("segments", nargs="+", metavar="SEGMENT|SSTABLE",
                     help="commit-log segments, SSTable *-Data.db files or table directories")
    sub.add_parser("agent", help="ship cdc_raw segments to object storage (see: agent --help)", add_help=False)
    sub.add_parser("demo", help="run the whole pipeline on embedded servers (see: demo --help)", add_help=False)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "agent":
        from .agent import agent_main
        return agent_main(argv[1:])
    if argv and argv[0] == "demo":
        from cdc_lib.demo.run import demo_main
        return demo_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "inspect":
            return _inspect(args)
    except CdcError as e:
        print(f"cassandra-cdc: {e}", file=sys.stderr)
        return EXIT_DAMAGED if hasattr(e, "position") else EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
