//! What the engine knows of one CQL table: its columns (interned: a column is a `ColId`), their types and
//! roles, dropped columns, and the orders the outputs list columns in. Built once per table from
//! `state.native.table_desc` (Python), as `reconcile._TableInfo` is.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::types::Ty;

pub type ColId = u32;

/// FxHash (rustc's multiply-rotate hash) with a finalizer: several times faster than SipHash on the short keys
/// here. The keys come from the batch itself, so there is no adversary to defend against.
#[derive(Default)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap()));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    /// Mixed down (murmur3's fmix64): a product's low bits depend only on the input's low bits, and big-endian
    /// keys differ in their high bytes, which would put them all in a few buckets.
    #[inline]
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

impl FxHasher {
    #[inline]
    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

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
    pub cols: Vec<Column>,
    by_name: FastMap<Vec<u8>, ColId>,
    pub pk: Vec<ColId>,
    pub ck: Vec<ColId>,
    /// `SELECT *` order: partition key, clustering, the others by name (JSON rows, typed state columns)
    pub value_cols: Vec<ColId>,
    /// current non-key columns in `table.columns` order (typed rows)
    pub typed_cols: Vec<ColId>,
    /// (column, 0 key / 1 static / 2 regular) in `table.columns` order (`changed`)
    pub change_plan: Vec<(ColId, u8)>,
    /// every column name and the table id are printable ASCII, so event ids (hashes of Python reprs) can be
    /// computed here (see `text::repr_ascii_str`)
    pub repr_ok: bool,
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
        let mut t = Table { id_str, keyspace, name, cols: Vec::new(), by_name: FastMap::default(), pk: Vec::new(),
                            ck: Vec::new(), value_cols: Vec::new(), typed_cols: Vec::new(), change_plan: Vec::new(),
                            repr_ok: true };
        let drop_times: HashMap<String, i64> = dropped.iter().map(|(n, _, t)| (n.clone(), *t)).collect();
        for c in columns {
            let id = t.cols.len() as ColId;
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
            t.cols.push(Column { drop_time: drop_times.get(&c.name).copied(), name: c.name, ty: Some(c.ty), role: c.role,
                                 current: true, counter, complex, list, reversed: c.reversed });
        }
        for (name, ty, time) in dropped {
            if t.by_name.contains_key(name.as_bytes()) {
                continue; // re-added: the current column, with its drop time (above)
            }
            let id = t.cols.len() as ColId;
            t.by_name.insert(name.as_bytes().to_vec(), id);
            t.cols.push(Column { name, counter: ty == Ty::Counter, complex: ty.is_multicell(), ty: Some(ty),
                                 role: Role::Dropped, current: false, drop_time: Some(time), list: false,
                                 reversed: false });
        }
        let mut rest: Vec<ColId> = t.typed_cols.clone();
        rest.sort_by(|a, b| t.cols[*a as usize].name.cmp(&t.cols[*b as usize].name));
        t.value_cols = t.pk.iter().chain(&t.ck).chain(&rest).copied().collect();
        t.repr_ok = crate::state::text::repr_ascii_str(&mut String::new(), &t.id_str).is_some()
            && t.cols.iter().all(|c| crate::state::text::repr_ascii_str(&mut String::new(), &c.name).is_some());
        t
    }

    /// The id of a column name (a new `Unknown` column for names the schema does not have).
    pub fn col(&mut self, name: &[u8]) -> ColId {
        if let Some(id) = self.by_name.get(name) {
            return *id;
        }
        let id = self.cols.len() as ColId;
        let name_s = String::from_utf8_lossy(name).into_owned();
        if crate::state::text::repr_ascii_str(&mut String::new(), &name_s).is_none() || name_s.as_bytes() != name {
            self.repr_ok = false;
        }
        self.by_name.insert(name.to_vec(), id);
        self.cols.push(Column { name: name_s, ty: None, role: Role::Unknown, current: false, drop_time: None,
                                counter: false, complex: false, list: false, reversed: false });
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
}
