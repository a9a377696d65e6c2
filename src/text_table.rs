//! Tables of figures in the text reports (`plan`'s per-rank figures, `tune`'s ranking and
//! frontier): each column as wide as its widest cell, so large figures never break the columns.

/// How a column aligns its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text (expressions): to the left.
    Left,
    /// Figures: to the right.
    Right,
}

/// A table with a header row: its columns' headers, alignments and least widths, and rows of
/// cells.
#[derive(Clone, Debug)]
pub struct TextTable {
    columns: Vec<(String, Align, usize)>,
    rows: Vec<Vec<String>>,
}

impl TextTable {
    /// A table with these columns (header, alignment, least width) and no rows.
    pub fn new(columns: &[(&str, Align, usize)]) -> TextTable {
        TextTable {
            columns: columns
                .iter()
                .map(|(h, a, w)| ((*h).to_string(), *a, *w))
                .collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are empty, extra ones are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.columns.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as lines (header first), columns a space apart, trailing spaces trimmed.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(c, (header, _, least))| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .chain([header.chars().count(), *least])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<&str>| {
            let mut out = String::new();
            for (c, cell) in cells.iter().enumerate() {
                if c > 0 {
                    out.push(' ');
                }
                let width = widths[c];
                match self.columns[c].1 {
                    Align::Left => out.push_str(&format!("{cell:<width$}")),
                    Align::Right => out.push_str(&format!("{cell:>width$}")),
                }
            }
            out.trim_end().to_string() + "\n"
        };
        let mut out = line(self.columns.iter().map(|(h, _, _)| h.as_str()).collect());
        for row in &self.rows {
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_widen_to_their_largest_figure() {
        let mut table = TextTable::new(&[("rank", Align::Right, 4), ("busy", Align::Right, 9)]);
        table.row(vec!["0".into(), "3.000".into()]);
        assert_eq!(table.render(), "rank      busy\n   0     3.000\n");
        table.row(vec!["1".into(), "1236541.000".into()]);
        assert_eq!(
            table.render(),
            "rank        busy\n   0       3.000\n   1 1236541.000\n"
        );
    }

    #[test]
    fn text_aligns_left() {
        let mut table = TextTable::new(&[("expression", Align::Left, 0), ("x", Align::Right, 2)]);
        table.row(vec!["f1b(gpipe)".into(), "1".into()]);
        assert_eq!(table.render(), "expression  x\nf1b(gpipe)  1\n");
    }
}
