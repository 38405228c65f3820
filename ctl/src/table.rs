//! ctl's tables as lists of columns. A [`Column`] is defined once: its header, its
//! alignment, and how a row gives its cell; a table is a list of columns, and its rows are
//! whatever those cells read (a document's entries, or rows made from them). A new column
//! is one more entry in a list. comfy-table renders them ([`crate::output::plain_table`]:
//! borderless, two spaces between columns, control characters shown as `?`).

use std::borrow::Cow;

use comfy_table::CellAlignment;

use crate::output::{plain_table, render_table};

/// Where a column's cells sit: text on the left, figures on the right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// One column of a table of rows of type `R`; its cells may borrow for `'c` (what a
/// table's columns share: the glyphs, a replica count).
pub struct Column<'c, R> {
    /// Its header.
    pub header: Cow<'static, str>,
    /// Where its cells sit.
    pub align: Align,
    /// Blanks after it: 2, or 1 where the next column belongs to it (an interval after its
    /// figure, `1,180 [1,120-1,230]`).
    pub gap: u16,
    /// A row's cell (empty where the row has none).
    pub cell: Box<dyn Fn(&R) -> String + 'c>,
}

impl<'c, R> Column<'c, R> {
    /// A column of text, on the left.
    pub fn left(header: impl Into<Cow<'static, str>>, cell: impl Fn(&R) -> String + 'c) -> Self {
        Column { header: header.into(), align: Align::Left, gap: 2, cell: Box::new(cell) }
    }

    /// A column of figures, on the right.
    pub fn right(header: impl Into<Cow<'static, str>>, cell: impl Fn(&R) -> String + 'c) -> Self {
        Column { align: Align::Right, ..Column::left(header, cell) }
    }
}

/// A table's columns, in order: `Columns::<Doc>::new().left("NAME", |d| d.name.clone())`.
pub struct Columns<'c, R>(pub Vec<Column<'c, R>>);

impl<'c, R> Columns<'c, R> {
    /// No columns yet.
    pub fn new() -> Self {
        Columns(Vec::new())
    }

    /// Then a column of text, on the left.
    pub fn left(
        mut self,
        header: impl Into<Cow<'static, str>>,
        cell: impl Fn(&R) -> String + 'c,
    ) -> Self {
        self.0.push(Column::left(header, cell));
        self
    }

    /// Then a column of figures, on the right.
    pub fn right(
        mut self,
        header: impl Into<Cow<'static, str>>,
        cell: impl Fn(&R) -> String + 'c,
    ) -> Self {
        self.0.push(Column::right(header, cell));
        self
    }

    /// Then an unnamed column of text one blank after the one before (an interval after
    /// its figure: `1,180 [1,120-1,230]`).
    pub fn beside(mut self, cell: impl Fn(&R) -> String + 'c) -> Self {
        if let Some(before) = self.0.last_mut() {
            before.gap = 1;
        }
        self.left("", cell)
    }

    /// The table of `rows` in these columns.
    pub fn render<'r>(&self, rows: impl IntoIterator<Item = &'r R>) -> String
    where
        R: 'r,
    {
        render(&self.0, rows)
    }
}

impl<R> Default for Columns<'_, R> {
    fn default() -> Self {
        Columns::new()
    }
}

/// The table of `rows` in `columns`, with its header line, a line per row.
pub fn render<'a, 'c: 'a, 'r, R: 'a + 'r>(
    columns: impl IntoIterator<Item = &'a Column<'c, R>>,
    rows: impl IntoIterator<Item = &'r R>,
) -> String {
    let columns: Vec<&Column<R>> = columns.into_iter().collect();
    let mut table = plain_table(columns.iter().map(|c| c.header.as_ref()));
    for (at, column) in columns.iter().enumerate() {
        if let Some(c) = table.column_mut(at) {
            if column.align == Align::Right {
                c.set_cell_alignment(CellAlignment::Right);
            }
            if column.gap != 2 {
                c.set_padding((0, column.gap));
            }
        }
    }
    for row in rows {
        table.add_row(columns.iter().map(|c| (c.cell)(row)).collect::<Vec<_>>());
    }
    render_table(&table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_its_columns_applied_to_each_row() {
        let columns = Columns::<(u32, &str)>::new()
            .left("NAME", |r| r.1.to_owned())
            .right("COUNT", |r| r.0.to_string());
        let text = columns.render(&[(7, "seven"), (12, "a dozen")]);
        assert_eq!(text, "NAME     COUNT\nseven        7\na dozen     12\n");
        // A figure and its interval, one blank apart.
        let columns = columns.beside(|r| format!("[{}]", r.0 - 1));
        assert_eq!(columns.render(&[(7, "seven")]), "NAME   COUNT\nseven      7 [6]\n");
    }
}
