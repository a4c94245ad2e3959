//! What the engine knows of one CQL table: its columns (interned: a column is a `ColId`), their types and
//! roles, dropped columns, and the orders the outputs list columns in. Built once per table from
//! `state.native.table_desc` (Python), as `reconcile._TableInfo` is.

use std::collections::HashMap;

use super::types::Ty;
use crate::fxhash::FxMap;

pub type ColId = u32;


#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    PartitionKey,
    Clustering,
    Static,
    Regular,
    /// dropped and not re-added: old data still names it
    Dropped,
    /// named by data, unknown to the schema (a column dropped before the schema we were given)
    Unknown,
}

pub struct Column {
    pub name: String,
    /// the name as a JSON object key with its colon: written once here, not for every event
    pub json_key: String,
    pub ty: Option<Ty>,
    pub role: Role,
    /// in `table.columns` (current)
    pub current: bool,
    pub drop_time: Option<i64>,
    pub counter: bool,
    /// multi-cell (non-frozen collection or UDT), current or dropped
    pub complex: bool,
    /// a current (multi-cell) list: its image shows values in cell-path order, without the paths
    pub list: bool,
    pub reversed: bool,
}

pub struct Table {
    pub id_str: String,
    pub keyspace: String,
    pub name: String,
    /// `,"keyspace":...,"table":...` as an event's source gives them
    pub source_names_json: String,
    pub cols: Vec<Column>,
    by_name: FxMap<Vec<u8>, ColId>,
    pub pk: Vec<ColId>,
    pub ck: Vec<ColId>,
    /// `SELECT *` order: partition key, clustering, the others by name (JSON rows, typed state columns)
    pub value_cols: Vec<ColId>,
    /// current non-key columns in `table.columns` order (typed rows)
    pub typed_cols: Vec<ColId>,
    /// (column, 0 key / 1 static / 2 regular) in `table.columns` order (`changed`)
    pub change_plan: Vec<(ColId, u8)>,
    /// every column name is the name the data gives (valid UTF-8), as event ids hash it
    pub names_exact: bool,
    /// column ids follow their names' order: ids are given in name order, and stay so unless data names an
    /// unknown column that sorts before a known one (`in_name_order`)
    ids_by_name: bool,
    /// the columns `col` gave last, by name: names come in runs (a row's columns, row after row)
    recent: [(NameKey, ColId); 4],
}

/// A column name's first and last bytes as two words, and its length (read as `key::eq` reads keys). A name of at
/// most 16 bytes is all in them, so a name `col` saw a moment ago is found by comparing integers, without a hash
/// or a byte comparison; a longer one also needs its bytes compared (`exact`). A batch's cells name the same few
/// columns hundreds of thousands of times.
#[derive(Clone, Copy, PartialEq, Eq)]
struct NameKey {
    head: u64,
    tail: u64,
    len: usize,
}

impl NameKey {
    /// No name: `recent`'s free entries.
    const NONE: NameKey = NameKey { head: 0, tail: 0, len: usize::MAX };

    /// `name`'s words.
    #[inline]
    fn of(name: &[u8]) -> NameKey {
        let (n, p) = (name.len(), name.as_ptr());
        // SAFETY: every read is within name[..n] (unaligned reads of 8 or 4 bytes at 0 and at n - 8 or n - 4, or
        // the first, middle and last of 1 to 3 bytes)
        let (head, tail) = unsafe {
            match n {
                0 => (0, 0),
                1..=3 => (*p as u64 | (*p.add(n / 2) as u64) << 8 | (*p.add(n - 1) as u64) << 16, 0),
                4..=7 => (p.cast::<u32>().read_unaligned() as u64, p.add(n - 4).cast::<u32>().read_unaligned() as u64),
                _ => (p.cast::<u64>().read_unaligned(), p.add(n - 8).cast::<u64>().read_unaligned()),
            }
        };
        NameKey { head, tail, len: n }
    }

    /// Whether two names with this key are the same name: they hold every byte of one of up to 16 bytes.
    #[inline]
    fn exact(&self) -> bool {
        self.len <= 16
    }
}

pub struct ColumnDesc {
    pub name: String,
    pub role: Role,
    pub ty: Ty,
    pub reversed: bool,
}

impl Table {
    pub fn new(id_str: String, keyspace: String, name: String, columns: Vec<ColumnDesc>,
               dropped: Vec<(String, Ty, i64)>) -> Table {
        let source_names_json = format!(",\"keyspace\":{},\"table\":{}", json_of(&keyspace), json_of(&name));
        let mut t = Table { id_str, source_names_json, keyspace, name, cols: Vec::new(),
                            by_name: FxMap::default(), pk: Vec::new(), ck: Vec::new(), value_cols: Vec::new(),
                            typed_cols: Vec::new(), change_plan: Vec::new(),
                            names_exact: true, ids_by_name: true, recent: [(NameKey::NONE, 0); 4] };
        let drop_times: HashMap<String, i64> = dropped.iter().map(|(n, _, t)| (n.clone(), *t)).collect();
        // ids in name order, schema and dropped columns alike: a row's cells, kept by id, are then in the order
        // the event ids and state rows list them (by name) without sorting
        let mut names: Vec<String> = columns.iter().map(|c| c.name.clone()).chain(dropped.iter().map(|d| d.0.clone()))
            .collect();
        names.sort_unstable();
        names.dedup();
        let id_of = |name: &str| {
            names.binary_search_by(|n| n.as_str().cmp(name)).expect("every name is listed") as ColId
        };
        let mut cols: Vec<Option<Column>> = (0..names.len()).map(|_| None).collect();
        for c in columns {
            let id = id_of(&c.name);
            let is_key = matches!(c.role, Role::PartitionKey | Role::Clustering);
            match c.role {
                Role::PartitionKey => t.pk.push(id),
                Role::Clustering => t.ck.push(id),
                _ => {}
            }
            if !is_key {
                t.typed_cols.push(id);
            }
            t.change_plan.push((id, if is_key { 0 } else if c.role == Role::Static { 1 } else { 2 }));
            let counter = c.ty == Ty::Counter;
            let complex = c.ty.is_multicell();
            let list = matches!(c.ty, Ty::List(..)) && complex;
            t.by_name.insert(c.name.as_bytes().to_vec(), id);
            let json_key = json_key_of(&c.name);
            cols[id as usize] = Some(Column { drop_time: drop_times.get(&c.name).copied(), name: c.name,
                                              json_key, ty: Some(c.ty), role: c.role, current: true, counter,
                                              complex, list, reversed: c.reversed });
        }
        for (name, ty, time) in dropped {
            if t.by_name.contains_key(name.as_bytes()) {
                continue; // re-added: the current column, with its drop time (above); or named twice: the first
            }
            let id = id_of(&name);
            t.by_name.insert(name.as_bytes().to_vec(), id);
            let json_key = json_key_of(&name);
            cols[id as usize] = Some(Column { name, json_key, counter: ty == Ty::Counter,
                                              complex: ty.is_multicell(), ty: Some(ty), role: Role::Dropped,
                                              current: false, drop_time: Some(time), list: false, reversed: false });
        }
        t.cols = cols.into_iter().map(|c| c.expect("every name has its column")).collect();
        let mut rest: Vec<ColId> = t.typed_cols.clone();
        rest.sort_by(|a, b| t.cols[*a as usize].name.cmp(&t.cols[*b as usize].name));
        t.value_cols = t.pk.iter().chain(&t.ck).chain(&rest).copied().collect();
        t
    }

    /// The id of a column name (a new `Unknown` column for names the schema does not have). Inlined where it is
    /// called, once per record: the names of the last few lookups answer nearly all (`recent`); the map, out of
    /// line, the others.
    #[inline(always)]
    pub fn col(&mut self, name: &[u8]) -> ColId {
        let key = NameKey::of(name);
        if let Some(&(_, id)) = self.recent.iter().find(|r| r.0 == key) {
            // a longer name with the same ends and length may differ in the middle (or, not UTF-8, differ from
            // the column's name; then the map, below, answers each time)
            if key.exact() || self.cols[id as usize].name.as_bytes() == name {
                return id;
            }
        }
        self.col_by_map(name, key)
    }

    /// `col` of a name not among the recent ones.
    #[inline(never)]
    fn col_by_map(&mut self, name: &[u8], key: NameKey) -> ColId {
        let id = match self.by_name.get(name) {
            Some(&id) => id,
            None => self.unknown(name),
        };
        self.recent.rotate_right(1);
        self.recent[0] = (key, id);
        id
    }

    /// A new `Unknown` column named `name`.
    fn unknown(&mut self, name: &[u8]) -> ColId {
        let id = self.cols.len() as ColId;
        let name_s = String::from_utf8_lossy(name).into_owned();
        if self.cols.last().is_some_and(|last| last.name > name_s) {
            self.ids_by_name = false;
        }
        let json_key = json_key_of(&name_s);
        if name_s.as_bytes() != name {
            self.names_exact = false;
        }
        self.by_name.insert(name.to_vec(), id);
        self.cols.push(Column { name: name_s, json_key, ty: None, role: Role::Unknown, current: false,
                                drop_time: None, counter: false, complex: false, list: false, reversed: false });
        id
    }

    /// The id of a column name already known (see `col`).
    pub fn lookup(&self, name: &[u8]) -> Option<ColId> {
        self.by_name.get(name).copied()
    }

    #[inline]
    pub fn c(&self, id: ColId) -> &Column {
        &self.cols[id as usize]
    }

    pub fn name_of(&self, id: ColId) -> &str {
        &self.cols[id as usize].name
    }

    /// `items`, sorted by column id, in column-name order (sorted again only when ids do not follow names).
    #[inline(always)]
    pub fn in_name_order<'x, T>(&self, items: &'x [(ColId, T)]) -> NameOrder<'x, T> {
        if self.ids_by_name || items.len() < 2 {
            return NameOrder::AsTheyAre(items.iter());
        }
        self.sorted_by_name(items)
    }

    /// `in_name_order` when the ids do not follow the names (columns the schema did not know when the ids were
    /// given), out of line: the hot callers inline only the test above.
    #[inline(never)]
    fn sorted_by_name<'x, T>(&self, items: &'x [(ColId, T)]) -> NameOrder<'x, T> {
        let mut v: Vec<&(ColId, T)> = items.iter().collect();
        v.sort_by(|a, b| self.name_of(a.0).cmp(self.name_of(b.0)));
        NameOrder::Sorted(v.into_iter())
    }

    /// A column's name as a JSON string (its `json_key` without the colon).
    pub fn json_name(&self, id: ColId) -> &str {
        let k = &self.cols[id as usize].json_key;
        &k[..k.len() - 1]
    }
}

fn json_of(s: &str) -> String {
    let mut out = String::new();
    crate::state::text::json_str(&mut out, s);
    out
}

fn json_key_of(s: &str) -> String {
    json_of(s) + ":"
}

/// `Table::in_name_order`'s items.
pub enum NameOrder<'x, T> {
    AsTheyAre(std::slice::Iter<'x, (ColId, T)>),
    Sorted(std::vec::IntoIter<&'x (ColId, T)>),
}

impl<'x, T> Iterator for NameOrder<'x, T> {
    type Item = &'x (ColId, T);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            NameOrder::AsTheyAre(i) => i.next(),
            NameOrder::Sorted(i) => i.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_keys_are_equal_exactly_when_their_bytes_are() {
        let data: Vec<u8> = (0..40u8).map(|i| b'a' + i % 3).collect();
        for n in 0..=16 {
            let a = &data[..n];
            let mut b = a.to_vec();
            assert!(NameKey::of(a) == NameKey::of(&b) && NameKey::of(a).exact(), "{n}");
            for i in 0..n {
                b[i] ^= 1;
                assert!(NameKey::of(a) != NameKey::of(&b), "{n} {i}");
                b[i] ^= 1;
            }
            // one byte more or less, the same first and last bytes
            assert!(NameKey::of(a) != NameKey::of(&data[..n + 1]), "{n}");
            let same_ends = [&a[..n.min(1)], a, &a[n.saturating_sub(1)..]].concat();
            assert!(NameKey::of(a) != NameKey::of(&same_ends) || n == 0, "{n}");
            assert!(NameKey::of(a) != NameKey::NONE);
        }
        assert!(!NameKey::of(&data[..17]).exact());
    }

    #[test]
    fn col_gives_each_name_one_id_however_names_alternate() {
        // the long names share their first 8 and last 8 bytes and their length: only the middle tells them apart
        let cols = ["a", "bb", "ccc", "dddd", "eeeee", "long_column_name_over_16", "long_colXmn_name_over_16"]
            .map(|n| ColumnDesc { name: n.into(), role: Role::Regular, ty: Ty::Int(4), reversed: false });
        let mut t = Table::new("id".into(), "ks".into(), "t".into(), cols.into(), Vec::new());
        let names: Vec<&[u8]> = vec![b"a", b"bb", b"ccc", b"dddd", b"eeeee", b"long_column_name_over_16", b"zz",
                                     b"long_colXmn_name_over_16", b"aa", b"long_colYmn_name_over_16"];
        let first: Vec<ColId> = names.iter().map(|n| t.col(n)).collect();
        for round in 0..50usize {
            for (k, n) in names.iter().enumerate().cycle().skip(round % 7).take(names.len() * 3) {
                assert_eq!(t.col(n), first[k], "{}", String::from_utf8_lossy(n));
                assert_eq!(t.lookup(n), Some(first[k]));
            }
        }
        assert_eq!(t.name_of(first[6]), "zz");
        assert_eq!(t.c(first[0]).name, "a");
        assert_eq!(t.name_of(first[7]), "long_colXmn_name_over_16");
        assert_eq!(t.name_of(first[9]), "long_colYmn_name_over_16");
        assert_eq!(first.iter().collect::<std::collections::HashSet<_>>().len(), names.len());
    }
}
