//! Plain-text tables for listings.

use std::io::Write;

/// Writes `rows` under `header`, each column padded to its widest cell.
pub(crate) fn print_table(
    out: &mut impl Write,
    header: &[&str],
    rows: &[Vec<String>],
) -> std::io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        writeln!(out, "{}", padded.join("  ").trim_end())
    };
    line(&mut header.iter().copied())?;
    for row in rows {
        line(&mut row.iter().map(String::as_str))?;
    }
    Ok(())
}
