//! `cdc_native`: the compiled fast path of cassandra-cdc (commit-log segments -> Arrow cell-log columns).
//!
//! The pure-Python decoder (`cdc_lib.commitlog`, `cdc_lib.celllog`) is the single truth; this module is driven
//! by `cdc_lib.celllog.native`, which falls back to the reference for every entry this module does not decode,
//! and for everything that is not the hot path (headers, compression, encryption, schema).

use std::ffi::{c_int, c_void};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyOverflowError, PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use pyo3::IntoPyObjectExt;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod columns;
pub mod container;
pub mod decode;
pub mod fxhash;
pub mod murmur3;
pub mod sha256;
pub mod state;

use columns::{Bits, Columns, OptBool, Var};
use container::{Counts, Event, Segment, Src};
use decode::{ColInfo, EntryCtx, Fail, Scratch, Table, Tables};

// ---- an owned byte buffer exported through the buffer protocol (zero-copy into pyarrow) --------------------

enum BufData {
    U8(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

/// Read-only bytes owned by Rust; `pyarrow.py_buffer(obj)` wraps them without a copy.
#[pyclass(frozen, module = "cdc_native")]
pub struct Buffer {
    data: BufData,
}

impl Buffer {
    fn ptr_len(&self) -> (*const u8, usize) {
        match &self.data {
            BufData::U8(v) => (v.as_ptr(), v.len()),
            BufData::I32(v) => (v.as_ptr() as *const u8, v.len() * 4),
            BufData::I64(v) => (v.as_ptr() as *const u8, v.len() * 8),
        }
    }
}

#[pymethods]
impl Buffer {
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("View is null"));
        }
        if (flags & ffi::PyBUF_WRITABLE) == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("Object is not writable"));
        }
        let (ptr, len) = slf.get().ptr_len();
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = ptr as *mut c_void;
            (*view).len = len as isize;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if (flags & ffi::PyBUF_FORMAT) == ffi::PyBUF_FORMAT {
                c"B".as_ptr() as *mut _
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if (flags & ffi::PyBUF_ND) == ffi::PyBUF_ND { &mut (*view).len } else { std::ptr::null_mut() };
            (*view).strides =
                if (flags & ffi::PyBUF_STRIDES) == ffi::PyBUF_STRIDES { &mut (*view).itemsize } else { std::ptr::null_mut() };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    fn __len__(&self) -> usize {
        self.ptr_len().1
    }
}

fn buf(py: Python<'_>, data: BufData) -> PyResult<Py<PyAny>> {
    Py::new(py, Buffer { data })?.into_py_any(py)
}

fn bits_buf(py: Python<'_>, b: Bits) -> PyResult<Py<PyAny>> {
    buf(py, BufData::U8(b.bytes))
}

// column spec for Python: (validity or None, buffer 1, buffer 2 or None, null_count)
type ColOut = (Option<Py<PyAny>>, Py<PyAny>, Option<Py<PyAny>>, usize);

fn var_out(py: Python<'_>, v: Var) -> PyResult<ColOut> {
    let valid = if v.nullable && v.nulls > 0 { Some(bits_buf(py, v.valid)?) } else { None };
    Ok((valid, buf(py, BufData::I32(v.offsets))?, Some(buf(py, BufData::U8(v.data))?), v.nulls))
}

fn optbool_out(py: Python<'_>, b: OptBool) -> PyResult<ColOut> {
    let valid = if b.nulls > 0 { Some(bits_buf(py, b.valid)?) } else { None };
    Ok((valid, bits_buf(py, b.values)?, None, b.nulls))
}

// ---- the decoder ------------------------------------------------------------------------------------------

struct Current {
    seg: Segment,
    file: PyBuffer<u8>,
    section: Option<PyBuffer<u8>>,
}

/// Cell-log records of many entries (like `celllog_fast.FastCellLog`), and the segment walk that feeds it.
#[pyclass(module = "cdc_native")]
pub struct Decoder {
    tables: Tables,
    cols: Columns,
    sc: Scratch,
    cur: Option<Current>,
    counts: Counts,
}

fn slice_of(b: &PyBuffer<u8>) -> &[u8] {
    // SAFETY: the buffer is held (exported) for as long as the PyBuffer lives; C-contiguous u8 checked by
    // PyBuffer::get; we only read.
    unsafe { std::slice::from_raw_parts(b.buf_ptr() as *const u8, b.len_bytes()) }
}

/// What `cdc_lib` expects of this module: bumped whenever a class or function changes, so that a module built
/// from older sources is not used by newer Python code (`cdc_lib.celllog.native`).
const API: u32 = 7;

const EV_END: u8 = 0;
const EV_BATCH: u8 = 1;
const EV_DAMAGE: u8 = 2;
const EV_ENTRY: u8 = 3;
const EV_NEED_TABLE: u8 = 4;
const EV_SECTION: u8 = 5;

#[pymethods]
impl Decoder {
    #[new]
    fn new() -> Self {
        Decoder { tables: Tables::default(), cols: Columns::new(), sc: Scratch::default(), cur: None,
                  counts: Counts::default() }
    }

    /// Tell the decoder about a table: `mode` 0 decode, 1 system (skip when first), 2 hand to Python,
    /// 3 unknown, 4 a system table the schema does not describe (skip when first, else unknown). `clustering`: fixed value length per clustering column (None = variable);
    /// `columns`: (name, is_complex, fixed length or None) of every column the data may name.
    #[pyo3(signature = (table_id, mode, id_str="", keyspace="", name="", clustering=vec![], columns=vec![]))]
    #[allow(clippy::too_many_arguments)]
    fn register_table(&mut self, table_id: &[u8], mode: u8, id_str: &str, keyspace: &str, name: &str,
                      clustering: Vec<Option<u32>>, columns: Vec<(String, bool, Option<u32>)>) -> PyResult<()> {
        let tid: [u8; 16] = table_id.try_into().map_err(|_| PyValueError::new_err("table id must be 16 bytes"))?;
        let cols = columns
            .into_iter()
            .map(|(n, complex, fixed)| ColInfo { name: n.into_bytes(), complex, fixed })
            .collect();
        self.tables.insert(tid, Table::new(mode, id_str.as_bytes().to_vec(), keyspace.as_bytes().to_vec(),
                                           name.as_bytes().to_vec(), clustering, cols));
        Ok(())
    }

    fn clear_tables(&mut self) {
        self.tables.clear();
    }

    fn has_table(&self, table_id: &[u8]) -> bool {
        table_id.try_into().map(|t: [u8; 16]| self.tables.contains_key(&t)).unwrap_or(false)
    }

    #[getter]
    fn rows(&self) -> usize {
        self.cols.rows
    }

    fn __len__(&self) -> usize {
        self.cols.rows
    }

    /// Partition updates decoded so far in the segment (the next entry's `entry_index`).
    #[getter]
    fn entry_index(&self) -> i64 {
        self.cur.as_ref().map(|c| c.seg.entry_index).unwrap_or(0)
    }

    #[setter]
    fn set_entry_index(&mut self, value: i64) -> PyResult<()> {
        let cur = self.cur.as_mut().ok_or_else(|| PyRuntimeError::new_err("no segment begun"))?;
        cur.seg.entry_index = value;
        Ok(())
    }

    /// (entries, system_entries) counted natively since the last call.
    fn take_counts(&mut self) -> (u64, u64) {
        let c = std::mem::take(&mut self.counts);
        (c.entries, c.system_entries)
    }

    /// Start walking a segment: `buf` its bytes (bytes or mmap, held until `end_segment`), after its header.
    #[pyo3(signature = (buf, name, segment_id, version, header_size, packed, start=None, stop=None))]
    #[allow(clippy::too_many_arguments)]
    fn begin_segment(&mut self, buf: &Bound<'_, PyAny>, name: &str, segment_id: i64, version: i32,
                     header_size: usize, packed: bool, start: Option<i64>, stop: Option<i64>) -> PyResult<()> {
        let file = PyBuffer::<u8>::get(buf)?;
        if !file.is_c_contiguous() {
            return Err(PyValueError::new_err("segment buffer must be contiguous"));
        }
        let seg = Segment::new(name.as_bytes().to_vec(), segment_id, version, header_size, packed, start, stop,
                               file.len_bytes());
        self.cur = Some(Current { seg, file, section: None });
        Ok(())
    }

    /// Release the segment's buffer (required before closing an mmap).
    fn end_segment(&mut self, py: Python<'_>) {
        if let Some(c) = self.cur.take() {
            c.file.release(py);
            if let Some(s) = c.section {
                s.release(py);
            }
        }
    }

    /// Walk on until something needs Python; returns the event as a tuple (see `celllog_native`).
    fn run(&mut self, py: Python<'_>, batch_rows: i64) -> PyResult<Py<PyAny>> {
        let cur = self.cur.as_mut().ok_or_else(|| PyRuntimeError::new_err("no segment begun"))?;
        if cur.seg.awaiting() {
            return Err(PyRuntimeError::new_err("a section awaits feed_section/skip_section"));
        }
        let tables = &mut self.tables;
        let cols = &mut self.cols;
        let sc = &mut self.sc;
        let counts = &mut self.counts;
        let file = slice_of(&cur.file);
        let section: &[u8] = cur.section.as_ref().map(slice_of).unwrap_or(&[]);
        let seg = &mut cur.seg;
        let ev = py.detach(|| seg.run(file, section, tables, cols, sc, batch_rows, counts));
        let bytes_of = |src: Src, a: usize, b: usize| -> Py<PyAny> {
            let s = match src {
                Src::File => file,
                Src::Section => section,
            };
            PyBytes::new(py, &s[a..b]).into_any().unbind()
        };
        let out = match ev {
            Event::End => (EV_END,).into_py_any(py)?,
            Event::Batch => (EV_BATCH,).into_py_any(py)?,
            Event::Damage { kind, position, reason, data, physical } => {
                (EV_DAMAGE, kind, position, reason, bytes_of(data.0, data.1, data.2), physical).into_py_any(py)?
            }
            Event::Entry { start, position, data, native_failed } => {
                (EV_ENTRY, start, position, bytes_of(data.0, data.1, data.2), native_failed).into_py_any(py)?
            }
            Event::NeedTable(t) => (EV_NEED_TABLE, PyBytes::new(py, &t)).into_py_any(py)?,
            Event::Section { pos, nxt, ulen, section_logical, cut } => {
                (EV_SECTION, pos, nxt, ulen, section_logical, cut).into_py_any(py)?
            }
        };
        Ok(out)
    }

    /// The bytes of the awaited compressed/encrypted section (held until the next section); for a section the
    /// end of the file cuts, what the codec decoded of it and the reason of its torn tail.
    #[pyo3(signature = (data, cut_reason=None))]
    fn feed_section(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>, cut_reason: Option<String>) -> PyResult<()> {
        let cur = self.cur.as_mut().ok_or_else(|| PyRuntimeError::new_err("no segment begun"))?;
        if !cur.seg.awaiting() {
            return Err(PyRuntimeError::new_err("no section awaits its data"));
        }
        let b = PyBuffer::<u8>::get(data)?;
        if !b.is_c_contiguous() {
            return Err(PyValueError::new_err("section buffer must be contiguous"));
        }
        cur.seg.feed_section(b.len_bytes(), cut_reason);
        if let Some(old) = cur.section.replace(b) {
            old.release(py);
        }
        Ok(())
    }

    fn skip_section(&mut self) -> PyResult<()> {
        let cur = self.cur.as_mut().ok_or_else(|| PyRuntimeError::new_err("no segment begun"))?;
        cur.seg.skip_section();
        Ok(())
    }

    /// Decode one mutation (FastCellLog.add_entry): its number of partition updates; None when the native
    /// decoder leaves it to the reference; raises KeyError(table id bytes) for a table not registered.
    #[pyo3(signature = (data, messaging_version, segment, segment_id, position, entry_index))]
    fn add_entry(&mut self, py: Python<'_>, data: &[u8], messaging_version: u32, segment: &str, segment_id: i64,
                 position: i64, entry_index: i64) -> PyResult<Option<usize>> {
        let ctx = EntryCtx { segment: segment.as_bytes(), segment_id, position, entry_index, mv: messaging_version };
        let mark = self.cols.mark();
        match decode::decode_entry(data, &ctx, &mut self.tables, &mut self.cols, &mut self.sc) {
            Ok(n) => Ok(Some(n)),
            Err(Fail::Bad) => {
                self.cols.truncate(mark);
                Ok(None)
            }
            Err(Fail::NeedTable(t)) => {
                self.cols.truncate(mark);
                Err(pyo3::exceptions::PyKeyError::new_err(PyBytes::new(py, &t).unbind()))
            }
        }
    }

    /// Append reference records (dicts as `celllog.records.update_records` makes them).
    fn add_records(&mut self, records: &Bound<'_, PyList>) -> PyResult<()> {
        fn get<'py, T: FromPyObjectOwned<'py>>(d: &Bound<'py, PyDict>, k: &str) -> PyResult<T> {
            d.get_item(k)?.ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(k.to_string()))?.extract().map_err(Into::into)
        }
        for r in records.iter() {
            let d = r.cast::<PyDict>()?;
            let segment: String = get(d, "segment")?;
            let table_id: String = get(d, "table_id")?;
            let keyspace: String = get(d, "keyspace")?;
            let table: String = get(d, "table")?;
            let key: Vec<u8> = get(d, "partition_key")?;
            let clustering: Vec<u8> = get(d, "clustering")?;
            let clustering_end: Option<Vec<u8>> = get(d, "clustering_end")?;
            let kind: String = get(d, "kind")?;
            let kind = columns::KIND_NAMES
                .iter()
                .position(|k| *k == kind.as_bytes())
                .ok_or_else(|| PyValueError::new_err(format!("unknown record kind {kind:?}")))? as u8;
            let column: Option<String> = get(d, "column")?;
            let path: Option<Vec<u8>> = get(d, "path")?;
            let value: Option<Vec<u8>> = get(d, "value")?;
            let mutation_id: Option<Vec<u8>> = get(d, "mutation_id")?;
            let mutation_id = match mutation_id {
                None => None,
                Some(m) => Some(<[u8; 16]>::try_from(m.as_slice())
                    .map_err(|_| PyValueError::new_err("mutation_id must be 16 bytes"))?),
            };
            let u = columns::Upd {
                segment: segment.as_bytes(),
                segment_id: get(d, "segment_id")?,
                position: get(d, "position")?,
                entry_index: get(d, "entry_index")?,
                table_id: table_id.as_bytes(),
                keyspace: keyspace.as_bytes(),
                table: table.as_bytes(),
                key: &key,
                token: get(d, "token")?,
                mutation_id,
            };
            self.cols.push_record(&u, get(d, "seq")?, &clustering, clustering_end.as_deref(),
                                  get(d, "start_inclusive")?, get(d, "end_inclusive")?, get(d, "is_static")?, kind,
                                  column.as_deref().map(str::as_bytes), path.as_deref(), value.as_deref(),
                                  get(d, "timestamp")?, get(d, "ttl")?, get(d, "local_deletion_time")?);
        }
        Ok(())
    }

    /// The accumulated records as column buffers, in CELL_LOG_SCHEMA order; the decoder starts a new batch.
    /// Each column is (validity, buffer, buffer 2 or None, null count): offsets + data for binary/string.
    fn take_batch(&mut self, py: Python<'_>) -> PyResult<(usize, Py<PyList>)> {
        if self.cols.overflow() {
            self.cols = Columns::new();
            return Err(PyOverflowError::new_err(
                "cell-log batch holds 2 GiB of binary data; use smaller batches"));
        }
        let next = Columns::new_like(&self.cols);
        let c = std::mem::replace(&mut self.cols, next);
        let c = c.finish().map_err(|_| {
            PyOverflowError::new_err("cell-log batch holds 2 GiB of binary data; use smaller batches")
        })?;
        let n = c.rows;
        let i64c = |v: Vec<i64>| -> PyResult<ColOut> { Ok((None, buf(py, BufData::I64(v))?, None, 0)) };
        let i32c = |v: Vec<i32>| -> PyResult<ColOut> { Ok((None, buf(py, BufData::I32(v))?, None, 0)) };
        let out: Vec<ColOut> = vec![
            var_out(py, c.segment)?,
            i64c(c.segment_id)?,
            i64c(c.position)?,
            i32c(c.entry_index)?,
            i32c(c.seq)?,
            var_out(py, c.table_id)?,
            var_out(py, c.keyspace)?,
            var_out(py, c.table)?,
            var_out(py, c.partition_key)?,
            i64c(c.token)?,
            var_out(py, c.clustering)?,
            var_out(py, c.clustering_end)?,
            optbool_out(py, c.start_inclusive)?,
            optbool_out(py, c.end_inclusive)?,
            (None, bits_buf(py, c.is_static)?, None, 0),
            var_out(py, c.kind)?,
            var_out(py, c.column)?,
            var_out(py, c.path)?,
            var_out(py, c.value)?,
            i64c(c.timestamp)?,
            i32c(c.ttl)?,
            i64c(c.ldt)?,
            var_out(py, c.mutation_id)?,
        ];
        let items: Vec<Bound<'_, PyTuple>> =
            out.into_iter().map(|t| t.into_pyobject(py)).collect::<Result<_, _>>()?;
        Ok((n, PyList::new(py, items)?.unbind()))
    }

    /// Drop the accumulated records (after an exception, for instance).
    fn clear(&mut self) {
        self.cols = Columns::new();
    }
}

/// zlib.crc32 (for tests).
#[pyfunction]
#[pyo3(signature = (data, crc=0))]
fn crc32(data: &[u8], crc: u32) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

/// Murmur3 token of a partition key (for tests).
#[pyfunction]
fn token(key: &[u8]) -> i64 {
    murmur3::token(key)
}

/// `commitlog.model.mutation_id` of an entry's bytes (for tests).
#[pyfunction]
fn mutation_id<'py>(py: Python<'py>, data: &[u8]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &decode::mutation_id(data))
}


// ---- the state engine (state.native) ---------------------------------------------------------------------

use state::arrow_in::{Col, FFIArrowArray, FFIArrowSchema};
use state::out::{filled, Out, Validity};
use state::table::{ColumnDesc, Role};
use state::types::Ty;

/// A CQL type from `state.native.type_desc`: (kind, fixed length, multicell, subtypes, field names, dimension).
fn ty_from_desc(d: &Bound<'_, PyAny>) -> PyResult<Ty> {
    let (kind, fixed, multicell, subs, fields, dim): (String, Option<u32>, bool, Vec<Bound<'_, PyAny>>, Vec<String>, u32) =
        d.extract()?;
    let subs = subs.iter().map(ty_from_desc).collect::<PyResult<Vec<Ty>>>()?;
    Ty::from_desc(&kind, fixed, multicell, subs, fields, dim)
        .ok_or_else(|| PyValueError::new_err(format!("type kind {kind:?} is not in the compiled engine")))
}

/// A table from `state.native.table_desc`.
fn table_from_desc(d: &Bound<'_, PyAny>) -> PyResult<state::table::Table> {
    type ColD<'py> = (String, String, Bound<'py, PyAny>, bool);
    type DropD<'py> = (String, Bound<'py, PyAny>, i64);
    let (id, keyspace, name, cols, dropped): (String, String, String, Vec<ColD<'_>>, Vec<DropD<'_>>) = d.extract()?;
    let mut columns = Vec::with_capacity(cols.len());
    for (cname, role, ty, reversed) in cols {
        let role = match role.as_str() {
            "partition_key" => Role::PartitionKey,
            "clustering" => Role::Clustering,
            "static" => Role::Static,
            "regular" => Role::Regular,
            other => return Err(PyValueError::new_err(format!("column {cname}: unknown kind {other:?}"))),
        };
        columns.push(ColumnDesc { name: cname, role, ty: ty_from_desc(&ty)?, reversed });
    }
    let dropped = dropped.iter().map(|(n, ty, t)| Ok((n.clone(), ty_from_desc(ty)?, *t))).collect::<PyResult<Vec<_>>>()?;
    Ok(state::table::Table::new(id, keyspace, name, columns, dropped))
}

/// Holds the C data interface structs of an exported Arrow array for as long as it is read.
struct Exported<'py> {
    _capsules: (Bound<'py, PyAny>, Bound<'py, PyAny>),
    col: Col,
}

fn import_array<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Exported<'py>> {
    use pyo3::types::PyCapsule;
    let (schema, array): (Bound<'py, PyAny>, Bound<'py, PyAny>) = obj.call_method0("__arrow_c_array__")?.extract()?;
    let sp = schema.cast::<PyCapsule>()?.pointer_checked(Some(c"arrow_schema"))?.as_ptr() as *const FFIArrowSchema;
    let ap = array.cast::<PyCapsule>()?.pointer_checked(Some(c"arrow_array"))?.as_ptr() as *const FFIArrowArray;
    // SAFETY: the capsules hold valid, unreleased structs (pyarrow's export) and live as long as `Exported`
    let col = unsafe { Col::from_ffi(sp, ap) }.map_err(PyValueError::new_err)?;
    Ok(Exported { _capsules: (schema, array), col })
}

fn le_bytes<T: Copy, const N: usize>(v: Vec<T>, f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * N);
    for x in v {
        out.extend_from_slice(&f(x));
    }
    out
}

/// An `Out` as `(length, null count, validity or None, [buffers], [children])` for `pa.Array.from_buffers`.
fn out_spec(py: Python<'_>, o: Out) -> PyResult<Py<PyAny>> {
    let validity = |py: Python<'_>, v: Validity| -> PyResult<(usize, Option<Py<PyAny>>)> {
        let (nulls, bits) = v.finish();
        Ok((nulls, bits.map(|b| bits_buf(py, b)).transpose()?))
    };
    type Spec = (usize, (usize, Option<Py<PyAny>>), Vec<Py<PyAny>>, Vec<Py<PyAny>>);
    let fixed = |py: Python<'_>, values: BufData, valid: Validity| -> PyResult<Spec> {
        Ok((valid.len(), validity(py, valid)?, vec![buf(py, values)?], vec![]))
    };
    let (len, (nulls, valid), bufs, children): Spec = match o {
        Out::Var { offsets, data, valid } => (valid.len(), validity(py, valid)?,
                                              vec![buf(py, BufData::I32(offsets))?, buf(py, BufData::U8(data))?], vec![]),
        // fixed-width values, with the nulls left unwritten at their end (see `Out`)
        Out::I8 { v, valid } => fixed(py, BufData::U8(le_bytes(filled(v, valid.len()), i8::to_le_bytes)), valid)?,
        Out::I16 { v, valid } => fixed(py, BufData::U8(le_bytes(filled(v, valid.len()), i16::to_le_bytes)), valid)?,
        Out::I32 { v, valid } => fixed(py, BufData::I32(filled(v, valid.len())), valid)?,
        Out::I64 { v, valid } => fixed(py, BufData::I64(filled(v, valid.len())), valid)?,
        Out::F32 { v, valid } => fixed(py, BufData::U8(le_bytes(filled(v, valid.len()), u32::to_le_bytes)), valid)?,
        Out::F64 { v, valid } => fixed(py, BufData::U8(le_bytes(filled(v, valid.len()), u64::to_le_bytes)), valid)?,
        Out::Bool { v, valid } => (valid.len(), validity(py, valid)?, vec![bits_buf(py, v)?], vec![]),
        Out::List { offsets, valid, child } => (valid.len(), validity(py, valid)?, vec![buf(py, BufData::I32(offsets))?],
                                                vec![out_spec(py, *child)?]),
        Out::Struct { valid, children } => {
            let kids = children.into_iter().map(|c| out_spec(py, c)).collect::<PyResult<Vec<_>>>()?;
            (valid.len(), validity(py, valid)?, vec![], kids)
        }
    };
    (len, nulls, valid, bufs, children).into_py_any(py)
}

/// One table's batch through the compiled state engine (see `cdc_lib.state.native.process_table`).
#[pyfunction]
#[pyo3(signature = (table_desc, cell_log, stored, expiring, now, prev_now, batch_seq, cluster, threads=1,
                    grouping=None))]
#[allow(clippy::too_many_arguments)]
fn process_table<'py>(py: Python<'py>, table_desc: &Bound<'py, PyAny>, cell_log: &Bound<'py, PyAny>,
                      stored: &Bound<'py, PyAny>, expiring: Vec<Vec<u8>>, now: i64, prev_now: Option<i64>,
                      batch_seq: i64, cluster: &str, threads: usize, grouping: Option<PyRef<'py, Grouping>>)
                      -> PyResult<Bound<'py, PyDict>> {
    let mut table = table_from_desc(table_desc)?;
    // the cell log's record batches, read where they are (their capsules live until the end of the call)
    let log = cell_log.try_iter()?.map(|b| import_array(&b?)).collect::<PyResult<Vec<_>>>()?;
    let log_cols: Vec<Col> = log.iter().map(|e| e.col.clone()).collect();
    // the stored records' record batches too
    let st = stored.try_iter()?.map(|b| import_array(&b?)).collect::<PyResult<Vec<_>>>()?;
    let st_cols: Vec<Col> = st.iter().map(|e| e.col.clone()).collect();
    let settings = state::driver::Settings { threads, now, prev_now, batch_seq, cluster };
    let (log_col, st_col) = (&log_cols[..], &st_cols[..]);
    // the engine touches no Python object: other Python threads run meanwhile
    let given = grouping.as_deref();
    let out = py.detach(|| state::driver::process_table(&mut table, log_col, st_col, &expiring,
                                                        given.map(|g| &g.grouping), &settings))
        .map_err(PyValueError::new_err)?;
    let d = PyDict::new(py);
    d.set_item("grouped", out.grouped)?;
    // the partitions in publish order, as Arrow buffers: (binary keys, their int64 tokens), the grouping's own
    // when they are its partitions
    match (out.keys, given) {
        (Some((keys, tokens)), _) => {
            d.set_item("keys", out_spec(py, keys)?)?;
            d.set_item("tokens", buf(py, BufData::I64(tokens))?)?;
        }
        (None, Some(g)) => {
            d.set_item("keys", g.keys.clone_ref(py))?;
            d.set_item("tokens", g.tokens.clone_ref(py))?;
        }
        (None, None) => return Err(PyValueError::new_err("the engine named no partitions and was given none")),
    }
    // one entry per thread's run: {doubted, changed, event_partition, event_ts_us, event_token, event_idx, event
    // columns, state columns}
    let runs = PyList::empty(py);
    for run in out.runs {
        let r = PyDict::new(py);
        r.set_item("doubted", run.doubted)?;
        r.set_item("changed", run.changed)?;
        let ev = run.events;
        r.set_item("event_partition", buf(py, BufData::I32(ev.partition))?)?;
        r.set_item("event_ts_us", buf(py, BufData::I64(ev.ts_us))?)?;
        r.set_item("event_token", buf(py, BufData::I64(ev.token))?)?;
        r.set_item("event_idx", buf(py, BufData::I64(ev.idx))?)?;
        for (name, o) in [("event_id", ev.event_id), ("op", ev.op), ("key_json", ev.key_json),
                          ("event_json", ev.event_json), ("event_partition_key", ev.partition_key)] {
            r.set_item(name, out_spec(py, o)?)?;
        }
        let cols = PyList::empty(py);
        for o in run.state.columns() {
            cols.append(out_spec(py, o)?)?;
        }
        r.set_item("state", cols)?;
        runs.append(r)?;
    }
    d.set_item("runs", runs)?;
    Ok(d)
}

/// The state engine's time by phase since the last call, {phase name: ticks} (`state::phases`); None unless the
/// module was built with the `phase-times` feature (`benchmarks/engine_phases.py` builds one).
#[pyfunction]
fn phase_times(py: Python<'_>) -> PyResult<Option<Bound<'_, PyDict>>> {
    let Some(ticks) = state::phases::take() else { return Ok(None) };
    let d = PyDict::new(py);
    for (name, t) in state::phases::NAMES.iter().zip(ticks) {
        d.set_item(name, t)?;
    }
    Ok(Some(d))
}

/// The distinct partitions of a table's cell-log records in publish order (see
/// `cdc_lib.state.native.partition_keys`): (binary keys as an `out_spec`, their int64 tokens, the `Grouping`
/// `process_table` takes to group the same records without sorting them again).
#[pyfunction]
#[pyo3(signature = (pks, tokens, threads=1))]
fn partition_keys<'py>(py: Python<'py>, pks: &Bound<'py, PyAny>, tokens: &Bound<'py, PyAny>, threads: usize)
                       -> PyResult<(Py<PyAny>, Py<PyAny>, Grouping)> {
    // the chunks themselves, which the grouping holds
    let listed = |chunks: &Bound<'py, PyAny>| PyList::new(py, chunks.try_iter()?.collect::<PyResult<Vec<_>>>()?);
    let (pk_chunks, token_chunks) = (listed(pks)?, listed(tokens)?);
    let import = |chunks: &Bound<'py, PyList>| chunks.iter().map(|c| import_array(&c)).collect::<PyResult<Vec<_>>>();
    let (pks, tokens) = (import(&pk_chunks)?, import(&token_chunks)?);
    let cols = |e: &[Exported<'_>]| e.iter().map(|e| e.col.clone()).collect::<Vec<Col>>();
    let (pk_cols, token_cols) = (cols(&pks), cols(&tokens));
    let (keys, toks, grouping) = py.detach(|| state::driver::partition_keys(&pk_cols, &token_cols, threads))
        .map_err(PyValueError::new_err)?;
    let made_from = (pk_chunks.into_any().unbind(), token_chunks.into_any().unbind());
    let (keys, tokens) = (out_spec(py, keys)?, buf(py, BufData::I64(toks))?);
    let (k, t) = (keys.clone_ref(py), tokens.clone_ref(py));
    Ok((keys, tokens, Grouping { grouping, _made_from: made_from, keys: k, tokens: t }))
}

/// How `partition_keys` grouped a cell log's records into partitions, for `process_table` on the same record
/// batches (it sorts them again when given other ones). Opaque: record places and tokens, and the key and token
/// chunks it was made from, held so that their buffers live as long as it does: no other data can take their
/// addresses meanwhile, and so an equal address means the same values.
#[pyclass(frozen, module = "cdc_native")]
struct Grouping {
    grouping: state::driver::Grouping,
    _made_from: (Py<PyAny>, Py<PyAny>),
    /// the partitions' keys and tokens as `partition_keys` handed them over: `process_table` hands the same back
    /// rather than a copy
    keys: Py<PyAny>,
    tokens: Py<PyAny>,
}

#[pymodule]
fn cdc_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Decoder>()?;
    m.add_class::<Buffer>()?;
    m.add_function(wrap_pyfunction!(crc32, m)?)?;
    m.add_function(wrap_pyfunction!(token, m)?)?;
    m.add_function(wrap_pyfunction!(mutation_id, m)?)?;
    m.add_function(wrap_pyfunction!(process_table, m)?)?;
    m.add_function(wrap_pyfunction!(partition_keys, m)?)?;
    m.add_function(wrap_pyfunction!(phase_times, m)?)?;
    m.add_class::<Grouping>()?;
    m.add("EV_END", EV_END)?;
    m.add("EV_BATCH", EV_BATCH)?;
    m.add("EV_DAMAGE", EV_DAMAGE)?;
    m.add("EV_ENTRY", EV_ENTRY)?;
    m.add("EV_NEED_TABLE", EV_NEED_TABLE)?;
    m.add("EV_SECTION", EV_SECTION)?;
    m.add("MODE_USER", decode::MODE_USER)?;
    m.add("MODE_SKIP", decode::MODE_SKIP)?;
    m.add("MODE_PYTHON", decode::MODE_PYTHON)?;
    m.add("MODE_UNKNOWN", decode::MODE_UNKNOWN)?;
    m.add("MODE_SYSTEM_UNKNOWN", decode::MODE_SYSTEM_UNKNOWN)?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    // set by native/build.py for the build that uses its training profile (-Cprofile-use)
    m.add("PROFILE_GUIDED", option_env!("CDC_NATIVE_PROFILE_GUIDED") == Some("1"))?;
    m.add("API", API)?;
    Ok(())
}
