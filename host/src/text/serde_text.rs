//! [`serde_as_text!`]: a type kept and sent as its text.

/// Implements serde's `Serialize` for each type as its `Display` text, and `Deserialize`
/// by reading that text back with `FromStr` (whose error becomes serde's), so an id or a
/// digest is one string in JSON and in the store, and a text that is not one is refused
/// with the type's own reason.
macro_rules! serde_as_text {
    ($($type:ty),* $(,)?) => {$(
        impl serde::Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}

pub(crate) use serde_as_text;
