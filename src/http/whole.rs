//! Whole numbers in JSON bodies. JSON Schema counts `225.0` as an integer, and so do
//! clients that only have floating-point numbers; serde alone would refuse it. A
//! fraction, a negative number or one past `u64::MAX` is still refused.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};

struct Whole;

/// 2^64 as f64: every integral f64 below it fits in a u64.
const TWO_TO_THE_64: f64 = 18_446_744_073_709_551_616.0;

impl Visitor<'_> for Whole {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a non-negative whole number")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        if v.fract() == 0.0 && (0.0..TWO_TO_THE_64).contains(&v) {
            Ok(v as u64)
        } else {
            Err(E::invalid_value(de::Unexpected::Float(v), &self))
        }
    }
}

struct MaybeWhole;

impl<'de> Visitor<'de> for MaybeWhole {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a non-negative whole number or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        u64(d).map(Some)
    }
}

pub(super) fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(Whole)
}

pub(super) fn usize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = u64(d)?;
    usize::try_from(n).map_err(|_| de::Error::invalid_value(de::Unexpected::Unsigned(n), &"a smaller number"))
}

pub(super) fn u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u64(d)?;
    u32::try_from(n).map_err(|_| de::Error::invalid_value(de::Unexpected::Unsigned(n), &"a smaller number"))
}

pub(super) fn option_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    d.deserialize_option(MaybeWhole)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct Sample {
        #[serde(deserialize_with = "super::u64")]
        n: u64,
        #[serde(default, deserialize_with = "super::option_u64")]
        m: Option<u64>,
    }

    fn parse(json: &str) -> Option<(u64, Option<u64>)> {
        serde_json::from_str::<Sample>(json).ok().map(|s| (s.n, s.m))
    }

    #[test]
    fn integral_floats_count_as_whole_numbers() {
        assert_eq!(parse(r#"{"n": 225}"#), Some((225, None)));
        assert_eq!(parse(r#"{"n": 225.0, "m": 1e3}"#), Some((225, Some(1000))));
        assert_eq!(parse(r#"{"n": 18446744073709551615, "m": null}"#), Some((u64::MAX, None)));
    }

    #[test]
    fn fractions_negatives_and_overflow_are_refused() {
        for bad in
            [r#"{"n": 1.5}"#, r#"{"n": -1}"#, r#"{"n": -0.5}"#, r#"{"n": 1.8446744073709552e19}"#, r#"{"n": "1"}"#]
        {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(parse(r#"{"n": 1, "m": 2.5}"#), None);
    }
}
