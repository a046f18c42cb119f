//! The taskboard's WIT enums as text: [`TaskStatus`] and [`Priority`] read and write their
//! WIT names (`in-progress`, `urgent`), so a tool can take them straight from a model's
//! arguments (their JSON Schema lists the names) and return them in its answer.
//!
//! ```
//! use capstan_sdk::host::{Priority, TaskStatus};
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//!
//! /// A tool's arguments: the model is shown the five status names.
//! #[derive(Deserialize, JsonSchema)]
//! struct Args {
//!     status: Option<TaskStatus>,
//! }
//!
//! let args: Args = serde_json::from_str(r#"{"status": "in-progress"}"#).unwrap();
//! assert_eq!(args.status, Some(TaskStatus::InProgress));
//! assert_eq!("urgent".parse::<Priority>().unwrap(), Priority::Urgent);
//! let err = "asap".parse::<Priority>().unwrap_err();
//! assert_eq!(err.to_string(), "unknown priority `asap`; expected low, normal, high or urgent");
//! ```

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use crate::bindings::capstan::plugin::tasks::{Priority, TaskStatus};

/// A name that is none of an enum's: says which enum and lists the names it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    what: &'static str,
    name: String,
    expected: &'static str,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} `{}`; expected {}",
            self.what, self.name, self.expected
        )
    }
}

impl std::error::Error for UnknownName {}

/// Gives a WIT enum its names, `Display`, `FromStr`, serde and a JSON Schema listing the
/// names.
macro_rules! wit_enum_names {
    ($ty:ident, $what:literal, $expected:literal, [$($variant:ident => $name:literal),+ $(,)?]) => {
        impl $ty {
            /// Every value, in WIT order.
            pub const ALL: &[$ty] = &[$($ty::$variant),+];

            /// The WIT name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = UnknownName;

            fn from_str(name: &str) -> Result<Self, UnknownName> {
                $ty::ALL
                    .iter()
                    .copied()
                    .find(|value| value.as_str() == name)
                    .ok_or_else(|| UnknownName {
                        what: $what,
                        name: name.chars().take(64).collect(),
                        expected: $expected,
                    })
            }
        }

        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let name = Cow::<str>::deserialize(deserializer)?;
                name.parse().map_err(serde::de::Error::custom)
            }
        }

        impl JsonSchema for $ty {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> Cow<'static, str> {
                stringify!($ty).into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({ "type": "string", "enum": [$($name),+] })
            }
        }
    };
}

wit_enum_names!(TaskStatus, "task status", "backlog, ready, in-progress, done or cancelled", [
    Backlog => "backlog",
    Ready => "ready",
    InProgress => "in-progress",
    Done => "done",
    Cancelled => "cancelled",
]);

wit_enum_names!(Priority, "priority", "low, normal, high or urgent", [
    Low => "low",
    Normal => "normal",
    High => "high",
    Urgent => "urgent",
]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_named() {
        for status in TaskStatus::ALL {
            assert_eq!(status.as_str().parse::<TaskStatus>().unwrap(), *status);
            let json = serde_json::to_string(status).unwrap();
            assert_eq!(serde_json::from_str::<TaskStatus>(&json).unwrap(), *status);
        }
        assert_eq!(
            serde_json::to_string(&TaskStatus::InProgress).unwrap(),
            r#""in-progress""#
        );
        let err = serde_json::from_str::<Priority>(r#""asap""#).unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown priority `asap`; expected low, normal, high or urgent"),
            "{err}"
        );
        let schema = serde_json::to_value(schemars::schema_for!(Priority)).unwrap();
        assert_eq!(
            schema["enum"],
            serde_json::json!(["low", "normal", "high", "urgent"])
        );
    }
}
