//! ctl's tables as lists of columns. A [`Column`] is defined once: its header, its
//! alignment, and how a row gives its cell; a table is a list of columns, and its rows are
//! whatever those cells read (a document's entries, or rows made from them). A new column
//! is one more entry in a list. comfy-table renders them ([`crate::output::plain_table`]:
//! borderless, two spaces between columns, control characters shown as `?`).

use comfy_table::CellAlignment;

use crate::output::{plain_table, render_table};

/// Where a column's cells sit: text on the left, figures on the right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// One column of a table of rows of type `R`.
pub struct Column<R> {
    /// Its header.
    pub header: &'static str,
    /// Where its cells sit.
    pub align: Align,
    /// A row's cell (empty where the row has none).
    pub cell: fn(&R) -> String,
}

impl<R> Column<R> {
    /// A column of text, on the left.
    pub const fn left(header: &'static str, cell: fn(&R) -> String) -> Self {
        Column { header, align: Align::Left, cell }
    }

    /// A column of figures, on the right.
    pub const fn right(header: &'static str, cell: fn(&R) -> String) -> Self {
        Column { header, align: Align::Right, cell }
    }
}

/// The table of `rows` in `columns`, with its header line, a line per row.
pub fn render<'c, 'r, R: 'c + 'r>(
    columns: impl IntoIterator<Item = &'c Column<R>>,
    rows: impl IntoIterator<Item = &'r R>,
) -> String {
    let columns: Vec<&Column<R>> = columns.into_iter().collect();
    let mut table = plain_table(columns.iter().map(|c| c.header));
    for (at, column) in columns.iter().enumerate() {
        if let (Align::Right, Some(c)) = (column.align, table.column_mut(at)) {
            c.set_cell_alignment(CellAlignment::Right);
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
        const COLUMNS: [Column<(u32, &str)>; 2] =
            [Column::left("NAME", |r| r.1.to_owned()), Column::right("COUNT", |r| r.0.to_string())];
        let text = render(&COLUMNS, &[(7, "seven"), (12, "a dozen")]);
        assert_eq!(text, "NAME     COUNT\nseven        7\na dozen     12\n");
    }
}
