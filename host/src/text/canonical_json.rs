//! [`write_canonical_json`]: one text for each JSON value, whatever order its keys came in.

use serde_json::Value;

/// Writes `value` to `out` with every object's keys sorted and no whitespace: two values
/// equal as JSON are written alike. Written here rather than left to `serde_json`, whose
/// key order follows a crate feature any dependency may turn on. Numbers are written as
/// parsed (`10` and `10.0` differ).
///
/// ```
/// let value: serde_json::Value = serde_json::from_str(r#"{"b": [1, {"d": 2, "c": 3}], "a": "x"}"#).unwrap();
/// let mut out = String::new();
/// capstan_host::text::write_canonical_json(&value, &mut out);
/// assert_eq!(out, r#"{"a":"x","b":[1,{"c":3,"d":2}]}"#);
/// ```
pub fn write_canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (n, (key, item)) in entries.into_iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical_json(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                write_canonical_json(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}
