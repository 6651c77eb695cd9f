//! [`dumps`] and the [`Writer`] behind it: CPython's `json.dumps` output, byte for byte.

use super::{
    HIGHS, Int, JsonError, MAX_DEPTH, MAX_INT_DIGITS, ONES, Value, control_bytes, zero_bytes,
};

/// Writes `value` exactly as CPython's `json.dumps(value)` does (default arguments).
///
/// Fails for non-finite floats, integers of more than [`MAX_INT_DIGITS`] digits, and nesting deeper
/// than [`MAX_DEPTH`].
pub fn dumps(value: &Value) -> Result<String, JsonError> {
    let mut writer = Writer::strict();
    writer.value(value)?;
    Ok(writer.finish())
}

/// The byte-level encoder behind [`dumps`], usable to write a document piece by piece (the RunState
/// writer emits its top-level dict this way without building it first).
pub(crate) struct Writer {
    /// Only ASCII is ever written (`ensure_ascii`), so this is always valid UTF-8.
    out: Vec<u8>,
    /// When set, values [`dumps`] refuses are written the way CPython's `json.dumps` writes them
    /// (`NaN`, `Infinity`, `-Infinity`, integers in full) and values nested too deep become `null`.
    lenient: bool,
    depth: usize,
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// For each byte: 0 = copy as is, b'u' = `\u00XX`, other = the short escape letter.
/// Bytes >= 0x80 are marked 1: start (or continuation) of a non-ASCII character.
static ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        table[i] = b'u';
        i += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table[0x7f] = b'u';
    let mut i = 0x80;
    while i < 0x100 {
        table[i] = 1;
        i += 1;
    }
    table
};

impl Writer {
    /// A writer that fails where [`dumps`] fails.
    pub(crate) fn strict() -> Self {
        Writer {
            out: Vec::with_capacity(256),
            lenient: false,
            depth: 0,
        }
    }

    /// A writer that never fails (see the `lenient` field).
    pub(crate) fn lenient() -> Self {
        Writer {
            out: Vec::with_capacity(256),
            lenient: true,
            depth: 0,
        }
    }

    /// The text written so far.
    pub(crate) fn finish(self) -> String {
        // Everything written is ASCII; the lossy branch cannot be taken.
        String::from_utf8(self.out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// Appends raw, already-encoded JSON punctuation (must be ASCII).
    pub(crate) fn raw(&mut self, text: &str) {
        self.out.extend_from_slice(text.as_bytes());
    }

    /// Appends a JSON string literal.
    pub(crate) fn str(&mut self, s: &str) {
        write_str(&mut self.out, s);
    }

    /// Appends an unsigned integer.
    pub(crate) fn u64(&mut self, v: u64) {
        push_u64(&mut self.out, v);
    }

    /// Appends a value that sits inside `open` containers written with [`Writer::raw`] (so that the
    /// depth limit counts them, exactly as [`dumps`] of the whole document would).
    pub(crate) fn nested_value(&mut self, value: &Value, open: usize) -> Result<(), JsonError> {
        let saved = self.depth;
        self.depth = open;
        let result = self.value(value);
        self.depth = saved;
        result
    }

    /// Appends any value. Iterative (an explicit stack of open containers), so deep values cannot
    /// exhaust the thread's stack.
    pub(crate) fn value(&mut self, root: &Value) -> Result<(), JsonError> {
        enum Open<'v> {
            List(std::slice::Iter<'v, Value>),
            Dict(super::dict::Iter<'v>),
        }
        let mut stack: Vec<Open<'_>> = Vec::new();
        let mut current = root;
        loop {
            // Write `current`, or open it and continue with its first item.
            let mut next = None;
            match current {
                Value::List(items) if !items.is_empty() => {
                    if self.enter(stack.len())? {
                        self.out.push(b'[');
                        let mut iter = items.iter();
                        next = iter.next();
                        stack.push(Open::List(iter));
                    }
                }
                Value::Dict(dict) if !dict.is_empty() => {
                    if self.enter(stack.len())? {
                        self.out.push(b'{');
                        let mut iter = dict.iter();
                        if let Some((k, v)) = iter.next() {
                            write_str(&mut self.out, k);
                            self.out.extend_from_slice(b": ");
                            next = Some(v);
                        }
                        stack.push(Open::Dict(iter));
                    }
                }
                scalar => self.scalar(scalar)?,
            }
            // Move on to the next item, closing every container that ends here.
            while next.is_none() {
                match stack.last_mut() {
                    None => return Ok(()),
                    Some(Open::List(iter)) => match iter.next() {
                        Some(item) => {
                            self.out.extend_from_slice(b", ");
                            next = Some(item);
                        }
                        None => {
                            self.out.push(b']');
                            stack.pop();
                        }
                    },
                    Some(Open::Dict(iter)) => match iter.next() {
                        Some((k, v)) => {
                            self.out.extend_from_slice(b", ");
                            write_str(&mut self.out, k);
                            self.out.extend_from_slice(b": ");
                            next = Some(v);
                        }
                        None => {
                            self.out.push(b'}');
                            stack.pop();
                        }
                    },
                }
            }
            if let Some(item) = next {
                current = item;
            }
        }
    }

    /// Appends a value that is not a non-empty list or dict.
    fn scalar(&mut self, value: &Value) -> Result<(), JsonError> {
        match value {
            Value::Null => self.out.extend_from_slice(b"null"),
            Value::Bool(true) => self.out.extend_from_slice(b"true"),
            Value::Bool(false) => self.out.extend_from_slice(b"false"),
            Value::Int(Int::Small(v)) => {
                if *v < 0 {
                    self.out.push(b'-');
                }
                push_u64(&mut self.out, v.unsigned_abs());
            }
            Value::Int(Int::Big(b)) => {
                let text = b.to_string();
                let digits = text.len() - usize::from(text.starts_with('-'));
                if digits > MAX_INT_DIGITS && !self.lenient {
                    return Err(JsonError::IntTooLong { digits });
                }
                self.out.extend_from_slice(text.as_bytes());
            }
            Value::Float(f) => {
                if f.is_finite() {
                    write_float(&mut self.out, *f);
                } else if self.lenient {
                    self.out.extend_from_slice(if f.is_nan() {
                        b"NaN"
                    } else if *f > 0.0 {
                        b"Infinity"
                    } else {
                        b"-Infinity"
                    });
                } else {
                    return Err(JsonError::NonFiniteFloat { value: *f });
                }
            }
            Value::Str(s) => write_str(&mut self.out, s),
            Value::List(_) => self.out.extend_from_slice(b"[]"),
            Value::Dict(_) => self.out.extend_from_slice(b"{}"),
        }
        Ok(())
    }

    /// Checks that one more container fits inside the `open` ones. `Ok(false)`: it does not, and the
    /// lenient writer wrote `null` instead.
    fn enter(&mut self, open: usize) -> Result<bool, JsonError> {
        if self.depth + open >= MAX_DEPTH {
            if self.lenient {
                self.out.extend_from_slice(b"null");
                return Ok(false);
            }
            return Err(JsonError::TooDeep);
        }
        Ok(true)
    }
}

/// Appends `s` as a JSON string literal with CPython's `ensure_ascii=True` escaping.
fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut i = 0;
    loop {
        i = copy_ascii_plain(bytes, i, out);
        // Escape everything up to the next byte that is copied as is (runs of non-ASCII
        // characters, such as a CJK word or an emoji, stay in this loop).
        loop {
            let Some(&byte) = bytes.get(i) else {
                out.push(b'"');
                return;
            };
            if byte >= 0x80 {
                // Non-ASCII: decode one UTF-8 sequence (the input is valid UTF-8).
                let (cp, len) = decode_utf8(&bytes[i..]);
                if cp >= 0x1_0000 {
                    let v = cp - 0x1_0000;
                    let high = u_escape(0xD800 | (v >> 10));
                    let low = u_escape(0xDC00 | (v & 0x3FF));
                    out.extend_from_slice(&[
                        high[0], high[1], high[2], high[3], high[4], high[5], low[0], low[1],
                        low[2], low[3], low[4], low[5],
                    ]);
                } else {
                    out.extend_from_slice(&u_escape(cp));
                }
                i += len;
            } else {
                match ESCAPE[usize::from(byte)] {
                    0 => break,
                    b'u' => out.extend_from_slice(&u_escape(u32::from(byte))),
                    short => out.extend_from_slice(&[b'\\', short]),
                }
                i += 1;
            }
        }
    }
}

/// The first index from `i` of a byte that `ensure_ascii` escapes (`"`, `\`, controls, DEL,
/// non-ASCII), or the end; the bytes before it are appended to `out`. Eight bytes at a time, each
/// word copied whole (a fixed-size copy rather than a call to `memcpy` per short run), the last one
/// cut back to the run's end.
#[inline]
fn copy_ascii_plain(b: &[u8], mut i: usize, out: &mut Vec<u8>) -> usize {
    while let Some(Ok(word)) = b.get(i..i + 8).map(<[u8; 8]>::try_from) {
        let w = u64::from_le_bytes(word);
        let hits = zero_bytes(w ^ (ONES * u64::from(b'"')))
            | zero_bytes(w ^ (ONES * u64::from(b'\\')))
            | zero_bytes(w ^ (ONES * 0x7f))
            | control_bytes(w)
            | (w & HIGHS);
        out.extend_from_slice(&word);
        if hits != 0 {
            let run = (hits.trailing_zeros() / 8) as usize;
            out.truncate(out.len() - 8 + run);
            return i + run;
        }
        i += 8;
    }
    // The last few bytes: find the run's end, then copy it at once.
    let start = i;
    while let Some(&c) = b.get(i) {
        if ESCAPE[usize::from(c)] != 0 {
            break;
        }
        i += 1;
    }
    out.extend_from_slice(&b[start..i]);
    i
}

/// Decodes the UTF-8 sequence at the start of `b` (known to be valid, non-ASCII).
#[inline]
fn decode_utf8(b: &[u8]) -> (u32, usize) {
    let byte = |k: usize| u32::from(b.get(k).copied().unwrap_or(0x80) & 0x3F);
    let b0 = u32::from(b[0]);
    if b0 < 0xE0 {
        (((b0 & 0x1F) << 6) | byte(1), 2)
    } else if b0 < 0xF0 {
        (((b0 & 0x0F) << 12) | (byte(1) << 6) | byte(2), 3)
    } else {
        (
            ((b0 & 0x07) << 18) | (byte(1) << 12) | (byte(2) << 6) | byte(3),
            4,
        )
    }
}

/// `\uXXXX` (lowercase hex digits, as CPython writes them) for a UTF-16 code unit.
#[inline]
fn u_escape(unit: u32) -> [u8; 6] {
    let hex = |shift: u32| HEX[((unit >> shift) & 0xF) as usize];
    [b'\\', b'u', hex(12), hex(8), hex(4), hex(0)]
}

/// Appends the decimal digits of `v`.
#[inline]
fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[at..]);
}

/// Appends a finite float the way Python's `repr(float)` writes it.
fn write_float(out: &mut Vec<u8>, f: f64) {
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(f);
    // Split ryu's output into sign, significant digits and decimal point position `decpt`
    // (value = 0.DIGITS * 10^decpt), then lay it out with Python's rules.
    let bytes = text.as_bytes();
    let (negative, rest) = match bytes.first() {
        Some(b'-') => (true, &bytes[1..]),
        _ => (false, bytes),
    };
    let (mantissa, exponent) = match rest.iter().position(|&b| b == b'e' || b == b'E') {
        Some(p) => (&rest[..p], parse_exponent(&rest[p + 1..])),
        None => (rest, 0),
    };
    let mut digits = [0u8; 40];
    let mut n = 0usize;
    let mut int_len = 0i32;
    let mut seen_dot = false;
    for &b in mantissa {
        if b == b'.' {
            seen_dot = true;
        } else if n < digits.len() {
            digits[n] = b;
            n += 1;
            if !seen_dot {
                int_len += 1;
            }
        }
    }
    let lead = digits[..n].iter().take_while(|&&d| d == b'0').count();
    let digits_all = &digits[lead..n];
    let trail = digits_all.iter().rev().take_while(|&&d| d == b'0').count();
    let sig = &digits_all[..digits_all.len() - trail];
    if negative {
        out.push(b'-');
    }
    let Some((&first, more)) = sig.split_first() else {
        out.extend_from_slice(b"0.0");
        return;
    };
    let decpt = int_len + exponent - lead as i32;
    let len = sig.len() as i32;
    if decpt <= -4 || decpt > 16 {
        out.push(first);
        if !more.is_empty() {
            out.push(b'.');
            out.extend_from_slice(more);
        }
        let e = decpt - 1;
        out.extend_from_slice(if e < 0 { b"e-" } else { b"e+" });
        if e.unsigned_abs() < 10 {
            out.push(b'0');
        }
        push_u64(out, u64::from(e.unsigned_abs()));
    } else if decpt <= 0 {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + decpt.unsigned_abs() as usize, b'0');
        out.extend_from_slice(sig);
    } else if decpt < len {
        out.extend_from_slice(&sig[..decpt as usize]);
        out.push(b'.');
        out.extend_from_slice(&sig[decpt as usize..]);
    } else {
        out.extend_from_slice(sig);
        out.resize(out.len() + (decpt - len) as usize, b'0');
        out.extend_from_slice(b".0");
    }
}

fn parse_exponent(b: &[u8]) -> i32 {
    let (neg, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    let mut v = 0i32;
    for &d in digits {
        v = v * 10 + i32::from(d - b'0');
    }
    if neg { -v } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float_repr(f: f64) -> String {
        let mut out = Vec::new();
        write_float(&mut out, f);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn float_repr_follows_python_rules() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789.123, "123456789.123"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-2.5, "-2.5"),
            (1e22, "1e+22"),
            (9007199254740993.0, "9007199254740992.0"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(*f), *want, "repr of {f:e}");
        }
    }
}
