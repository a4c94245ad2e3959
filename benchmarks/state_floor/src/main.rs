//! The floor under `bench_merge.py`'s "reconcile + events + rows": the least work any state engine must do to
//! write the outputs of the benchmark's batch, timed on as many threads as the engine uses.
//!
//! For each change `UPDATE kv SET v = ?, n = ? WHERE id = ?` of an existing row it writes what the compiled engine
//! writes, at the same sizes: the event id (SHA-256 over the id's input laid out as the engine's binary encoding:
//! the table, the keys, the op, the write time, the row's cells with their timestamps and the after image; two
//! ids at a time, as the engine hashes them), the event's JSON envelope with full `before` and `after` rows, the
//! key JSON, and the state row's columns (typed values, the key, two cells with timestamp, TTL and local deletion
//! time, the metadata columns), each column a buffer with its Arrow offsets. It does nothing else: no grouping of
//! the cell log into partitions, no decoding of the stored state, no merge, no images or change detection. So it
//! is a lower bound, not an engine.
//!
//! Prints one JSON line: `{"changes", "threads", "bytes", "fresh_s": [...], "warm_s": [...]}`; `fresh`: outputs
//! written into memory allocated for the round (first touch included, as the engine's), `warm`: into buffers a
//! previous round already wrote.

use std::time::Instant;

// the compiled engine's SHA-256, the same file: the floor hashes the ids as the engine does
#[path = "../../../native/src/sha256.rs"]
#[allow(dead_code)]
mod sha256;

/// Write time of the changes (`bench_merge.TS0` plus one second).
const TS: i64 = 1_763_000_001_000_000;
const HEX: &[u8; 16] = b"0123456789abcdef";

fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

fn push_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    push_u64(out, v.unsigned_abs());
}

/// A length-prefixed field of the id's input.
fn push_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

/// A string or binary Arrow column: values and offsets.
#[derive(Default)]
struct Var {
    data: Vec<u8>,
    offsets: Vec<i32>,
}

impl Var {
    fn with_capacity(rows: usize, bytes: usize) -> Var {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Var { data: Vec::with_capacity(bytes), offsets }
    }

    fn end(&mut self) {
        self.offsets.push(self.data.len() as i32);
    }

    fn push(&mut self, b: &[u8]) {
        self.data.extend_from_slice(b);
        self.end();
    }

    fn clear(&mut self) {
        self.data.clear();
        self.offsets.truncate(1);
    }

    fn bytes(&self) -> usize {
        self.data.len() + 4 * self.offsets.len()
    }
}

/// One thread's outputs, laid out as the engine's: the events' columns, then the state rows'.
#[derive(Default)]
struct Outputs {
    event_id: Var,
    op: Var,
    key_json: Var,
    event_json: Var,
    fixed: Vec<u8>,
    row_text: Var,
    row_key: Var,
    cell_names: Var,
    cell_values: Var,
    cell_fixed: Vec<u8>,
}

impl Outputs {
    fn with_capacity(n: usize) -> Outputs {
        Outputs {
            event_id: Var::with_capacity(n, 32 * n),
            op: Var::with_capacity(n, n),
            key_json: Var::with_capacity(n, 20 * n),
            event_json: Var::with_capacity(n, 400 * n),
            fixed: Vec::with_capacity(120 * n),
            row_text: Var::with_capacity(2 * n, 16 * n),
            row_key: Var::with_capacity(2 * n, 8 * n),
            cell_names: Var::with_capacity(2 * n, 2 * n),
            cell_values: Var::with_capacity(2 * n, 16 * n),
            cell_fixed: Vec::with_capacity(48 * n),
        }
    }

    fn clear(&mut self) {
        for v in [&mut self.event_id, &mut self.op, &mut self.key_json, &mut self.event_json, &mut self.row_text,
                  &mut self.row_key, &mut self.cell_names, &mut self.cell_values] {
            v.clear();
        }
        self.fixed.clear();
        self.cell_fixed.clear();
    }

    fn bytes(&self) -> usize {
        [&self.event_id, &self.op, &self.key_json, &self.event_json, &self.row_text, &self.row_key,
         &self.cell_names, &self.cell_values].iter().map(|v| v.bytes()).sum::<usize>()
            + self.fixed.len() + self.cell_fixed.len()
    }
}

/// The value the changes write to `v` (`w-` and the id) and `n`.
fn new_values(i: u64, id: i64, v_new: &mut Vec<u8>) -> i32 {
    v_new.clear();
    v_new.extend_from_slice(b"w-");
    push_i64(v_new, id);
    (i % 2000) as i32 - 1000
}

/// The event id's input of change `i`, laid out as the engine's (`native/src/state/events.rs`, version 2): the key,
/// the change, the row's resulting state (its two cells with their timestamps), the after image.
fn id_input(i: u64, input: &mut Vec<u8>, v_new: &mut Vec<u8>) {
    let id = 2 * i as i64;
    let pk = id.to_be_bytes();
    let n_new = new_values(i, id, v_new);
    input.clear();
    push_bytes(input, &pk);
    input.push(1);
    push_bytes(input, b"");
    input.push(b'u');
    input.extend_from_slice(&TS.to_be_bytes());
    input.push(0);
    // the static row (no liveness, deletions, cells), no partition deletion
    input.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    // the row: no liveness or deletions, its cells by name
    input.extend_from_slice(&[1, 0, 0, 0]);
    input.extend_from_slice(&2u32.to_be_bytes());
    let cells = [(&b"n"[..], &n_new.to_be_bytes()[..]), (b"v", &v_new[..])];
    for (name, value) in cells {
        push_bytes(input, name);
        input.extend_from_slice(&TS.to_be_bytes());
        input.extend_from_slice(&0i32.to_be_bytes());
        input.extend_from_slice(&i64::from(i32::MAX).to_be_bytes());
        input.push(0);
        push_bytes(input, value);
    }
    input.extend_from_slice(&0u32.to_be_bytes());
    input.extend_from_slice(&i64::MIN.to_be_bytes());
    // the after image: no static columns, the row's two values
    input.extend_from_slice(&[1, 0, 0, 0, 0, 1]);
    input.extend_from_slice(&2u32.to_be_bytes());
    for (name, value) in cells {
        push_bytes(input, name);
        input.push(0);
        push_bytes(input, value);
    }
}

fn hex_of(digest: &[u8; 16]) -> [u8; 32] {
    let mut hex = [0u8; 32];
    for (k, x) in digest.iter().enumerate() {
        hex[2 * k] = HEX[(x >> 4) as usize];
        hex[2 * k + 1] = HEX[(x & 15) as usize];
    }
    hex
}

/// The outputs of changes `lo..hi` (change `i` updates row `id = 2 i`).
fn write_changes(lo: u64, hi: u64, out: &mut Outputs) {
    let (mut input, mut input2, mut scratch) = (Vec::with_capacity(512), Vec::with_capacity(512), Vec::new());
    // what every id's input starts with (the encoding's tag and the table id), hashed once, as the engine does
    let mut prefix = b"cassandra-cdc event id 2\n".to_vec();
    push_bytes(&mut prefix, b"5a1c3f00-0b4e-11ef-9f6a-6b1f7c1d2e99");
    let id_prefix = sha256::Prefixed::new(&prefix);
    let mut next_hex: Option<[u8; 32]> = None;
    let (mut v_old, mut v_new) = (Vec::with_capacity(24), Vec::with_capacity(24));
    for i in lo..hi {
        let id = 2 * i as i64;
        let pk = id.to_be_bytes();
        let n_old = (id % 1000) as i32;
        v_old.clear();
        v_old.extend_from_slice(b"v-");
        push_i64(&mut v_old, id);
        let n_new = new_values(i, id, &mut v_new);

        // the event id, hashed two at a time as the engine hashes them (`sha256::Prefixed::digest16_pair`)
        let hex = match next_hex.take() {
            Some(hex) => hex,
            None if i + 1 < hi => {
                id_input(i, &mut input, &mut scratch);
                id_input(i + 1, &mut input2, &mut scratch);
                let (a, b) = id_prefix.digest16_pair(&input, &input2);
                next_hex = Some(hex_of(&b));
                hex_of(&a)
            }
            None => {
                id_input(i, &mut input, &mut scratch);
                hex_of(&id_prefix.digest16(&input))
            }
        };
        out.event_id.push(&hex);
        out.op.push(b"u");

        let ej = &mut out.event_json.data;
        for (label, n, v) in [(&b"{\"before\":{\"id\":"[..], n_old, &v_old), (b",\"after\":{\"id\":", n_new, &v_new)] {
            ej.extend_from_slice(label);
            push_i64(ej, id);
            ej.extend_from_slice(b",\"n\":");
            push_i64(ej, n as i64);
            ej.extend_from_slice(b",\"v\":\"");
            ej.extend_from_slice(v);
            ej.extend_from_slice(b"\"}");
        }
        ej.extend_from_slice(b",\"source\":{\"connector\":\"cassandra-cdc\",\"cluster\":\"\",\"node\":\"\",\
            \"keyspace\":\"bench\",\"table\":\"kv\",\"segment\":\"CommitLog-7-1.log\",\"position\":");
        push_i64(ej, 67_590_164 + 64 * i as i64);
        ej.extend_from_slice(b",\"ts_us\":");
        push_i64(ej, TS);
        ej.extend_from_slice(b",\"expired\":false,\"snapshot\":false},\"op\":\"u\",\"ts_ms\":1763000015000,\"id\":\"");
        ej.extend_from_slice(&hex);
        ej.extend_from_slice(b"\",\"changed\":[\"v\",\"n\"]}");
        out.event_json.end();
        let kj = &mut out.key_json.data;
        kj.extend_from_slice(b"{\"id\":");
        push_i64(kj, id);
        kj.push(b'}');
        out.key_json.end();

        // the state row: typed id, n and v, the partition key, row kind, two cells, fixed-width metadata
        out.row_text.push(&v_new);
        out.row_text.push(b"row");
        out.row_key.push(&pk);
        out.row_key.push(b"");
        for (name, value) in [(&b"n"[..], &n_new.to_be_bytes()[..]), (b"v", &v_new[..])] {
            out.cell_names.push(name);
            out.cell_values.push(value);
            out.cell_fixed.extend_from_slice(&TS.to_le_bytes());
            out.cell_fixed.extend_from_slice(&0i32.to_le_bytes());
            out.cell_fixed.extend_from_slice(&i64::from(i32::MAX).to_le_bytes());
        }
        let fx = &mut out.fixed;
        fx.extend_from_slice(&TS.to_le_bytes()); // the event's ts_us
        fx.extend_from_slice(&(i as i32).to_le_bytes()); // its partition
        fx.extend_from_slice(&id.to_le_bytes());
        fx.extend_from_slice(&n_new.to_le_bytes());
        // liveness ts/ttl/ldt, deletion ts/ldt, shadowable ts/ldt (null: their slots are written all the same)
        fx.extend_from_slice(&[0u8; 8 * 6 + 4]);
        // the token (any 8 bytes: hashing the key is grouping work, which the floor leaves out), next expiry
        // (null), updated batch, oldest deletion, then the list offsets of cells, deletions and range tombstones
        fx.extend_from_slice(&id.wrapping_mul(0x9E37_79B9_7F4A_7C15u64 as i64).to_le_bytes());
        fx.extend_from_slice(&[0u8; 8]);
        fx.extend_from_slice(&1i64.to_le_bytes());
        fx.extend_from_slice(&i64::from(i32::MAX).to_le_bytes());
        fx.extend_from_slice(&[0u8; 12]);
    }
}

/// Seconds to write the outputs of `changes` changes on `threads` threads, each into `outs[t]` (cleared first).
fn timed(changes: u64, outs: &mut [Outputs]) -> f64 {
    let threads = outs.len() as u64;
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        for (t, out) in outs.iter_mut().enumerate() {
            let t = t as u64;
            scope.spawn(move || {
                out.clear();
                write_changes(t * changes / threads, (t + 1) * changes / threads, out);
            });
        }
    });
    t0.elapsed().as_secs_f64()
}

fn main() {
    let mut changes: u64 = 1_000_000;
    let mut threads: usize = 2;
    let mut rounds: usize = 3;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).and_then(|v| v.parse::<u64>().ok());
        match (pair[0].as_str(), value) {
            ("--changes", Some(v)) => changes = v,
            ("--threads", Some(v)) => threads = (v as usize).max(1),
            ("--rounds", Some(v)) => rounds = (v as usize).max(1),
            _ => {
                eprintln!("usage: state-floor [--changes N] [--threads N] [--rounds N]");
                std::process::exit(2);
            }
        }
    }
    let per = (changes as usize).div_ceil(threads);
    let (mut fresh, mut warm) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..rounds {
        // fresh: memory allocated for this round, first touched by the writes, as the engine's outputs are
        let mut outs: Vec<Outputs> = (0..threads).map(|_| Outputs::with_capacity(per)).collect();
        fresh.push(timed(changes, &mut outs));
        bytes = outs.iter().map(Outputs::bytes).sum();
        // warm: the same buffers again
        warm.push(timed(changes, &mut outs));
    }
    let list = |v: &[f64]| v.iter().map(|s| format!("{s:.4}")).collect::<Vec<_>>().join(", ");
    println!("{{\"changes\": {changes}, \"threads\": {threads}, \"bytes\": {bytes}, \"fresh_s\": [{}], \
              \"warm_s\": [{}]}}", list(&fresh), list(&warm));
}
