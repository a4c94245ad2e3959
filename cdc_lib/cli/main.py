"""The ``cassandra-cdc`` command.

    cassandra-cdc inspect [--schema FILE | --schema-from-log] [--keystore PATH --keystore-password PW |
                          --key ALIAS=HEX] [--format json|text] [--system] [--strict] SEGMENT|SSTABLE...
    cassandra-cdc agent ...          (see ``cassandra-cdc agent --help``)
    cassandra-cdc demo ...           (the main job on embedded defaults; see ``cassandra-cdc demo --help``)

Exit statuses, the same for every subcommand: ``exits``. ``inspect`` checks every input (segments, schema,
keystore) before it reads a byte, so a bad argument is one line on stderr and no output; damage found while
reading is in the JSON/text records on stdout and summed up in one line on stderr.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

from cdc_lib.errors import CdcError, FormatError

from . import exits
from .exits import ArgumentParser

PROG = "cassandra-cdc"


class InputError(CdcError):
    """An input named on the command line cannot be used: ``path: reason``."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")


def _readable_file(path: str, what: str) -> Path:
    """``path`` if it is a regular file this process can read, else InputError saying why."""
    p = Path(path)
    try:
        if not p.exists():
            raise InputError(path, f"no such {what}")
        if p.is_dir():
            raise InputError(path, f"is a directory, not a {what}")
        if not p.is_file():
            raise InputError(path, f"is not a regular file, so not a {what}")
        with open(p, "rb"):
            pass
    except OSError as e:
        raise InputError(path, f"cannot be read ({e.strerror or e})") from None
    return p


def _readable_input(path: str) -> Path:
    """A commit-log segment, an SSTable ``*-Data.db`` or a table directory that can be read."""
    from cdc_lib.sstable import find_data_files, is_sstable_input
    if os.path.isdir(path):
        try:
            if not find_data_files(path):
                raise InputError(path, "is a directory without SSTables (no *-Data.db file in it)")
        except OSError as e:
            raise InputError(path, f"directory cannot be read ({e.strerror or e})") from None
        return Path(path)
    return _readable_file(path, "SSTable Data.db file" if is_sstable_input(path) else "segment file")


def _load_schema(path: str, *, table_ids: bool = True):
    """The ``--schema`` file; commit-log segments need the tables' ``ID = ...`` options, SSTables do not (their
    directories name the tables)."""
    p = _readable_file(path, "schema file")
    from cdc_lib.cql.schema_from_ddl import load_cql_schema
    from cdc_lib.sstable.table import load_schema_file
    raw = p.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, f"is not a CQL text file (byte {raw[e.start]:#04x} at offset {e.start} is not "
                               "UTF-8)") from None
    try:
        schema = load_cql_schema(p) if table_ids else load_schema_file(p)
    except CdcError as e:
        raise InputError(path, str(e).removeprefix(f"{path}: ")) from None
    if not schema.tables:
        raise InputError(path, "holds no CREATE TABLE statement (give the output of cqlsh -e 'DESCRIBE SCHEMA')")
    return schema


def _load_keys(args):
    if args.key and args.keystore:
        raise CdcError("give either --key or --keystore, not both")
    from cdc_lib.commitlog.encryption import EncryptionKeys
    if args.key:
        return EncryptionKeys.from_hex(",".join(args.key))
    if args.keystore:
        if args.keystore_password is None:
            raise CdcError("--keystore needs --keystore-password")
        _readable_file(args.keystore, "keystore")
        return EncryptionKeys.from_keystore(args.keystore, args.keystore_password, args.key_password)
    return None


def _segment_order(path):
    """Segments are read oldest first (by segment id) so the schema from the log is in force in order."""
    from cdc_lib.commitlog.segment import parse_segment_name
    try:
        return (0, parse_segment_name(str(path))[1], str(path))
    except CdcError:
        return (1, 0, str(path))


class _Tally:
    """What ``inspect`` saw, for its one-line reports on stderr."""

    def __init__(self):
        self.decoded = 0               # mutations decoded
        self.unknown = 0               # unknown_table records printed
        self.hidden = 0                # entries of Cassandra's own keyspaces left out
        self.damage: list = []         # Damage records with is_damage
        self.damaged_segments: set = set()


def _is_system(rec) -> bool:
    from cdc_lib.commitlog.segment import Damage
    from cdc_lib.cql.system_schema import SYSTEM_KEYSPACES, is_system_table_id
    if isinstance(rec, Damage):
        return rec.table_id is not None and is_system_table_id(rec.table_id)
    return bool(rec.updates) and all(u.table.keyspace in SYSTEM_KEYSPACES for u in rec.updates)


def _inspect(args) -> int:
    from cdc_lib.sstable import is_sstable_input, read_sstable_mutations

    # 1. every input, before anything is read or printed
    inputs = [_readable_input(s) for s in args.segments]
    sstables = [p for p in inputs if is_sstable_input(p)]
    segments = [p for p in inputs if not is_sstable_input(p)]
    schema = _load_schema(args.schema, table_ids=bool(segments)) if args.schema else None
    keys = _load_keys(args)

    from cdc_lib.commitlog.reader import read_mutations
    from cdc_lib.commitlog.segment import Damage

    from .render import damage_json_record, mutation_json_records, text_lines
    out = sys.stdout
    as_text = args.format == "text"
    tally = _Tally()

    def emit(rec):
        if as_text:
            out.write("\n".join(text_lines(rec)) + "\n")
        else:
            out.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")

    # 2. read: segments in segment id order, then SSTables
    logged = read_mutations(sorted(segments, key=_segment_order), schema, schema_from_log=args.schema_from_log,
                            keys=keys, strict=args.strict) if segments else iter(())
    try:
        for rec in itertools.chain(logged, read_sstable_mutations(sstables, schema, strict=args.strict)):
            if not args.system and _is_system(rec):
                tally.hidden += 1
                continue
            if isinstance(rec, Damage):
                if rec.is_damage:
                    tally.damage.append(rec)
                    tally.damaged_segments.add(rec.segment)
                elif rec.kind == "unknown_table":
                    tally.unknown += 1
                emit(damage_json_record(rec))
                continue
            tally.decoded += 1
            for r in mutation_json_records(rec):
                emit(r)
    except FormatError as e:            # --strict: the first damage
        out.flush()
        print(f"{PROG} inspect: stopped at the first damage (--strict): {e}", file=sys.stderr)
        return exits.DAMAGED
    except CdcError as e:
        out.flush()
        print(f"{PROG} inspect: could not finish: {e}", file=sys.stderr)
        return exits.FAILED
    out.flush()

    # 3. what a user must know, one line each
    if tally.unknown and not tally.decoded and not (args.schema or args.schema_from_log):
        print(f"{PROG} inspect: no schema given, so none of the {tally.unknown} entries could be decoded: "
              "add --schema FILE (cqlsh -e 'DESCRIBE SCHEMA' output) or --schema-from-log", file=sys.stderr)
    if tally.damage:
        first = tally.damage[0]
        print(f"{PROG} inspect: damaged input: {len(tally.damage)} damage record(s) in "
              f"{len(tally.damaged_segments)} of {_inputs_phrase(segments, sstables)}; first {first.segment} @ "
              f"{first.position}: {first.kind}: {first.reason}", file=sys.stderr)
        return exits.DAMAGED
    return exits.OK


def _inputs_phrase(segments: list, sstables: list) -> str:
    if not sstables:
        return f"{len(segments)} segment(s)"
    if not segments:
        return f"{len(sstables)} SSTable input(s)"
    return f"{len(segments) + len(sstables)} input(s)"


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description="Cassandra change data capture: inspect commit-log segments, "
                                              "run the node agent, or run the demo.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{inspect,agent,demo}")
    ins = sub.add_parser("inspect", help="decode commit-log segments or SSTables and print their contents",
                         description="Decode commit-log segments or SSTables and print one record per row, static "
                                     "row, partition deletion and range tombstone marker (JSON Lines, or text).")
    src = ins.add_mutually_exclusive_group()
    src.add_argument("--schema", metavar="FILE",
                     help="CQL schema file: cqlsh -e 'DESCRIBE SCHEMA' output (segments need the tables' "
                          "ID = ... option, SSTables do not)")
    src.add_argument("--schema-from-log", action="store_true",
                     help="take the schema from system_schema mutations inside the segments")
    ins.add_argument("--keystore", metavar="PATH", help="JCEKS/PKCS12 keystore with the commit-log encryption key")
    ins.add_argument("--keystore-password", metavar="PW", help="the keystore's password (with --keystore)")
    ins.add_argument("--key-password", metavar="PW", help="key password if it differs from the keystore password")
    ins.add_argument("--key", action="append", metavar="ALIAS=HEX",
                     help="an encryption key given directly (repeatable)")
    ins.add_argument("--format", choices=("json", "text"), default="json",
                     help="json: one JSON object per line (default); text: readable lines")
    ins.add_argument("--system", action="store_true",
                     help="also print entries of Cassandra's own keyspaces (system, system_schema, ...), "
                          "left out by default")
    ins.add_argument("--strict", action="store_true",
                     help="stop at the first damaged byte (exit 2) instead of reporting it and reading on")
    ins.add_argument("segments", nargs="+", metavar="SEGMENT|SSTABLE",
                     help="commit-log segment files (CommitLog-<version>-<id>.log, read oldest id first), SSTable "
                          "*-Data.db files or table directories")
    sub.add_parser("agent", help="ship cdc_raw segments to object storage (see: agent --help)", add_help=False)
    sub.add_parser("demo", help="run the whole pipeline on embedded servers (see: demo --help)", add_help=False)
    return p


def _quiet_broken_pipe() -> None:
    """stdout was closed by the reader (``| head``): stop quietly, as Unix tools do."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "agent":
        from .agent import agent_main
        return agent_main(argv[1:])
    if argv and argv[0] == "demo":
        from .demo import demo_main
        return demo_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return _inspect(args)
    except BrokenPipeError:
        _quiet_broken_pipe()
        return exits.OK
    except CdcError as e:              # an input or option that cannot be used: nothing was read
        print(f"{PROG} inspect: {e}", file=sys.stderr)
        return exits.USAGE
    except OSError as e:               # a file that went away or failed while it was read
        print(f"{PROG} inspect: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return exits.FAILED


if __name__ == "__main__":
    sys.exit(main())
