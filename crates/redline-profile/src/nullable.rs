//! Tolerant reading of the run folder's JSON files.

use serde::{Deserialize, Deserializer};

/// Reads `null` as the type's default, so `"device": null` is `""`, not an error.
///
/// Used with `#[serde(default, deserialize_with = "nullable")]` on the fields of every
/// record a report reads back, so a file from an older or newer writer still loads.
pub fn nullable<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct R {
        #[serde(default, deserialize_with = "super::nullable")]
        n: u64,
    }

    #[test]
    fn null_and_missing_read_as_default() -> Result<(), serde_json::Error> {
        assert_eq!(serde_json::from_str::<R>(r#"{"n":null}"#)?.n, 0);
        assert_eq!(serde_json::from_str::<R>("{}")?.n, 0);
        assert_eq!(serde_json::from_str::<R>(r#"{"n":7}"#)?.n, 7);
        assert!(serde_json::from_str::<R>(r#"{"n":"x"}"#).is_err());
        Ok(())
    }
}
