//! Text tables that fit an 80-column terminal, as `kubectl get` prints them: upper-case
//! headers, columns two spaces apart, a cell too wide cut with `…`; lines of detail under a
//! row are wrapped, never cut.

/// Width every rendered line fits in.
pub const WIDTH: usize = 80;
/// Columns are this many spaces apart.
const GAP: usize = 2;
/// Narrowest a column is shrunk to.
const MIN_COLUMN: usize = 8;

/// A table being built.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<(Vec<String>, Vec<String>)>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.row_with(cells, Vec::new());
    }

    /// Adds a row with lines of detail printed (wrapped, indented) under it.
    pub fn row_with(&mut self, cells: Vec<String>, details: Vec<String>) {
        self.rows.push((cells, details));
    }

    /// The column widths: each column's widest cell, the widest shrunk first until the
    /// line fits [`WIDTH`].
    fn widths(&self) -> Vec<usize> {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for (cells, _) in &self.rows {
            for (w, c) in widths.iter_mut().zip(cells) {
                *w = (*w).max(c.chars().count());
            }
        }
        let total = |ws: &[usize]| ws.iter().sum::<usize>() + GAP * ws.len().saturating_sub(1);
        while total(&widths) > WIDTH {
            let Some((i, &w)) = widths.iter().enumerate().max_by_key(|(_, w)| **w) else {
                break;
            };
            if w <= MIN_COLUMN {
                break;
            }
            widths[i] = (w - (total(&widths) - WIDTH))
                .max(MIN_COLUMN)
                .max(w * 3 / 4)
                .min(w - 1);
        }
        widths
    }

    /// The table as text, one `\n`-terminated line per row (plus its details).
    pub fn render(&self) -> String {
        let widths = self.widths();
        let mut out = String::new();
        let line = |out: &mut String, cells: &[String]| {
            let mut l = String::new();
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                let cell = cut(c, *w);
                l.push_str(&cell);
                if i + 1 < cells.len() {
                    let pad = w - cell.chars().count() + GAP;
                    l.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(l.trim_end());
            out.push('\n');
        };
        line(&mut out, &self.header);
        let mut lines = Vec::new();
        for (cells, details) in &self.rows {
            line(&mut out, cells);
            lines.clear();
            for d in details {
                lines.extend(wrap(d, WIDTH, "    "));
            }
            for l in &lines {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

/// `s` cut to `width` characters, ending in `…` when cut.
fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut c: String = s.chars().take(width.saturating_sub(1)).collect();
    c.push('…');
    c
}

/// `text` as lines of at most `width` characters, each starting with `indent`, broken at
/// spaces (a word longer than a line is broken where it must).
pub fn wrap(text: &str, width: usize, indent: &str) -> Vec<String> {
    let room = width.saturating_sub(indent.chars().count()).max(1);
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        while word.len() > room {
            if !cur.is_empty() {
                lines.push(std::mem::take(&mut cur));
            }
            let rest = word.split_off(room);
            lines.push(word.into_iter().collect());
            word = rest;
        }
        let len = cur.chars().count();
        if len > 0 && len + 1 + word.len() > room {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.extend(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines.into_iter().map(|l| format!("{indent}{l}")).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn wide_tables_are_cut_to_80_columns() {
        let mut t = Table::new(&["NAME", "VALUE", "NOTE"]);
        t.row(vec!["a".repeat(60), "b".repeat(40), "c".repeat(30)]);
        t.row_with(
            vec!["x".into(), "y".into(), "z".into()],
            vec![format!("{} {}", "w".repeat(100), "word ".repeat(40))],
        );
        let text = t.render();
        for l in text.lines() {
            assert!(l.chars().count() <= WIDTH, "{l:?}");
        }
        assert!(text.contains('…'), "{text}");
        assert!(text.starts_with("NAME "), "{text}");
    }

    #[test]
    fn narrow_tables_are_not_padded_at_the_end() {
        let mut t = Table::new(&["A", "B"]);
        t.row(vec!["one".into(), "two".into()]);
        assert_eq!(t.render(), "A    B\none  two\n");
    }
}
