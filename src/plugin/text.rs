//! Terminal output helpers: aligned tables, kubectl-style ages, shortened cells, and escaping of
//! text that comes from a model or a tool so it cannot rewrite the terminal a person decides in.

use chrono::{DateTime, Utc};

/// The gap between two table columns.
const COLUMN_GAP: &str = "   ";

/// A table with a header row, rendered with left-aligned columns like `kubectl get`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<I, S>(header: I) -> Table
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; each cell is made one line ([`one_line`]). Missing cells are left empty and
    /// extra cells are dropped.
    pub fn push<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut row: Vec<String> = cells
            .into_iter()
            .take(self.header.len())
            .map(|c| one_line(c.as_ref()))
            .collect();
        row.resize(self.header.len(), String::new());
        self.rows.push(row);
    }

    /// True when the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text: one line per row, a line break after each, no trailing spaces.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
                if i > 0 {
                    line.push_str(COLUMN_GAP);
                }
                line.push_str(cell);
                let pad = width - cell.chars().count();
                line.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// True for characters that could change how a terminal shows the text around them: control
/// characters (escape sequences start with one) and the Unicode bidirectional controls.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character except line breaks and tabs, and every bidirectional
/// control, written as a visible `\u{..}` escape: model and tool output shown to a person deciding
/// on a call cannot hide or rewrite what is displayed.
pub fn terminal_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\n' || c == '\t' || !is_unsafe(c) {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        }
    }
    out
}

/// `text` as one terminal-safe line: line breaks and tabs are written `\n`, `\r` and `\t`, other
/// unsafe characters as in [`terminal_safe`].
pub fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_unsafe(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// `text` as one line of at most `max` characters; a longer one is cut and ends with `...`.
pub fn shorten(text: &str, max: usize) -> String {
    let line = one_line(text);
    if line.chars().count() <= max {
        return line;
    }
    let keep = max.saturating_sub(3);
    let mut cut: String = line.chars().take(keep).collect();
    cut.push_str("...");
    cut
}

/// Every line of `text` (made terminal-safe) prefixed with `indent`; an empty text gives one
/// indented `(empty)` line.
pub fn indented(text: &str, indent: &str) -> String {
    if text.is_empty() {
        return format!("{indent}(empty)\n");
    }
    let mut out = String::new();
    for line in terminal_safe(text).lines() {
        out.push_str(indent);
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// A time as RFC 3339 in UTC with second precision, e.g. `2026-01-02T03:04:05Z`.
pub fn rfc3339(time: &DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The age of something created at `created`, as `kubectl get` writes it (`45s`, `3m12s`, `5h`,
/// `2d3h`, ...); `<unknown>` without a time.
pub fn age(created: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    let Some(created) = created else {
        return "<unknown>".to_owned();
    };
    let seconds = (now - created).num_seconds().max(0);
    human_duration(seconds)
}

/// kubectl's short human duration of `seconds` (`HumanDuration` in apimachinery).
fn human_duration(seconds: i64) -> String {
    const MINUTE: i64 = 60;
    const HOUR: i64 = 60 * MINUTE;
    const DAY: i64 = 24 * HOUR;
    const YEAR: i64 = 365 * DAY;
    if seconds < 2 * MINUTE {
        format!("{seconds}s")
    } else if seconds < 10 * MINUTE {
        let s = seconds % MINUTE;
        if s == 0 {
            format!("{}m", seconds / MINUTE)
        } else {
            format!("{}m{s}s", seconds / MINUTE)
        }
    } else if seconds < 3 * HOUR {
        format!("{}m", seconds / MINUTE)
    } else if seconds < 8 * HOUR {
        let m = (seconds % HOUR) / MINUTE;
        if m == 0 {
            format!("{}h", seconds / HOUR)
        } else {
            format!("{}h{m}m", seconds / HOUR)
        }
    } else if seconds < 2 * DAY {
        format!("{}h", seconds / HOUR)
    } else if seconds < 8 * DAY {
        let h = (seconds % DAY) / HOUR;
        if h == 0 {
            format!("{}d", seconds / DAY)
        } else {
            format!("{}d{h}h", seconds / DAY)
        }
    } else if seconds < 2 * YEAR {
        format!("{}d", seconds / DAY)
    } else if seconds < 8 * YEAR {
        let d = (seconds % YEAR) / DAY;
        if d == 0 {
            format!("{}y", seconds / YEAR)
        } else {
            format!("{}y{d}d", seconds / YEAR)
        }
    } else {
        format!("{}y", seconds / YEAR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_without_trailing_spaces() {
        let mut table = Table::new(["NAME", "PHASE", "X"]);
        table.push(["a-long-name", "Running", ""]);
        table.push(["b", "AwaitingApproval", "1"]);
        assert_eq!(
            table.render(),
            "NAME          PHASE              X\n\
             a-long-name   Running\n\
             b             AwaitingApproval   1\n"
        );
        assert!(!table.is_empty());
    }

    #[test]
    fn table_cells_are_single_lines() {
        let mut table = Table::new(["A"]);
        table.push(["one\ntwo\u{1b}[2J"]);
        assert_eq!(table.render(), "A\none\\ntwo\\u{1b}[2J\n");
    }

    #[test]
    fn terminal_escapes_are_made_visible() {
        assert_eq!(terminal_safe("ok\n\tnext"), "ok\n\tnext");
        assert_eq!(terminal_safe("a\u{1b}[31mred"), "a\\u{1b}[31mred");
        assert_eq!(terminal_safe("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(one_line("a\r\nb"), "a\\r\\nb");
    }

    #[test]
    fn shorten_cuts_long_text() {
        assert_eq!(shorten("abcdef", 6), "abcdef");
        assert_eq!(shorten("abcdefg", 6), "abc...");
        assert_eq!(shorten("é".repeat(10).as_str(), 5), "éé...");
        assert_eq!(shorten("a\nb", 10), "a\\nb");
    }

    #[test]
    fn indented_prefixes_every_line() {
        assert_eq!(indented("a\nb", "  "), "  a\n  b\n");
        assert_eq!(indented("", "  "), "  (empty)\n");
    }

    #[test]
    fn ages_read_like_kubectl() {
        let now = DateTime::from_timestamp(1_000_000_000, 0).unwrap();
        let ago = |s: i64| age(Some(now - chrono::Duration::seconds(s)), now);
        assert_eq!(ago(0), "0s");
        assert_eq!(ago(119), "119s");
        assert_eq!(ago(125), "2m5s");
        assert_eq!(ago(600), "10m");
        assert_eq!(ago(3 * 3600 + 120), "3h2m");
        assert_eq!(ago(20 * 3600), "20h");
        assert_eq!(ago(3 * 86400 + 3600), "3d1h");
        assert_eq!(ago(30 * 86400), "30d");
        assert_eq!(ago(-5), "0s");
        assert_eq!(age(None, now), "<unknown>");
    }

    #[test]
    fn api_times_convert_to_utc() {
        let time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
        );
        let utc = crate::time::try_from_k8s(&time).unwrap();
        assert_eq!(rfc3339(&utc), "2023-11-14T22:13:20Z");
    }
}
