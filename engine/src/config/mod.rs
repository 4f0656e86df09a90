//! How ranks are configured, in one place: the environment variables `mlx.launch` (or
//! `nuvec launch`) sets and this crate reads ([`env`](mod@env)), the ring's hostfile ([`hostfile`])
//! and JACCL's device file ([`devices`]).
//!
//! This module is the only part of the crate that reads the environment or parses these
//! formats; the backends receive typed values. It also writes both files, byte for byte as
//! `mlx.launch` does, so that a launcher built on this crate (`nuvec launch` is one) writes
//! exactly what the ranks read.

pub mod devices;
pub mod env;
pub mod hostfile;

#[cfg(test)]
mod tests;

/// A JSON value's kind, for messages about the hostfile and the device file.
fn json_kind(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// Appends `s` as a JSON string the way Python's `json.dumps` writes it by default
/// (`ensure_ascii`): `"` and `\` escaped, `\b \f \n \r \t` in short form, every other
/// character outside printable ASCII (DEL included) as `\uXXXX` UTF-16 units, lowercase hex.
fn push_python_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// Appends `[a, b, ...]` with Python's `", "` separator, each item written by `item`.
fn push_python_list<T>(out: &mut String, items: &[T], mut item: impl FnMut(&mut String, &T)) {
    out.push('[');
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        item(out, x);
    }
    out.push(']');
}
