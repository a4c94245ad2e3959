//! The segment container, as `cdc_lib.commitlog.segment.SegmentReader` reads it: sync markers and their CRCs,
//! sections, entry framing and both entry CRCs, damage records with the reference's kinds, positions and
//! reasons, torn tails, and `start`/`stop`.
//!
//! The walk is resumable: `Segment::run` goes on until it needs Python (a damage record to report, a compressed
//! or encrypted section to decompress/decrypt, an entry the native decoder leaves to the reference, a table it
//! has not been told about) or a batch is full, and returns that as an `Event`. Every reason text below is the
//! reference's, word for word: the differential tests compare them.

use crate::columns::Columns;
use crate::decode::{decode_entry, EntryCtx, Fail, Scratch, Tables, MODE_PYTHON, MODE_SKIP, MODE_SYSTEM_UNKNOWN,
                    MODE_UNKNOWN};

const SYNC_MARKER_SIZE: usize = 8;
const ENTRY_OVERHEAD: i64 = 12;
const MIN_ENTRY_SIZE: i64 = 10;

#[inline]
fn be_i32(b: &[u8], p: usize) -> i32 {
    i32::from_be_bytes([b[p], b[p + 1], b[p + 2], b[p + 3]])
}

#[inline]
fn be_u32(b: &[u8], p: usize) -> u32 {
    u32::from_be_bytes([b[p], b[p + 1], b[p + 2], b[p + 3]])
}

/// Which buffer a byte range refers to: the segment file, or the current decompressed/decrypted section.
#[derive(Clone, Copy, Debug)]
pub enum Src {
    File,
    Section,
}

/// A byte range of one of the buffers.
pub type Range = (Src, usize, usize);

#[derive(Debug)]
pub enum Event {
    End,
    Batch,
    Damage { kind: &'static str, position: i64, reason: String, data: Range, physical: Option<i64> },
    /// An entry for Python (`EntryHandler.handle`): system tables, unknown tables, pre-3.0 entries, and every
    /// entry the native decoder declined (`native_failed`).
    Entry { start: i64, position: i64, data: Range, native_failed: bool },
    NeedTable([u8; 16]),
    /// A compressed/encrypted section: Python calls `feed_section` with its bytes, or `skip_section`. `cut`: the
    /// file ends inside it (the reason of the torn tail).
    Section { pos: i64, nxt: i64, ulen: i64, section_logical: i64, cut: Option<String> },
}

/// The section being read goes on past the end of the file: what follows its last whole entry is a torn tail.
struct Cut {
    reason: String,
    /// Compressed/encrypted: the damage keeps the section's file bytes (file offset, end), not the entries'.
    raw: Option<(usize, usize)>,
}

#[derive(Clone, Copy)]
struct Sec {
    src: Src,
    p: usize,
    end: usize,
    shift: i64, // logical offset - buffer offset
    nxt: usize,
    next_logical: i64,
}

enum Phase {
    Markers,
    Section(Sec),
    Await { pos: usize, nxt: usize, ulen: i64, section_logical: i64, cut: bool },
    Ended,
}

#[derive(Default, Clone, Copy)]
pub struct Counts {
    pub entries: u64,
    pub system_entries: u64,
}

pub struct Segment {
    pub name: Vec<u8>,
    pub seg_id: i64,
    pub mv: Option<u32>,
    pub packed: bool,
    pub start: Option<i64>,
    pub stop: Option<i64>,
    file_len: usize,
    id_crc: crc32fast::Hasher,
    pos: usize,
    logical: i64,
    phase: Phase,
    cut: Option<Cut>,
    pub entry_index: i64,
}

impl Segment {
    #[allow(clippy::too_many_arguments)]
    pub fn new(name: Vec<u8>, seg_id: i64, version: i32, header_size: usize, packed: bool, start: Option<i64>,
               stop: Option<i64>, file_len: usize) -> Segment {
        let mv = match version {
            6 => Some(11),
            7 => Some(12),
            8 => Some(13),
            _ => None,
        };
        let mut id_crc = crc32fast::Hasher::new();
        id_crc.update(&(seg_id as u64 as u32).to_be_bytes());
        id_crc.update(&(((seg_id as u64) >> 32) as u32).to_be_bytes());
        Segment { name, seg_id, mv, packed, start, stop, file_len, id_crc, pos: header_size,
                  logical: header_size as i64, phase: Phase::Markers, cut: None, entry_index: 0 }
    }

    fn marker_crc(&self, pos: usize) -> u32 {
        let mut h = self.id_crc.clone();
        h.update(&(pos as u32).to_be_bytes());
        h.finalize()
    }

    pub fn awaiting(&self) -> bool {
        matches!(self.phase, Phase::Await { .. })
    }

    /// The decompressed/decrypted bytes of the awaited section have been provided (`len` bytes); for a cut
    /// section, with the reason of its torn tail.
    pub fn feed_section(&mut self, len: usize, cut_reason: Option<String>) {
        if let Phase::Await { pos, nxt, ulen, section_logical, cut } = self.phase {
            self.cut = if cut {
                Some(Cut { reason: cut_reason.unwrap_or_default(), raw: Some((pos, self.file_len)) })
            } else {
                None
            };
            self.phase = Phase::Section(Sec { src: Src::Section, p: 0, end: len, shift: section_logical, nxt,
                                              next_logical: section_logical + ulen });
        }
    }

    /// The awaited section could not be read (Python reported the damage): go on with the next one.
    pub fn skip_section(&mut self) {
        if let Phase::Await { nxt, ulen, section_logical, .. } = self.phase {
            self.pos = nxt;
            self.logical = section_logical + ulen;
            self.phase = Phase::Markers;
        }
    }

    /// After a section: the next marker, or the end when the section was cut by the end of the file.
    fn end_section(&mut self, s: &Sec) {
        if self.cut.is_some() {
            self.phase = Phase::Ended;
            return;
        }
        self.pos = s.nxt;
        self.logical = s.next_logical;
        self.phase = Phase::Markers;
    }

    #[allow(clippy::too_many_arguments)]
    pub fn run(&mut self, file: &[u8], section: &[u8], tables: &mut Tables, cols: &mut Columns,
               sc: &mut Scratch, batch_rows: i64, counts: &mut Counts) -> Event {
        loop {
            match self.phase {
                Phase::Ended | Phase::Await { .. } => return Event::End, // Await: Python feeds or skips first
                Phase::Markers => {
                    if let Some(ev) = self.marker(file) {
                        return ev;
                    }
                }
                Phase::Section(mut s) => {
                    let buf = match s.src {
                        Src::File => file,
                        Src::Section => section,
                    };
                    let ev = self.entries(buf, &mut s, tables, cols, sc, batch_rows, counts);
                    if let Phase::Section(_) = self.phase {
                        self.phase = Phase::Section(s);
                    }
                    if let Some(ev) = ev {
                        return ev;
                    }
                }
            }
        }
    }

    fn damage(&mut self, kind: &'static str, position: i64, reason: String, data: Range, physical: usize) -> Event {
        Event::Damage { kind, position, reason, data, physical: Some(physical as i64) }
    }

    /// One step of `SegmentReader._read` at a sync marker; `None` means "go on".
    fn marker(&mut self, file: &[u8]) -> Option<Event> {
        let n = file.len();
        let pos = self.pos;
        let logical = self.logical;
        if pos + SYNC_MARKER_SIZE > n {
            self.phase = Phase::Ended;
            if pos < n && file[pos..n].iter().any(|&b| b != 0) {
                // fewer than 8 bytes left and not all zero: the file was cut inside a sync marker
                return Some(self.damage("torn_tail", logical,
                                        format!("the file ends inside the sync marker at file offset {pos} ({} of \
                                                 its 8 bytes)", n - pos),
                                        (Src::File, pos, n), pos));
            }
            return Some(Event::End);
        }
        let nxt = be_i32(file, pos) as i64;
        let crc = be_u32(file, pos + 4);
        if crc != self.marker_crc(pos) {
            self.phase = Phase::Ended;
            if nxt == 0 && crc == 0 {
                return Some(Event::End); // zeroed marker: clean end
            }
            return Some(self.damage("bad_marker", logical, format!("sync marker CRC mismatch at file offset {pos}"),
                                    (Src::File, pos, n), pos));
        }
        if let Some(stop) = self.stop {
            if logical >= stop {
                self.phase = Phase::Ended;
                return Some(Event::End);
            }
        }
        if nxt < (pos + SYNC_MARKER_SIZE) as i64 {
            self.phase = Phase::Ended;
            return Some(self.damage("bad_marker", logical, format!("sync marker at {pos} points back to {nxt}"),
                                    (Src::File, pos, n), pos));
        }
        let cut = if nxt > n as i64 {
            Some(format!("the section at file offset {pos} ends at {nxt}, past the end of the file ({n} bytes): {} \
                          bytes are missing", nxt - n as i64))
        } else {
            None
        };
        let nxt = nxt as usize;
        if !self.packed {
            let begin = pos + SYNC_MARKER_SIZE;
            self.cut = cut.map(|reason| Cut { reason, raw: None });
            self.phase = Phase::Section(Sec { src: Src::File, p: begin, end: nxt.min(n), shift: 0, nxt,
                                              next_logical: nxt as i64 });
            return None;
        }
        // compressed / encrypted: i32 uncompressed length, then the payload
        if nxt < pos + 12 || n < pos + 12 {
            self.phase = Phase::Ended;
            return Some(match cut {
                Some(r) => self.damage("torn_tail", logical + SYNC_MARKER_SIZE as i64,
                                       format!("the file ends inside the section header; {r}"), (Src::File, pos, n),
                                       pos),
                None => self.damage("bad_marker", logical, format!("section at {pos} too short for its length field"),
                                    (Src::File, pos, nxt), pos),
            });
        }
        let ulen = be_i32(file, pos + 8) as i64;
        let section_logical = logical + SYNC_MARKER_SIZE as i64;
        if ulen < 0 {
            self.phase = Phase::Ended;
            return Some(self.damage("bad_entry", section_logical,
                                    format!("negative section length {ulen} at {pos}: the positions of the rest of \
                                             the segment are unknown; rest of the file kept"),
                                    (Src::File, pos, n), pos));
        }
        if let Some(start) = self.start {
            if section_logical + ulen <= start {
                if cut.is_some() {
                    self.phase = Phase::Ended;
                    return Some(Event::End);
                }
                self.pos = nxt; // whole section already processed
                self.logical = section_logical + ulen;
                return None;
            }
        }
        self.phase = Phase::Await { pos, nxt, ulen, section_logical, cut: cut.is_some() };
        Some(Event::Section { pos: pos as i64, nxt: nxt as i64, ulen, section_logical, cut })
    }

    /// The torn-tail damage of a cut section at buffer offset `p`; the segment ends.
    fn torn(&mut self, s: &Sec, p: usize, what: String) -> Event {
        self.phase = Phase::Ended;
        let cut = self.cut.as_ref().expect("torn() is only called for a cut section");
        let reason = format!("{what}: {}", cut.reason);
        let (data, physical) = match cut.raw {
            None => ((s.src, p, s.end), None),
            Some((a, b)) => ((Src::File, a, b), Some(a as i64)),
        };
        Event::Damage { kind: "torn_tail", position: p as i64 + s.shift, reason, data, physical }
    }

    /// Damage that ends the section (not the segment): reading resumes at the next marker.
    fn section_damage(&mut self, s: &Sec, p: usize, reason: String, data: Range) -> Event {
        self.end_section(s);
        Event::Damage { kind: "bad_entry", position: p as i64 + s.shift, reason, data, physical: None }
    }

    /// `SegmentReader._entries` over one section, resumable; `None` when the section is done.
    #[allow(clippy::too_many_arguments)]
    fn entries(&mut self, buf: &[u8], s: &mut Sec, tables: &mut Tables, cols: &mut Columns,
               sc: &mut Scratch, batch_rows: i64, counts: &mut Counts) -> Option<Event> {
        let end = s.end;
        let shift = s.shift;
        let cut = self.cut.is_some();
        while s.p < end {
            let p = s.p;
            let at = p as i64 + shift;
            if let Some(stop) = self.stop {
                if at >= stop {
                    self.phase = Phase::Ended; // the rest is past the synced offset: not ours to read
                    return Some(Event::End);
                }
            }
            if end - p < 4 {
                return Some(if cut {
                    self.torn(s, p, format!("the entry at {at} is cut after {} bytes", end - p))
                } else {
                    self.section_damage(s, p, format!("{} stray bytes at the end of a section", end - p),
                                        (s.src, p, end))
                });
            }
            let size = be_i32(buf, p) as i64;
            if size == 0 {
                if cut {
                    return Some(self.torn(s, p, format!("zero bytes where the entry at {at} should be")));
                }
                self.phase = Phase::Ended; // legacy end-of-segment marker (and unwritten space)
                return Some(Event::End);
            }
            if end - p < 8 {
                return Some(if cut {
                    self.torn(s, p, format!("the entry at {at} is cut after {} bytes", end - p))
                } else {
                    self.section_damage(s, p, "entry header cut by the end of the section".to_string(),
                                        (s.src, p, end))
                });
            }
            let size_crc = be_u32(buf, p + 4);
            let mut h = crc32fast::Hasher::new();
            h.update(&(size as u32).to_be_bytes());
            let c1 = h.clone().finalize();
            if size_crc != c1 || size < MIN_ENTRY_SIZE {
                let why = if size_crc != c1 {
                    format!("entry size CRC mismatch (size field {size})")
                } else {
                    format!("entry size {size} is below the minimum of {MIN_ENTRY_SIZE}")
                };
                return Some(self.section_damage(s, p, why + "; rest of the section kept", (s.src, p, end)));
            }
            let entry_end = p as i64 + ENTRY_OVERHEAD + size;
            let position = entry_end + shift;
            if let Some(stop) = self.stop {
                if position > stop {
                    self.phase = Phase::Ended;
                    return Some(Event::End);
                }
            }
            if entry_end > end as i64 {
                return Some(if cut {
                    self.torn(s, p, format!("the entry of {size} bytes at {at} is cut after {} bytes", end - p - 8))
                } else {
                    self.section_damage(s, p, format!("entry of {size} bytes runs past the end of its section"),
                                        (s.src, p, end))
                });
            }
            let entry_end = entry_end as usize;
            let data = &buf[p + 8..p + 8 + size as usize];
            let stored = be_u32(buf, entry_end - 4);
            h.update(data);
            if h.finalize() != stored {
                s.p = entry_end;
                return Some(Event::Damage {
                    kind: "crc_mismatch",
                    position: at,
                    reason: format!("mutation CRC mismatch in entry of {size} bytes"),
                    data: (s.src, p, entry_end),
                    physical: None,
                });
            }
            if let Some(start) = self.start {
                if position <= start {
                    s.p = entry_end;
                    continue;
                }
            }
            // ---- one entry: decode natively, or hand it to Python
            let drange = (s.src, p + 8, p + 8 + size as usize);
            let to_python = |s: &mut Sec, failed: bool| {
                s.p = entry_end;
                Some(Event::Entry { start: at, position, data: drange, native_failed: failed })
            };
            let mv = match self.mv {
                Some(mv) => mv,
                None => return to_python(s, false),
            };
            let q = if data[0] < 0x80 { 1 } else { 1 + data[0].leading_ones() as usize };
            if data.len() < q + 16 {
                return to_python(s, false);
            }
            let tid: [u8; 16] = data[q..q + 16].try_into().unwrap();
            match tables.get(&tid).map(|t| t.mode) {
                None => return Some(Event::NeedTable(tid)), // s.p unchanged: the entry is retried
                Some(MODE_SKIP) | Some(MODE_SYSTEM_UNKNOWN) => {
                    counts.entries += 1;
                    counts.system_entries += 1;
                    s.p = entry_end;
                    continue;
                }
                Some(MODE_PYTHON) | Some(MODE_UNKNOWN) => return to_python(s, false),
                Some(_) => {}
            }
            let mark = cols.mark();
            let ctx = EntryCtx { segment: &self.name, segment_id: self.seg_id, position, entry_index: self.entry_index,
                                 mv };
            match decode_entry(data, &ctx, tables, cols, sc) {
                Ok(nu) => {
                    counts.entries += 1;
                    self.entry_index += nu as i64;
                    s.p = entry_end;
                    if cols.rows as i64 >= batch_rows {
                        return Some(Event::Batch);
                    }
                }
                Err(Fail::NeedTable(t)) => {
                    cols.truncate(mark);
                    return Some(Event::NeedTable(t));
                }
                Err(Fail::Bad) => {
                    cols.truncate(mark);
                    return to_python(s, true);
                }
            }
        }
        if cut {
            let p = s.p;
            return Some(self.torn(s, p, format!("the entries from {} on are missing", p as i64 + shift)));
        }
        self.end_section(s);
        None
    }
}
