//! [`loads`]: a parser following CPython's `_json.c` scanner.

use compact_str::CompactString;
use num_bigint::BigInt;

use super::{
    Dict, Int, JsonError, MAX_DEPTH, MAX_INT_DIGITS, ONES, Value, control_bytes, zero_bytes,
};

/// A parse failure at a byte offset, before the offset is turned into line/column.
struct Fail {
    index: usize,
    message: String,
}

fn fail(index: usize, message: impl Into<String>) -> Fail {
    Fail {
        index,
        message: message.into(),
    }
}

/// Parses JSON text like CPython's `json.loads(text)`.
///
/// Duplicate keys keep the last value at the first key's position (as assigning into a Python dict
/// does). Errors carry CPython's message and position (`Expecting ',' delimiter` at line 3
/// column 7, ...). Additionally rejected (see the module docs): `NaN`/`Infinity`, float literals
/// out of the `f64` range (`1e400`), lone-surrogate escapes, integers of more than
/// [`MAX_INT_DIGITS`] digits and nesting deeper than [`MAX_DEPTH`].
pub fn loads(text: &str) -> Result<Value, JsonError> {
    if text.starts_with('\u{feff}') {
        return Err(syntax_error(
            text,
            0,
            "Unexpected UTF-8 BOM (decode using utf-8-sig)".to_owned(),
        ));
    }
    let mut parser = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        refusal: None,
        items: Vec::new(),
        entries: Vec::new(),
        scratch: String::new(),
    };
    let result = parser.document().and_then(|value| {
        parser.skip_ws();
        if parser.pos != parser.bytes.len() {
            Err(fail(parser.pos, "Extra data"))
        } else if let Some(refusal) = parser.refusal.take() {
            Err(refusal)
        } else {
            Ok(value)
        }
    });
    result.map_err(|f| syntax_error(text, f.index, f.message))
}

/// An open container while parsing. Its items so far sit at the end of the parser's shared
/// `items`/`entries` stacks from `start` on, so each container is allocated once, at its exact size,
/// when it closes. An open dict's last entry holds the key being read and a placeholder value until
/// that value is complete.
#[derive(Clone, Copy)]
enum Open {
    List { start: usize },
    Dict { start: usize },
}

/// A recursive-descent parser following CPython's `_json.c` scanner (same grammar, same error
/// messages and positions), made iterative so that nesting cannot exhaust the thread's stack.
struct Parser<'t> {
    text: &'t str,
    bytes: &'t [u8],
    pos: usize,
    /// The first construct CPython accepts but we refuse (`NaN`, `1e400`, a lone surrogate). Parsing
    /// carries on like CPython, so that an error later in the text is reported exactly as CPython
    /// reports it; the refusal is reported if the text is otherwise valid.
    refusal: Option<Fail>,
    /// Items of the open lists, innermost last.
    items: Vec<Value>,
    /// Entries of the open dicts, innermost last.
    entries: Vec<(CompactString, Value)>,
    /// Reused buffer for decoding strings with escapes.
    scratch: String,
}

impl Parser<'_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    #[inline]
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Records a refusal (only the first one is kept).
    fn refuse(&mut self, index: usize, message: String) {
        self.refusal.get_or_insert(Fail { index, message });
    }

    /// Reads one value (after leading whitespace).
    fn document(&mut self) -> Result<Value, Fail> {
        let mut stack: Vec<Open> = Vec::new();
        self.skip_ws();
        'value: loop {
            // At the start of a value: read a complete value, or open a non-empty container and go
            // on with its first value.
            let mut value = match self.peek() {
                Some(b'[') => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(too_deep(self.pos));
                    }
                    self.pos += 1;
                    self.skip_ws();
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                        Value::List(Vec::new())
                    } else {
                        stack.push(Open::List {
                            start: self.items.len(),
                        });
                        continue 'value;
                    }
                }
                Some(b'{') => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(too_deep(self.pos));
                    }
                    self.pos += 1;
                    self.skip_ws();
                    if self.peek() == Some(b'}') {
                        self.pos += 1;
                        Value::Dict(Dict::default())
                    } else {
                        let start = self.entries.len();
                        let key = self.key()?;
                        self.entries.push((key, Value::Null));
                        stack.push(Open::Dict { start });
                        continue 'value;
                    }
                }
                _ => self.scalar()?,
            };
            // Hand the complete value to its container, closing every container that ends here.
            // The innermost container stays on the stack (no pop and push per item) until it closes.
            loop {
                let Some(&open) = stack.last() else {
                    return Ok(value);
                };
                self.skip_ws();
                match open {
                    Open::List { start } => {
                        self.items.push(value);
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                self.skip_ws();
                                continue 'value;
                            }
                            Some(b']') => {
                                self.pos += 1;
                                stack.pop();
                                value = Value::List(self.items.drain(start..).collect());
                            }
                            _ => return Err(fail(self.pos, "Expecting ',' delimiter")),
                        }
                    }
                    Open::Dict { start } => {
                        if let Some(entry) = self.entries.last_mut() {
                            entry.1 = value;
                        }
                        match self.peek() {
                            Some(b',') => {
                                self.pos += 1;
                                self.skip_ws();
                                let key = self.key()?;
                                self.entries.push((key, Value::Null));
                                continue 'value;
                            }
                            Some(b'}') => {
                                self.pos += 1;
                                stack.pop();
                                value =
                                    Value::Dict(Dict::from_entries(self.entries.drain(start..)));
                            }
                            _ => return Err(fail(self.pos, "Expecting ',' delimiter")),
                        }
                    }
                }
            }
        }
    }

    /// Reads `"key" :` and the whitespace after it.
    fn key(&mut self) -> Result<CompactString, Fail> {
        if self.peek() != Some(b'"') {
            return Err(fail(
                self.pos,
                "Expecting property name enclosed in double quotes",
            ));
        }
        let key = self.string(|s| CompactString::from(s))?;
        self.skip_ws();
        if self.peek() != Some(b':') {
            return Err(fail(self.pos, "Expecting ':' delimiter"));
        }
        self.pos += 1;
        self.skip_ws();
        Ok(key)
    }

    /// Reads a string, a literal or a number.
    fn scalar(&mut self) -> Result<Value, Fail> {
        let rest = &self.bytes[self.pos..];
        let literal =
            |word: &[u8], value: Value| rest.starts_with(word).then_some((word.len(), value));
        let found = match rest.first() {
            None => return Err(fail(self.pos, "Expecting value")),
            Some(b'"') => return self.string(str::to_owned).map(Value::Str),
            Some(b'n') => literal(b"null", Value::Null),
            Some(b't') => literal(b"true", Value::Bool(true)),
            Some(b'f') => literal(b"false", Value::Bool(false)),
            _ => None,
        };
        if let Some((len, value)) = found {
            self.pos += len;
            return Ok(value);
        }
        for (word, value) in [
            ("NaN", f64::NAN),
            ("Infinity", f64::INFINITY),
            ("-Infinity", f64::NEG_INFINITY),
        ] {
            if rest.starts_with(word.as_bytes()) {
                self.refuse(
                    self.pos,
                    format!("`{word}` is not valid JSON (non-finite numbers are rejected)"),
                );
                self.pos += word.len();
                return Ok(Value::Float(value));
            }
        }
        self.number()
    }

    /// Reads a number with CPython's rules: `-?(0|[1-9][0-9]*)`, then a fraction only when a digit
    /// follows the `.`, then an exponent only when it has digits (otherwise the number ends before
    /// the `.`/`e`, and the caller reports what follows).
    fn number(&mut self) -> Result<Value, Fail> {
        let b = self.bytes;
        let start = self.pos;
        let mut i = start;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        let digits_start = i;
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while b.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
            }
            _ => return Err(fail(start, "Expecting value")),
        }
        let int_end = i;
        let mut is_float = false;
        if b.get(i) == Some(&b'.') && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            is_float = true;
            i += 2;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
        }
        if let Some(b'e' | b'E') = b.get(i) {
            let mut j = i + 1;
            if let Some(b'+' | b'-') = b.get(j) {
                j += 1;
            }
            let exp_digits = j;
            while b.get(j).is_some_and(u8::is_ascii_digit) {
                j += 1;
            }
            if j > exp_digits {
                is_float = true;
                i = j;
            }
        }
        self.pos = i;
        let literal = &self.text[start..i];
        if is_float {
            return match literal.parse::<f64>() {
                Ok(f) => {
                    if !f.is_finite() {
                        self.refuse(
                            start,
                            format!("number `{literal}` is out of range for a float"),
                        );
                    }
                    Ok(Value::Float(f))
                }
                Err(e) => Err(fail(start, format!("invalid number `{literal}`: {e}"))),
            };
        }
        let digits = int_end - digits_start;
        if digits <= 18 {
            let mut v: i64 = 0;
            for &d in &b[digits_start..int_end] {
                v = v * 10 + i64::from(d - b'0');
            }
            return Ok(Value::Int(Int::Small(if digits_start > start {
                -v
            } else {
                v
            })));
        }
        if digits > MAX_INT_DIGITS {
            return Err(fail(
                start,
                format!(
                    "integer of {digits} digits exceeds the limit of {MAX_INT_DIGITS} digits \
                     (as CPython's int_max_str_digits)"
                ),
            ));
        }
        literal
            .parse::<BigInt>()
            .map(|big| Value::Int(Int::from_bigint(big)))
            .map_err(|e| fail(start, format!("invalid integer `{literal}`: {e}")))
    }

    /// Reads a string literal starting at the opening quote; `make` turns its decoded text into
    /// the string type wanted (a value's `String`, a key's inline `CompactString`).
    fn string<S>(&mut self, make: impl FnOnce(&str) -> S) -> Result<S, Fail> {
        let b = self.bytes;
        let begin = self.pos;
        let start = begin + 1;
        let mut i = scan_string_plain(b, start);
        if b.get(i) == Some(&b'"') {
            // No escapes: one allocation, one copy.
            self.pos = i + 1;
            return Ok(make(&self.text[start..i]));
        }
        // Decode into the reusable scratch buffer, then copy once into an exact-size string. Runs
        // end at ASCII bytes, so they are slices of the text at character boundaries: nothing is
        // validated again (a byte buffer would have to be, which costs more than it saves).
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        out.push_str(&self.text[start..i]);
        let result = loop {
            match b.get(i) {
                None => break Err(fail(begin, "Unterminated string starting at")),
                Some(b'"') => {
                    self.pos = i + 1;
                    break Ok(make(out.as_str()));
                }
                Some(b'\\') => {
                    // The common escapes inline; surrogates, refusals and errors in `escape`.
                    if quick_escape(b, i, &mut out) {
                        i += if b[i + 1] == b'u' { 6 } else { 2 };
                    } else {
                        match self.escape(i, begin, &mut out) {
                            Ok(next) => i = next,
                            Err(e) => break Err(e),
                        }
                    }
                }
                Some(_) => break Err(fail(i, "Invalid control character at")),
            }
            let run = i;
            i = scan_string_plain(b, i);
            out.push_str(&self.text[run..i]);
        };
        self.scratch = out;
        result
    }

    /// Decodes the escape whose backslash is at `at` into `out`; returns the index after it.
    fn escape(&mut self, at: usize, begin: usize, out: &mut String) -> Result<usize, Fail> {
        let b = self.bytes;
        let Some(&kind) = b.get(at + 1) else {
            return Err(fail(begin, "Unterminated string starting at"));
        };
        let simple = match kind {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                // CPython wants at least one character after the 4 hex digits (`end >= len`).
                let u_at = at + 1;
                if u_at + 5 >= b.len() {
                    return Err(fail(u_at, "Invalid \\uXXXX escape"));
                }
                let unit = hex4(&b[u_at + 1..u_at + 5])
                    .ok_or_else(|| fail(u_at, "Invalid \\uXXXX escape"))?;
                let mut next = u_at + 5;
                let mut code = unit;
                if (0xD800..0xDC00).contains(&unit)
                    && next + 6 < b.len()
                    && b[next] == b'\\'
                    && b[next + 1] == b'u'
                {
                    // A high surrogate: CPython joins it with a following `\uDC00`-`\uDFFF` escape
                    // (and otherwise reads that escape on its own).
                    let low = hex4(&b[next + 2..next + 6])
                        .ok_or_else(|| fail(next + 1, "Invalid \\uXXXX escape"))?;
                    if (0xDC00..0xE000).contains(&low) {
                        next += 6;
                        code = 0x1_0000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                    }
                }
                let c = char::from_u32(code).unwrap_or_else(|| {
                    // A lone surrogate: CPython keeps it; a Rust string cannot.
                    self.refuse(at, LONE_SURROGATE.to_owned());
                    char::REPLACEMENT_CHARACTER
                });
                out.push(c);
                return Ok(next);
            }
            _ => return Err(fail(at, "Invalid \\escape")),
        };
        out.push(simple);
        Ok(at + 2)
    }
}

/// The value of each hex digit, 0xFF for other bytes.
static HEX_VALUE: [u8; 256] = {
    let mut table = [0xFFu8; 256];
    let mut d = 0;
    while d < 10 {
        table[b'0' as usize + d] = d as u8;
        d += 1;
    }
    let mut d = 0;
    while d < 6 {
        table[b'a' as usize + d] = 10 + d as u8;
        table[b'A' as usize + d] = 10 + d as u8;
        d += 1;
    }
    table
};

/// The value of 4 hex digits.
#[inline]
fn hex4(digits: &[u8]) -> Option<u32> {
    let [a, b, c, d] = <[u8; 4]>::try_from(digits).ok()?;
    let (a, b, c, d) = (
        HEX_VALUE[usize::from(a)],
        HEX_VALUE[usize::from(b)],
        HEX_VALUE[usize::from(c)],
        HEX_VALUE[usize::from(d)],
    );
    ((a | b | c | d) & 0xF0 == 0)
        .then(|| u32::from(a) << 12 | u32::from(b) << 8 | u32::from(c) << 4 | u32::from(d))
}

/// Decodes the escape whose backslash is at `at` into `out` when it is a short escape, or a
/// `\uXXXX` escape of a character outside the surrogate range (which CPython reads on its own):
/// 2 or 6 bytes long. `false` (and nothing appended) for anything else (surrogates, invalid or
/// unterminated escapes), which [`Parser::escape`] handles with CPython's exact rules and
/// messages.
#[inline]
fn quick_escape(b: &[u8], at: usize, out: &mut String) -> bool {
    let c = match b.get(at + 1) {
        Some(b'u') => {
            // CPython wants at least one character after the 4 hex digits.
            let Some(unit) = b.get(at + 2..at + 7).and_then(|d| hex4(&d[..4])) else {
                return false;
            };
            // Surrogates are not characters: left to `escape`.
            let Some(c) = char::from_u32(unit) else {
                return false;
            };
            out.push(c);
            return true;
        }
        Some(b'"') => '"',
        Some(b'\\') => '\\',
        Some(b'/') => '/',
        Some(b'b') => '\u{8}',
        Some(b'f') => '\u{c}',
        Some(b'n') => '\n',
        Some(b'r') => '\r',
        Some(b't') => '\t',
        _ => return false,
    };
    out.push(c);
    true
}

/// The first index from `i` of a `"`, a `\` or a control character (or the end): the end of a run
/// that can be copied as is while parsing a string. Eight bytes at a time.
#[inline]
fn scan_string_plain(b: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = b.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let hits = zero_bytes(w ^ (ONES * u64::from(b'"')))
            | zero_bytes(w ^ (ONES * u64::from(b'\\')))
            | control_bytes(w);
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        i += 1;
    }
    i
}

fn too_deep(index: usize) -> Fail {
    fail(
        index,
        format!("lists/dicts nested more than {MAX_DEPTH} levels deep"),
    )
}

const LONE_SURROGATE: &str =
    "lone UTF-16 surrogate in \\u escape (CPython keeps it, but it cannot be represented in UTF-8)";

fn syntax_error(text: &str, index: usize, message: String) -> JsonError {
    let (line, column) = line_column(text.as_bytes(), index);
    JsonError::Syntax {
        line,
        column,
        message,
    }
}

/// 1-based line and character column of byte `index` (clamped to the end of `data`), computed as
/// CPython does for `JSONDecodeError` (`lineno`, `colno`).
fn line_column(data: &[u8], index: usize) -> (usize, usize) {
    let index = index.min(data.len());
    let before = &data[..index];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    // Count characters, not bytes: skip UTF-8 continuation bytes.
    let column = before[line_start..]
        .iter()
        .filter(|&&b| (b & 0xC0) != 0x80)
        .count()
        + 1;
    (line, column)
}
