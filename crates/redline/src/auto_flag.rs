//! A flag that takes a value or `auto` (`--batch-size auto`, `--lr auto`):
//! `auto` is settled by measurement before training, and the run folder's
//! `config.toml` records the value found, so a re-run or a resume does not
//! search again.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Auto<T> {
    /// Found by measurement.
    Auto,
    /// Given.
    Value(T),
}

impl<T: Copy> Auto<T> {
    /// The value, or `fallback` for `auto`.
    pub fn or(self, fallback: T) -> T {
        match self {
            Self::Auto => fallback,
            Self::Value(v) => v,
        }
    }

    /// Whether it is `auto`.
    pub fn is_auto(self) -> bool {
        matches!(self, Self::Auto)
    }
}

impl<T: FromStr> FromStr for Auto<T>
where
    T::Err: fmt::Display,
{
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto);
        }
        s.trim()
            .parse()
            .map(Self::Value)
            .map_err(|e| format!("{e} (give a number, or auto to find one by measurement)"))
    }
}

impl<T: fmt::Display> fmt::Display for Auto<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::Value(v) => v.fmt(f),
        }
    }
}

/// A number as itself, `auto` as the string: `config.toml` and a
/// checkpoint's identity keep the types they had before `auto` existed.
impl<T: Serialize> Serialize for Auto<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Auto => s.serialize_str("auto"),
            Self::Value(v) => v.serialize(s),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Auto<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either<T> {
            Value(T),
            Word(String),
        }
        match Either::<T>::deserialize(d)? {
            Either::Value(v) => Ok(Self::Value(v)),
            Either::Word(w) if w.eq_ignore_ascii_case("auto") => Ok(Self::Auto),
            Either::Word(w) => Err(serde::de::Error::custom(format!(
                "`{w}`: give a number or auto"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_serialises_as_the_plain_value() {
        assert_eq!("auto".parse::<Auto<usize>>(), Ok(Auto::Auto));
        assert_eq!("64".parse::<Auto<usize>>(), Ok(Auto::Value(64)));
        assert!("sixty".parse::<Auto<usize>>().is_err());
        assert_eq!(
            serde_json::to_value(Auto::Value(1e-3)).ok(),
            Some(serde_json::json!(1e-3))
        );
        assert_eq!(
            serde_json::to_value(Auto::<f64>::Auto).ok(),
            Some(serde_json::json!("auto"))
        );
        let back: Option<Auto<usize>> = serde_json::from_value(serde_json::json!(32)).ok();
        assert_eq!(back, Some(Auto::Value(32)));
    }
}
