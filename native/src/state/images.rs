//! What a partition's rows show at a moment (`events._row_image`, `partition_images`): the visible CQL rows and
//! their values, as events and state rows render them.
//!
//! A partition's images are computed two or three times per change (before it, after it, and for the state rows),
//! so they live in an `ImageSet` that a thread reuses from one partition to the next: the values of every image
//! in one list, each image a span of it, the values themselves borrowed from the batch's Arrow input as the
//! state's are. Computing a set allocates nothing once its lists have grown to a partition's size.

use std::borrow::Cow;
use std::cmp::Ordering;

use super::engine::{shard_rank, Lv, PartitionState, RowState, EXPIRED_LIVENESS_TTL, NO_TIMESTAMP};
use super::key::{self, Ck};
use super::table::{ColId, Table};
use super::types::{self, Doubt, Ty, D};

/// A column's value in an image: value bytes, a counter's total, or a complex column's live (path, value) items
/// (`ImageSet::items[start..end]`; paths None for lists).
#[derive(Clone, Copy, Debug)]
pub enum IV<'a> {
    Bytes(&'a [u8]),
    Counter(i128),
    Items(u32, u32),
}

/// A complex column's live (path, value) item.
pub type Item<'a> = (Option<&'a [u8]>, &'a [u8]);

/// One image: `ImageSet::vals[start..end]`, sorted by column id.
pub type Span = (u32, u32);

/// Row keys: Some(clustering key), or None for the static-only row.
pub type RowKey<'a> = Option<Ck<'a>>;

/// The images of a partition's visible rows (all of them, or those of a scope) at one moment.
#[derive(Default, Debug)]
pub struct ImageSet<'a> {
    pub vals: Vec<(ColId, IV<'a>)>,
    pub items: Vec<Item<'a>>,
    /// the static row's image, when it shows (every row's static part)
    pub stat: Option<Span>,
    /// the visible clustering rows, sorted by key, and their images
    pub rows: Vec<(Ck<'a>, Span)>,
    /// whether the static-only row shows (static data and no visible clustering row)
    pub static_only: bool,
}

/// One row's images: its static values (empty without any) and, for a clustering row, its own; `items` holds
/// the complex columns' items they point at.
#[derive(Clone, Copy, Debug)]
pub struct Img<'s, 'a> {
    pub stat: &'s [(ColId, IV<'a>)],
    pub row: Option<&'s [(ColId, IV<'a>)]>,
    pub items: &'s [Item<'a>],
}

impl<'s, 'a> Img<'s, 'a> {
    /// The value of `col` in the static part (`in_static`) or the row's own.
    pub fn get(&self, in_static: bool, col: ColId) -> Option<&'s IV<'a>> {
        let img = if in_static { self.stat } else { self.row? };
        img.binary_search_by_key(&col, |x| x.0).ok().map(|i| &img[i].1)
    }

    /// The items of a complex value.
    #[inline]
    pub fn items_of(&self, start: u32, end: u32) -> &'s [Item<'a>] {
        &self.items[start as usize..end as usize]
    }
}

impl PartialEq for Img<'_, '_> {
    fn eq(&self, o: &Self) -> bool {
        vals_eq(self.stat, self.items, o.stat, o.items)
            && match (self.row, o.row) {
                (None, None) => true,
                (Some(a), Some(b)) => vals_eq(a, self.items, b, o.items),
                _ => false,
            }
    }
}

/// Whether two values are equal (`items`: where each one's items are).
#[inline]
pub fn iv_eq(a: &IV, ai: &[Item], b: &IV, bi: &[Item]) -> bool {
    match (a, b) {
        (IV::Bytes(x), IV::Bytes(y)) => key::eq(x, y),
        (IV::Counter(x), IV::Counter(y)) => x == y,
        (IV::Items(s, e), IV::Items(t, f)) => {
            let (x, y) = (&ai[*s as usize..*e as usize], &bi[*t as usize..*f as usize]);
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| key::opt_eq(p.0, q.0) && key::eq(p.1, q.1))
        }
        _ => false,
    }
}

fn vals_eq(a: &[(ColId, IV)], ai: &[Item], b: &[(ColId, IV)], bi: &[Item]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && iv_eq(&x.1, ai, &y.1, bi))
}

const NO_IMAGE: &[(ColId, IV<'static>)] = &[];

impl<'a> ImageSet<'a> {
    pub fn clear(&mut self) {
        self.vals.clear();
        self.items.clear();
        self.stat = None;
        self.rows.clear();
        self.static_only = false;
    }

    #[inline]
    fn span(&self, s: Span) -> &[(ColId, IV<'a>)] {
        &self.vals[s.0 as usize..s.1 as usize]
    }

    fn static_vals(&self) -> &[(ColId, IV<'a>)] {
        match self.stat {
            Some(s) => self.span(s),
            None => NO_IMAGE,
        }
    }

    /// The images of a clustering row whose image is `row`.
    #[inline]
    pub fn img(&self, row: Span) -> Img<'_, 'a> {
        Img { stat: self.static_vals(), row: Some(self.span(row)), items: &self.items }
    }

    /// The images of row `key`, if it shows.
    pub fn get(&self, key: RowKey) -> Option<Img<'_, 'a>> {
        match key {
            None => self.static_only.then(|| Img { stat: self.static_vals(), row: None, items: &self.items }),
            Some(ck) => {
                let i = self.rows.binary_search_by(|r| r.0.cmp(&ck)).ok()?;
                Some(Img { stat: self.static_vals(), row: Some(self.span(self.rows[i].1)), items: &self.items })
            }
        }
    }

    /// Every row that shows, in key order (the static-only row first), with its images.
    pub fn iter(&self) -> impl Iterator<Item = (RowKey<'a>, Img<'_, 'a>)> + '_ {
        let stat = self.static_vals();
        let only = self.static_only.then_some((None, Img { stat, row: None, items: &self.items }));
        only.into_iter().chain(self.rows.iter().map(move |&(ck, s)| {
            (Some(ck), Img { stat, row: Some(self.span(s)), items: &self.items })
        }))
    }

    /// `_row_image`: the image of `row` appended, its span; None when the row does not show (nothing appended).
    pub fn row_image(&mut self, t: &Table, row: &RowState<'a>, now: i64) -> D<Option<Span>> {
        let start = self.vals.len();
        let items_start = self.items.len();
        let shown = self.push_row_image(t, row, now);
        match shown {
            Ok(true) => Ok(Some((start as u32, self.vals.len() as u32))),
            Ok(false) | Err(_) => {
                self.vals.truncate(start);
                self.items.truncate(items_start);
                shown.map(|_| None)
            }
        }
    }

    fn push_row_image(&mut self, t: &Table, row: &RowState<'a>, now: i64) -> D<bool> {
        let start = self.vals.len();
        let extra_shadow = NO_TIMESTAMP;
        let lv = row.liveness;
        let shadow = match row.shadowable {
            None => extra_shadow,
            Some(s) if matches!(lv, Some(l) if l.0 > s.0) || s.0 <= extra_shadow => extra_shadow,
            Some(s) => s.0,
        };
        let live = matches!(lv, Some(l) if l.0 > shadow) && liveness_live(&lv, now);
        for (col, cell) in &row.cells {
            let c = t.c(*col);
            if cell.tomb || cell.ts <= shadow || (cell.ttl != 0 && now >= cell.ldt) || !c.current {
                continue;
            }
            if matches!(c.drop_time, Some(d) if cell.ts <= d) {
                continue;
            }
            self.vals.push((*col, IV::Bytes(borrowed(&cell.value)?)));
        }
        for (col, e) in &row.complex {
            let c = t.c(*col);
            if !c.current {
                continue;
            }
            let floor = match c.drop_time {
                Some(d) => shadow.max(d),
                None => shadow,
            };
            if c.counter {
                if matches!(row.cell(*col), Some(tomb) if tomb.ts > shadow) {
                    continue;
                }
                // `_counter_shards_total`: per counter id the best shard no deletion covers, summed
                let mut best: Vec<(&[u8], (u8, i64, i64))> = Vec::new();
                for (p, sc) in &e.cells {
                    if sc.ts > floor {
                        if sc.value.len() < 17 {
                            return Err(Doubt);
                        }
                        let r = shard_rank(sc);
                        let cid = p.get(..16).unwrap_or(&p[..]);
                        match best.iter_mut().find(|x| x.0 == cid) {
                            Some(x) => {
                                if r > x.1 {
                                    x.1 = r;
                                }
                            }
                            None => best.push((cid, r)),
                        }
                    }
                }
                if !best.is_empty() {
                    let total: i128 = best.iter().map(|x| x.1 .2 as i128).sum();
                    self.vals.push((*col, IV::Counter(total)));
                }
                continue;
            }
            // BTreeMap order: (path, value) sorted by path bytes (paths are unique)
            let first = self.items.len();
            for (p, x) in &e.cells {
                if x.ts > floor && !x.tomb && (x.ttl == 0 || now < x.ldt) {
                    self.items.push((Some(borrowed(p)?), borrowed(&x.value)?));
                }
            }
            if self.items.len() == first {
                continue;
            }
            if c.list {
                // values in cell-path (timeuuid) order, the paths themselves invisible
                let mut err = None;
                self.items[first..].sort_by(|a, b| {
                    types::sort_key_cmp(&Ty::TimeUuid, a.0.unwrap(), b.0.unwrap()).unwrap_or_else(|d| {
                        err = Some(d);
                        Ordering::Equal
                    })
                });
                if let Some(d) = err {
                    return Err(d);
                }
                for it in self.items[first..].iter_mut() {
                    it.0 = None;
                }
            }
            self.vals.push((*col, IV::Items(first as u32, self.items.len() as u32)));
        }
        if !row.complex.is_empty() {
            // the simple cells' columns and the complex ones' each in order: merged (a stable sort)
            self.vals[start..].sort_by_key(|x| x.0);
        }
        Ok(live || self.vals.len() > start)
    }

    /// `partition_images(table, part, now, only)`: the images of the visible CQL rows, of all of them or of the
    /// rows `only` (sorted, distinct keys), in this set (cleared first).
    pub fn partition(&mut self, t: &Table, part: &PartitionState<'a>, now: i64, only: Option<&[Ck<'a>]>) -> D<()> {
        self.clear();
        if !part.static_row.is_empty() {
            self.stat = self.row_image(t, &part.static_row, now)?;
        }
        match only {
            None => {
                for (ck, row) in part.rows.iter() {
                    if let Some(s) = self.row_image(t, row, now)? {
                        self.rows.push((ck, s));
                    }
                }
            }
            Some(keys) => {
                for &ck in keys {
                    if let Some(row) = part.rows.get(&ck) {
                        if let Some(s) = self.row_image(t, row, now)? {
                            self.rows.push((ck, s));
                        }
                    }
                }
            }
        }
        if self.stat.is_some() {
            self.static_only = if !self.rows.is_empty() {
                false
            } else if only.is_none() {
                true
            } else {
                // only whether a row shows: the image it took goes again
                let (vals, items) = (self.vals.len(), self.items.len());
                let mut any = false;
                for row in part.rows.values() {
                    if self.row_image(t, row, now)?.is_some() {
                        any = true;
                        break;
                    }
                }
                self.vals.truncate(vals);
                self.items.truncate(items);
                !any
            };
        }
        Ok(())
    }
}

/// A value or path the images show: borrowed from the batch's input (only a counter's shards are made here, and
/// they show as the counter's total).
#[inline]
fn borrowed<'a>(b: &Cow<'a, [u8]>) -> D<&'a [u8]> {
    match b {
        Cow::Borrowed(b) => Ok(b),
        Cow::Owned(_) => Err(Doubt),
    }
}

fn liveness_live(lv: &Option<Lv>, now: i64) -> bool {
    match lv {
        None => false,
        Some(l) if l.1 == EXPIRED_LIVENESS_TTL => false,
        Some(l) => l.1 == 0 || now < l.2,
    }
}

/// A complex value's items sorted by `path_type.sort_key(path)` (stable), as (path, value) slices: a set's
/// elements and a map's entries in the order Python decodes them.
pub fn in_path_order<'i>(pt: &Ty, items: &[Item<'i>]) -> D<Vec<(&'i [u8], &'i [u8])>> {
    let mut v: Vec<(&[u8], &[u8])> = items.iter().map(|(p, x)| (p.unwrap_or(b""), *x)).collect();
    let mut err = None;
    v.sort_by(|a, b| types::sort_key_cmp(pt, a.0, b.0).unwrap_or_else(|d| {
        err = Some(d);
        Ordering::Equal
    }));
    match err {
        Some(d) => Err(d),
        None => Ok(v),
    }
}
