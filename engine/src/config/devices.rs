//! JACCL's device file: a JSON array of P rows of P cells; cell `[i][j]` says how rank `i`
//! reaches rank `j`: `null` (not at all; required on the diagonal), a device name such as
//! `"rdma_en5"`, or a list of names (one per cable).
//!
//! [`to_json`] writes the file as `mlx.launch` does. Reading it (crate-internal: `parse` and
//! `read`) only checks its shape, with errors naming the file, the row and the
//! cell at fault; whether the matrix forms a mesh or a ring is for JACCL's configuration
//! (`jaccl::DeviceMatrix`, feature `jaccl`) to judge.

use std::path::Path;

use serde_json::Value;

use super::json_kind as kind;

use crate::error::{Error, Result};

/// One cell of a device file as written: how one rank reaches another.
///
/// A single device and a list of one device mean the same to the reader; they are kept
/// apart so that a launcher writes back the form its own hostfile used, as `mlx.launch`
/// does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceCell<'a> {
    /// Not connected (`null`): the diagonal, and pairs without a cable.
    None,
    /// One device, written as a string.
    Device(&'a str),
    /// Devices, one per cable, written as a list.
    Devices(&'a [String]),
}

/// A device file's text for `rows` (row `i`: how rank `i` reaches each rank), byte for byte
/// as `mlx.launch` writes it: Python's `json.dumps` (`", "` between items, everything outside
/// printable ASCII escaped).
pub fn to_json(rows: &[Vec<DeviceCell<'_>>]) -> String {
    let mut out = String::new();
    super::push_python_list(&mut out, rows, |out, row| {
        super::push_python_list(out, row, |out, cell| match cell {
            DeviceCell::None => out.push_str("null"),
            DeviceCell::Device(name) => super::push_python_string(out, name),
            DeviceCell::Devices(names) => {
                super::push_python_list(out, names, |out, n| super::push_python_string(out, n))
            }
        });
    });
    out
}

/// Reads a device file into its cells (`cells[i][j]`: the devices rank `i` reaches rank `j`
/// by; empty for `null`).
///
/// # Errors
///
/// [`Error::Config`] naming the file: it cannot be read, or as [`parse`] (malformed).
#[cfg_attr(not(feature = "jaccl"), allow(dead_code))] // read by the jaccl backend and tests
pub(crate) fn read(path: &Path) -> Result<Vec<Vec<Vec<String>>>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
        path: path.to_path_buf(),
        reason: match e.kind() {
            std::io::ErrorKind::NotFound => "the device file does not exist".into(),
            _ => format!("the device file cannot be read: {e}"),
        },
    })?;
    parse(&text, path)
}

/// Parses a device file's text; `source` names it in errors.
///
/// # Errors
///
/// [`Error::Config`] naming `source` and, for a malformed file, the row or cell: not JSON,
/// not an array of rows, a row that is not an array of P cells, a cell that is not `null`,
/// a name or a list of names, or an empty name.
#[cfg_attr(not(feature = "jaccl"), allow(dead_code))] // read by the jaccl backend and tests
pub(crate) fn parse(text: &str, source: &Path) -> Result<Vec<Vec<Vec<String>>>> {
    let fail = |reason: String| Error::Config {
        path: source.to_path_buf(),
        reason,
    };
    let value: Value = serde_json::from_str(text)
        .map_err(|e| fail(format!("the device file is not valid JSON: {e}")))?;
    let Value::Array(rows) = value else {
        return Err(fail(format!(
            "the device file must be a JSON array with one row per rank, not {}",
            kind(&value)
        )));
    };
    let size = rows.len();
    let mut cells = Vec::with_capacity(size);
    for (rank, row) in rows.iter().enumerate() {
        let Value::Array(row) = row else {
            return Err(fail(format!(
                "row {rank} (rank {rank}) is {}, not an array of {size} cells",
                kind(row)
            )));
        };
        if row.len() != size {
            return Err(fail(format!(
                "row {rank} (rank {rank}) has {} cells but the file has {size} rows: each \
                 row lists how that rank reaches every rank, itself included (null)",
                row.len()
            )));
        }
        let mut names_row = Vec::with_capacity(size);
        for (peer, cell) in row.iter().enumerate() {
            let at = || format!("cell [{rank}][{peer}] (how rank {rank} reaches rank {peer})");
            let names = match cell {
                Value::Null => Vec::new(),
                Value::String(name) => vec![name.clone()],
                Value::Array(items) => items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| match item {
                        Value::String(name) => Ok(name.clone()),
                        other => Err(fail(format!(
                            "{}: entry {i} is {}, not a device name",
                            at(),
                            kind(other)
                        ))),
                    })
                    .collect::<Result<_>>()?,
                other => {
                    return Err(fail(format!(
                        "{} is {}: expected null, a device name or a list of device names",
                        at(),
                        kind(other)
                    )));
                }
            };
            if names.iter().any(String::is_empty) {
                return Err(fail(format!("{} names an empty device", at())));
            }
            names_row.push(names);
        }
        cells.push(names_row);
    }
    Ok(cells)
}
