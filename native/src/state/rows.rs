//! A partition's clustering rows by key (the bytes' order, as `reconcile.PartitionState.rows` iterates them
//! sorted), kept so that a thread processing partition after partition allocates nothing for them once warm.
//!
//! Most partitions of a batch hold a few rows: a sorted list, searched by bisection, whose entries after the live
//! ones are spares that keep their cell buffers for the next rows (a partition's state is cleared, not dropped, and
//! the next one's rows reuse them). A partition that grows past `SMALL_MAX` rows moves to a B-tree: inserting into
//! the middle of a long list moves half of it.

use std::collections::btree_map;
use std::collections::BTreeMap;

use super::engine::RowState;
use super::key::{Ck, KeyRef};

/// The most rows kept as a sorted list.
const SMALL_MAX: usize = 32;

#[derive(Default, Debug)]
pub struct Rows<'a> {
    /// `small[..live]`: the rows, sorted by key; `small[live..]`: spare entries
    small: Vec<(Ck<'a>, RowState<'a>)>,
    live: usize,
    /// the rows of a partition of more than `SMALL_MAX` of them (`small` is then empty of live rows)
    big: Option<BTreeMap<Ck<'a>, RowState<'a>>>,
}

impl<'a> Rows<'a> {
    #[inline]
    pub fn len(&self) -> usize {
        match &self.big {
            Some(b) => b.len(),
            None => self.live,
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `ck`'s place in the list, or where it goes: most partitions hold one row, compared without a search.
    #[inline(always)]
    fn find(&self, ck: &[u8]) -> Result<usize, usize> {
        if self.live == 1 {
            return match self.small[0].0.cmp(&Ck(ck)) {
                std::cmp::Ordering::Equal => Ok(0),
                std::cmp::Ordering::Less => Err(1),
                std::cmp::Ordering::Greater => Err(0),
            };
        }
        self.small[..self.live].binary_search_by(|e| e.0.cmp(&Ck(ck)))
    }

    #[inline]
    pub fn get(&self, ck: &[u8]) -> Option<&RowState<'a>> {
        match &self.big {
            Some(b) => b.get(KeyRef::new(ck)),
            None => self.find(ck).ok().map(|i| &self.small[i].1),
        }
    }

    /// The row `ck`, created empty when missing.
    #[inline]
    pub fn entry(&mut self, ck: Ck<'a>) -> &mut RowState<'a> {
        if self.big.is_none() {
            match self.find(&ck) {
                Ok(i) => return &mut self.small[i].1,
                Err(i) => return self.insert(i, ck),
            }
        }
        self.big.as_mut().expect("a B-tree").entry(ck).or_default()
    }

    /// A new empty row `ck` at place `i` of the list (in the B-tree, past `SMALL_MAX` rows): `entry`'s less
    /// common path, out of line.
    #[inline(never)]
    fn insert(&mut self, i: usize, ck: Ck<'a>) -> &mut RowState<'a> {
        if self.live < SMALL_MAX {
            if self.live == self.small.len() {
                self.small.push((ck, RowState::default()));
            } else {
                let spare = &mut self.small[self.live];
                spare.0 = ck;
                spare.1.reset();
            }
            // the new entry (the first spare) to its place
            self.small[i..=self.live].rotate_right(1);
            self.live += 1;
            return &mut self.small[i].1;
        }
        self.grow();
        self.big.as_mut().expect("grown").entry(ck).or_default()
    }

    /// From the list to the B-tree (the list's spares are dropped with it).
    fn grow(&mut self) {
        let mut small = std::mem::take(&mut self.small);
        small.truncate(self.live);
        self.big = Some(small.into_iter().collect());
        self.live = 0;
    }

    /// Remove row `ck` (if present).
    pub fn remove(&mut self, ck: &[u8]) {
        match &mut self.big {
            Some(b) => {
                b.remove(KeyRef::new(ck));
            }
            None => {
                if let Ok(i) = self.find(ck) {
                    // the removed entry becomes the first spare
                    self.small[i..self.live].rotate_left(1);
                    self.live -= 1;
                }
            }
        }
    }

    /// Keep the rows for which `keep` is true (given each row, in key order, to change it in place).
    pub fn retain(&mut self, mut keep: impl FnMut(Ck<'a>, &mut RowState<'a>) -> bool) {
        match &mut self.big {
            Some(b) => b.retain(|k, r| keep(*k, r)),
            None => {
                let mut w = 0;
                for i in 0..self.live {
                    let e = &mut self.small[i];
                    if keep(e.0, &mut e.1) {
                        self.small.swap(i, w);
                        w += 1;
                    }
                }
                self.live = w;
            }
        }
    }

    pub fn iter(&self) -> Iter<'_, 'a> {
        match &self.big {
            Some(b) => Iter::Big(b.iter()),
            None => Iter::Small(self.small[..self.live].iter()),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = Ck<'a>> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &RowState<'a>> + '_ {
        self.iter().map(|(_, r)| r)
    }

    /// No rows (the list's entries kept as spares).
    pub fn clear(&mut self) {
        self.big = None;
        self.live = 0;
    }
}

impl PartialEq for Rows<'_> {
    fn eq(&self, o: &Self) -> bool {
        self.len() == o.len() && self.iter().zip(o.iter()).all(|(a, b)| a.0 == b.0 && a.1 == b.1)
    }
}

/// The rows in key order: (key, row).
pub enum Iter<'r, 'a> {
    Small(std::slice::Iter<'r, (Ck<'a>, RowState<'a>)>),
    Big(btree_map::Iter<'r, Ck<'a>, RowState<'a>>),
}

impl<'r, 'a> Iterator for Iter<'r, 'a> {
    type Item = (Ck<'a>, &'r RowState<'a>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Small(i) => i.next().map(|(k, r)| (*k, r)),
            Iter::Big(i) => i.next().map(|(k, r)| (*k, r)),
        }
    }
}
