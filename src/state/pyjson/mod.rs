//! JSON exactly as CPython's `json` module reads and writes it.
//!
//! [`loads`] behaves like `json.loads(text)` and [`dumps`] produces the very bytes `json.dumps(value)`
//! produces (default arguments: `ensure_ascii=True`, separators `", "` and `": "`, keys in insertion
//! order). The value model, [`Value`], mirrors what Python builds: `dict`s keep key order, integers are
//! unbounded ([`Int`]) and floats are `f64`.
//!
//! Deliberate differences from CPython, all of them refusals of input that CPython would accept:
//!
//! * `NaN`, `Infinity` and `-Infinity` are rejected by [`loads`] (CPython accepts them by default) and
//!   non-finite floats are rejected by [`dumps`] (CPython writes `NaN`/`Infinity`, which is not JSON).
//! * A number literal too large for a float (`1e400`) is rejected instead of becoming `inf`.
//! * A `\uXXXX` escape of a lone UTF-16 surrogate is rejected: a Rust [`String`] cannot hold it.
//! * Integers of more than 4300 digits are rejected on both sides, like CPython 3.11+ does by default
//!   (`sys.get_int_max_str_digits()`).
//! * Lists and dicts may be nested at most [`MAX_DEPTH`] levels deep (CPython's default recursion limit
//!   stops at a similar depth).
//!
//! Both directions are hand-written for speed and exactness: the parser follows CPython's `_json.c`
//! scanner (same grammar, same error messages and positions) and scans strings eight bytes at a time;
//! the writer scans for bytes to escape the same way and uses [`ryu`] for the shortest round-trip
//! float digits, re-formatted to Python's `float.__repr__` rules. Both are iterative, so deeply
//! nested input cannot overflow the stack.
//!
//! Files: `value` (the value model), `dict` ([`Dict`]), `reader` ([`loads`]), `writer`
//! ([`dumps`]) and `interop` (serde and `serde_json`).

mod dict;
mod interop;
mod reader;
mod value;
mod writer;

/// The type of a [`Dict`]'s keys: a string stored inline up to 24 bytes.
pub use compact_str::CompactString;
pub use dict::Dict;
pub use reader::loads;
pub use value::{Int, Value};
pub(crate) use writer::Writer;
pub use writer::dumps;

/// The deepest nesting of lists and dicts that [`loads`] accepts and [`dumps`] writes.
pub const MAX_DEPTH: usize = 1000;

/// The most decimal digits an integer may have, as in CPython's default `int_max_str_digits`.
pub const MAX_INT_DIGITS: usize = 4300;

/// Errors of [`loads`], [`dumps`] and the conversions to other JSON models.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JsonError {
    /// The text is not JSON that this module accepts. `line` and `column` are 1-based; the column
    /// counts characters (not bytes), like CPython's `json.JSONDecodeError`.
    #[error("invalid JSON at line {line} column {column}: {message}")]
    Syntax {
        /// 1-based line of the offending character.
        line: usize,
        /// 1-based column (in characters) of the offending character.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A float that is NaN or infinite cannot be written as JSON.
    #[error("cannot write the non-finite float {value} as JSON")]
    NonFiniteFloat {
        /// The offending value.
        value: f64,
    },
    /// An integer with more than [`MAX_INT_DIGITS`] digits (CPython refuses to convert it to text).
    #[error("cannot write an integer of {digits} digits as JSON (the limit is {MAX_INT_DIGITS})")]
    IntTooLong {
        /// Number of decimal digits.
        digits: usize,
    },
    /// Lists/dicts nested deeper than [`MAX_DEPTH`].
    #[error("cannot write a value nested more than {MAX_DEPTH} levels deep as JSON")]
    TooDeep,
    /// The value has no equivalent in the target model (e.g. `serde_json::Value`).
    #[error("cannot convert {what}")]
    NotRepresentable {
        /// What could not be converted, and why.
        what: String,
    },
}

// Both directions scan text eight bytes at a time (SWAR: one `u64` holds eight bytes).

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Bit 7 of each byte of the result is set where the byte of `w` is zero (exact for the lowest
/// such byte, which is all the callers use).
#[inline]
fn zero_bytes(w: u64) -> u64 {
    w.wrapping_sub(ONES) & !w & HIGHS
}

/// Bit 7 set where the byte of `w` is below 0x20 (exact for the lowest such byte).
#[inline]
fn control_bytes(w: u64) -> u64 {
    w.wrapping_sub(ONES * 0x20) & !w & HIGHS
}

#[cfg(test)]
mod tests {
    use num_bigint::BigInt;

    use super::*;

    #[test]
    fn strings_are_escaped_like_ensure_ascii() {
        let v = Value::from("a\"b\\c\n\r\t\u{8}\u{c}\u{0}\u{1f}\u{7f}é€😀");
        assert_eq!(
            dumps(&v).unwrap(),
            r#""a\"b\\c\n\r\t\b\f\u0000\u001f\u007f\u00e9\u20ac\ud83d\ude00""#
        );
    }

    #[test]
    fn separators_and_order() {
        let v = loads(r#"{"b": [1, 2.5, null, true, false], "a": {}, "c": []}"#).unwrap();
        assert_eq!(
            dumps(&v).unwrap(),
            r#"{"b": [1, 2.5, null, true, false], "a": {}, "c": []}"#
        );
    }

    #[test]
    fn duplicate_keys_keep_first_position_last_value() {
        let v = loads(r#"{"a": 1, "b": 2, "a": 3}"#).unwrap();
        assert_eq!(dumps(&v).unwrap(), r#"{"a": 3, "b": 2}"#);
    }

    #[test]
    fn big_ints_round_trip() {
        let text = "[1180591620717411303424, -1267650600228229401496703205376, 9223372036854775807, -9223372036854775808, 9223372036854775808]";
        let v = loads(text).unwrap();
        assert!(matches!(v.get_index(0), Some(Value::Int(Int::Big(_)))));
        assert!(matches!(
            v.get_index(2),
            Some(Value::Int(Int::Small(i64::MAX)))
        ));
        assert_eq!(dumps(&v).unwrap(), text);
    }

    #[test]
    fn rejects_non_finite_and_out_of_range() {
        for (text, needle) in [
            ("NaN", "NaN"),
            ("[Infinity]", "Infinity"),
            ("[1, -Infinity]", "-Infinity"),
            ("1e400", "out of range"),
            ("-1e400", "out of range"),
        ] {
            let err = loads(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
        assert_eq!(
            loads("1e-400").unwrap(),
            Value::Float(0.0),
            "underflow is fine, as in Python"
        );
        assert!(matches!(
            dumps(&Value::Float(f64::NAN)),
            Err(JsonError::NonFiniteFloat { .. })
        ));
    }

    #[test]
    fn errors_carry_line_and_character_column() {
        let err = loads("{\n  \"é\": [1,\n  2,, 3]\n}").unwrap_err();
        match err {
            JsonError::Syntax { line, column, .. } => {
                assert_eq!((line, column), (3, 5));
            }
            other => panic!("unexpected {other:?}"),
        }
        let err = loads("[\"éé\" x]").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid JSON at line 1 column 7:"),
            "{err}"
        );
    }

    #[test]
    fn rejects_lone_surrogates_bom_and_garbage() {
        for text in [
            r#""\ud800""#,
            r#""\udc00x""#,
            "\u{feff}{}",
            "",
            "   ",
            "01",
            "1.",
            ".5",
            "+1",
            "[1,]",
            "{\"a\" 1}",
            "{1: 2}",
            "[1] x",
            "tru",
            "\"a\u{1}\"",
            "'a'",
            "-",
            "-x",
            "nul",
        ] {
            assert!(loads(text).is_err(), "{text:?} should be rejected");
        }
        // A valid surrogate pair is fine.
        assert_eq!(loads(r#""\ud83d\ude00""#).unwrap(), Value::from("😀"));
    }

    #[test]
    fn depth_limit() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        let v = loads(&ok).unwrap();
        assert_eq!(dumps(&v).unwrap(), ok);
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(loads(&deep).unwrap_err().to_string().contains("nested"));
        // Empty containers are written without counting (like CPython), so nest a non-empty one.
        let mut v = Value::List(vec![Value::Null]);
        for _ in 0..MAX_DEPTH {
            v = Value::List(vec![v]);
        }
        assert_eq!(dumps(&v), Err(JsonError::TooDeep));
    }

    #[test]
    fn int_digit_limit() {
        let ok = "7".repeat(MAX_INT_DIGITS);
        assert_eq!(dumps(&loads(&ok).unwrap()).unwrap(), ok);
        let long = "7".repeat(MAX_INT_DIGITS + 1);
        assert!(loads(&long).unwrap_err().to_string().contains("digits"));
        let big: BigInt = long.parse().unwrap();
        assert!(matches!(
            dumps(&Value::from(big)),
            Err(JsonError::IntTooLong { digits }) if digits == MAX_INT_DIGITS + 1
        ));
    }

    #[test]
    fn int_equality_is_numeric() {
        assert_eq!(Int::Big(BigInt::from(5)), Int::Small(5));
        assert_ne!(Int::Big(BigInt::from(6)), Int::Small(5));
        assert_eq!(Int::from(u64::MAX).to_u64(), Some(u64::MAX));
    }

    #[test]
    fn serde_interop() {
        let v = loads(
            r#"{"z": 1, "a": [1.5, "x", null], "big": 170141183460469231731687303715884105727}"#,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"z":1,"a":[1.5,"x",null],"big":170141183460469231731687303715884105727}"#
        );
        let huge = Value::from("1".repeat(50).parse::<BigInt>().unwrap());
        let err = serde_json::to_string(&huge).unwrap_err().to_string();
        assert!(err.contains("does not fit in 128 bits"), "{err}");
        assert!(serde_json::to_string(&Value::Float(f64::INFINITY)).is_err());

        let sj: serde_json::Value =
            serde_json::from_str(r#"{"b": 2, "a": [18446744073709551615, -1, 0.5]}"#).unwrap();
        let ours = Value::from(sj.clone());
        assert_eq!(
            ours.get("a")
                .and_then(|a| a.get_index(0))
                .and_then(Value::as_u64),
            Some(u64::MAX)
        );
        assert_eq!(serde_json::Value::try_from(&ours).unwrap(), sj);
        assert!(serde_json::Value::try_from(&huge).is_err());
    }
}
