//! A structural check of a tool's `args-schema` against the JSON Schema vocabulary.
//!
//! The host does not validate arguments against the schema (the plugin does, with the
//! types it derived the schema from); it shows the schema to models. So the check is that
//! it *is* a JSON Schema a model API accepts: every known keyword holds the kind of value
//! the specification gives it (drafts 4 to 2020-12), subschemas recursively, the root
//! describes an object, and nesting is bounded. Unknown keywords are allowed, as the
//! specification allows them.

use serde_json::{Map, Value};

/// How deep subschemas may nest.
pub(crate) const MAX_SCHEMA_DEPTH: usize = 32;

const TYPES: &[&str] = &[
    "null", "boolean", "object", "array", "number", "string", "integer",
];

/// Keywords whose value is one subschema.
const SCHEMA_KEYWORDS: &[&str] = &[
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
];

/// Keywords whose value maps names to subschemas.
const SCHEMA_MAP_KEYWORDS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Keywords whose value is a non-empty array of subschemas.
const SCHEMA_LIST_KEYWORDS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];

/// Keywords whose value is a non-negative integer.
const COUNT_KEYWORDS: &[&str] = &[
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
];

/// Keywords whose value is a string.
const STRING_KEYWORDS: &[&str] = &[
    "$schema",
    "$id",
    "$ref",
    "$anchor",
    "$comment",
    "title",
    "description",
    "format",
    "pattern",
    "contentEncoding",
    "contentMediaType",
];

/// Checks that `schema` is a JSON Schema for an arguments object; the error names the
/// keyword's location, e.g. ``properties.path.type: `strin` is not a JSON Schema type``.
pub(crate) fn check_args_schema(schema: &Value) -> Result<(), String> {
    let Value::Object(root) = schema else {
        return Err("must be a JSON Schema object, like {\"type\": \"object\"}".into());
    };
    if let Some(ty) = root.get("type") {
        let object = match ty {
            Value::String(t) => t == "object",
            Value::Array(ts) => ts.iter().any(|t| t == "object"),
            _ => false,
        };
        if !object {
            return Err(format!(
                "type: the arguments are a JSON object, so the root schema's type must be \
                 \"object\", not {ty}"
            ));
        }
    }
    check_object(root, "", 0)
}

fn check_schema(schema: &Value, at: &str, depth: usize) -> Result<(), String> {
    match schema {
        Value::Bool(_) => Ok(()),
        Value::Object(map) => check_object(map, at, depth),
        other => Err(format!(
            "{}: a schema must be an object or a boolean, not {}",
            place(at),
            kind(other)
        )),
    }
}

fn check_object(map: &Map<String, Value>, at: &str, depth: usize) -> Result<(), String> {
    if depth >= MAX_SCHEMA_DEPTH {
        return Err(format!(
            "{}: subschemas nest deeper than {MAX_SCHEMA_DEPTH} levels",
            place(at)
        ));
    }
    for (key, value) in map {
        let here = if at.is_empty() {
            key.clone()
        } else {
            format!("{at}.{key}")
        };
        let bad = |expected: &str| Err(format!("{here}: must be {expected}, not {}", kind(value)));
        match key.as_str() {
            "type" => check_type(value, &here)?,
            k if SCHEMA_KEYWORDS.contains(&k) => check_schema(value, &here, depth + 1)?,
            k if SCHEMA_MAP_KEYWORDS.contains(&k) => {
                let Value::Object(entries) = value else {
                    return bad("an object of schemas");
                };
                for (name, sub) in entries {
                    check_schema(sub, &format!("{here}.{name}"), depth + 1)?;
                }
            }
            k if SCHEMA_LIST_KEYWORDS.contains(&k) => {
                let Value::Array(items) = value else {
                    return bad("a non-empty array of schemas");
                };
                if items.is_empty() {
                    return bad("a non-empty array of schemas");
                }
                for (i, sub) in items.iter().enumerate() {
                    check_schema(sub, &format!("{here}[{i}]"), depth + 1)?;
                }
            }
            "items" => match value {
                Value::Array(items) => {
                    for (i, sub) in items.iter().enumerate() {
                        check_schema(sub, &format!("{here}[{i}]"), depth + 1)?;
                    }
                }
                sub => check_schema(sub, &here, depth + 1)?,
            },
            _ => {
                if let Some((fits, expected)) = simple_keyword(key)
                    && !fits(value)
                {
                    return bad(expected);
                }
            }
        }
    }
    Ok(())
}

/// A check of a keyword's value, and what the value must be.
type ValueKind = (fn(&Value) -> bool, &'static str);

/// For a keyword whose value holds no subschema: a check of its value, and what it must be.
fn simple_keyword(key: &str) -> Option<ValueKind> {
    let kind: ValueKind = match key {
        "required" => (
            |v| v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
            "an array of property names",
        ),
        "enum" | "examples" => (Value::is_array, "an array"),
        "multipleOf" => (
            |v| v.as_f64().is_some_and(|n| n > 0.0),
            "a number greater than 0",
        ),
        "minimum" | "maximum" => (Value::is_number, "a number"),
        // A number from draft 6 on, a boolean in draft 4.
        "exclusiveMinimum" | "exclusiveMaximum" => {
            (|v| v.is_number() || v.is_boolean(), "a number")
        }
        "uniqueItems" | "readOnly" | "writeOnly" | "deprecated" => {
            (Value::is_boolean, "true or false")
        }
        "dependentRequired" => (
            |v| {
                v.as_object().is_some_and(|m| {
                    m.values()
                        .all(|v| v.as_array().is_some_and(|a| a.iter().all(Value::is_string)))
                })
            },
            "an object of arrays of property names",
        ),
        k if COUNT_KEYWORDS.contains(&k) => (|v| v.as_u64().is_some(), "a non-negative integer"),
        k if STRING_KEYWORDS.contains(&k) => (Value::is_string, "a string"),
        _ => return None,
    };
    Some(kind)
}

fn check_type(value: &Value, at: &str) -> Result<(), String> {
    let known = |t: &Value| t.as_str().is_some_and(|t| TYPES.contains(&t));
    let ok = match value {
        Value::String(_) => known(value),
        Value::Array(types) => !types.is_empty() && types.iter().all(known),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let shown: String = crate::text::echo_name(&value.to_string(), 64);
    Err(format!(
        "{at}: {shown} is not a JSON Schema type (expected one of {}, or an array of them)",
        TYPES.join(", ")
    ))
}

fn place(at: &str) -> &str {
    if at.is_empty() { "(root)" } else { at }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemas_of_the_vocabulary_pass() {
        for ok in [
            json!({}),
            json!({"type": "object"}),
            json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "title": "Args",
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "a path"},
                    "n": {"type": ["integer", "null"], "format": "uint64", "minimum": 0},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                    "any": true
                },
                "required": ["path"],
                "additionalProperties": false,
                "$defs": {"x": {"anyOf": [{"type": "string"}, {"const": 1}]}}
            }),
        ] {
            check_args_schema(&ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn misuse_of_a_keyword_is_named_with_its_place() {
        for (bad, expected) in [
            (json!([]), "must be a JSON Schema object"),
            (json!({"type": "string"}), "must be \"object\""),
            (
                json!({"properties": {"p": {"type": "strin"}}}),
                "properties.p.type",
            ),
            (
                json!({"properties": 3}),
                "properties: must be an object of schemas",
            ),
            (json!({"required": "path"}), "required: must be an array"),
            (
                json!({"properties": {"p": {"minLength": -1}}}),
                "properties.p.minLength",
            ),
            (json!({"anyOf": []}), "anyOf: must be a non-empty array"),
            (
                json!({"items": 5}),
                "items: a schema must be an object or a boolean",
            ),
        ] {
            let err = check_args_schema(&bad).unwrap_err();
            assert!(err.contains(expected), "{bad}: {err}");
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let mut schema = json!({"type": "string"});
        for _ in 0..MAX_SCHEMA_DEPTH + 1 {
            schema = json!({"properties": {"p": schema}});
        }
        let err = check_args_schema(&schema).unwrap_err();
        assert!(err.contains("nest deeper than 32"), "{err}");
    }
}
