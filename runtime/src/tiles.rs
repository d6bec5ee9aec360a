//! Tiles of an output too large to compute at once, sized to the memory there is.
//!
//! A kernel matrix of 65,536 states is 16 GiB of f32, and the products that make it need their
//! operands and intermediates beside it. [`TilePlanner`] takes a budget (a fraction of the free
//! memory [`Runtime::memory_info`](crate::Runtime::memory_info) reports) and a [`TileCost`] (the
//! bytes a tile of r x c outputs needs: its buffers per row, per column and per output), and
//! lists the square tile edges that fit, smallest first. The largest is the default; a tuner
//! ([`crate::tune`]) may time several. [`TileGrid`] walks the tiles of one edge over the output,
//! or over its upper triangle when the output is symmetric.
//!
//! ```
//! use pptm_runtime::tiles::{TileCost, TileGrid, TilePlanner};
//!
//! # fn main() -> pptm_runtime::Result<()> {
//! // 4 bytes an output, plus 2 x 1 KiB of operands per row and per column.
//! let cost = TileCost { fixed: 0, per_row: 1024, per_col: 1024, per_cell: 4 };
//! let planner = TilePlanner::with_budget(64 << 20);
//! let edges = planner.edges(&cost, 100_000, 100_000, 256)?;
//! assert_eq!(edges, vec![256, 512, 1024, 2048]);
//! let grid = TileGrid::upper_triangle(10_000, 2048);
//! assert_eq!(grid.len(), 15); // 5 tile rows: 5 + 4 + 3 + 2 + 1
//! # Ok(())
//! # }
//! ```

use crate::error::{Error, Result};

/// Bytes a tile of `rows x cols` outputs needs: `fixed + per_row rows + per_col cols +
/// per_cell rows cols`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TileCost {
    /// Bytes whatever the tile (buffers of the whole problem kept resident).
    pub fixed: u64,
    /// Bytes per row of the tile (a row tile of an operand).
    pub per_row: u64,
    /// Bytes per column of the tile.
    pub per_col: u64,
    /// Bytes per output of the tile (the output and every intermediate of its size).
    pub per_cell: u64,
}

impl TileCost {
    /// The bytes of a `rows x cols` tile, saturating at `u64::MAX`.
    pub fn bytes(&self, rows: u64, cols: u64) -> u64 {
        self.fixed
            .saturating_add(self.per_row.saturating_mul(rows))
            .saturating_add(self.per_col.saturating_mul(cols))
            .saturating_add(self.per_cell.saturating_mul(rows).saturating_mul(cols))
    }
}

/// Chooses tile edges that fit a memory budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TilePlanner {
    budget: u64,
}

impl TilePlanner {
    /// A planner that may use `bytes`.
    pub fn with_budget(bytes: u64) -> TilePlanner {
        TilePlanner { budget: bytes }
    }

    /// A planner that may use `fraction` (in (0, 1]) of the free memory of `rt`'s device (or of
    /// the host, on the CPU backend).
    pub fn for_runtime(rt: &crate::Runtime, fraction: f64) -> Result<TilePlanner> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(Error::Config(format!(
                "a tile planner's fraction of free memory must be in (0, 1], not {fraction}"
            )));
        }
        let free = rt.memory_info()?.free_bytes as f64;
        Ok(TilePlanner::with_budget((free * fraction) as u64))
    }

    /// The bytes it may use.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The square tile edges whose tiles fit the budget, ascending: `unit`, then doubling, up to
    /// the first edge that covers the output's longer side (that one rounded up to a multiple of
    /// `unit`, not doubled past it). [`Error::TileTooLarge`] when not even `unit` fits.
    pub fn edges(&self, cost: &TileCost, rows: u64, cols: u64, unit: u64) -> Result<Vec<u64>> {
        if unit == 0 || rows == 0 || cols == 0 {
            return Err(Error::Config(format!(
                "tile planning needs a positive unit and output (unit {unit}, {rows} x {cols})"
            )));
        }
        let side = rows.max(cols).div_ceil(unit).saturating_mul(unit);
        let fits = |edge: u64| cost.bytes(edge.min(rows), edge.min(cols)) <= self.budget;
        let mut edges = Vec::new();
        let mut edge = unit;
        loop {
            let e = edge.min(side);
            if !fits(e) {
                break;
            }
            edges.push(e);
            if e >= side {
                break;
            }
            edge = edge.saturating_mul(2);
        }
        if edges.is_empty() {
            return Err(Error::TileTooLarge {
                tile: unit,
                needed: cost.bytes(unit.min(rows), unit.min(cols)),
                budget: self.budget,
            });
        }
        Ok(edges)
    }

    /// The largest edge [`TilePlanner::edges`] lists.
    pub fn largest(&self, cost: &TileCost, rows: u64, cols: u64, unit: u64) -> Result<u64> {
        Ok(*self
            .edges(cost, rows, cols, unit)?
            .last()
            .expect("edges is never empty"))
    }
}

/// One tile: rows `row0 .. row0 + rows`, columns `col0 .. col0 + cols` of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// Its first row.
    pub row0: u64,
    /// Its rows (the edge, or fewer at the output's last tile row).
    pub rows: u64,
    /// Its first column.
    pub col0: u64,
    /// Its columns.
    pub cols: u64,
}

impl Tile {
    /// Whether it lies on the diagonal of a symmetric output (its rows are its columns).
    pub fn on_diagonal(&self) -> bool {
        self.row0 == self.col0
    }
}

/// The tiles of one edge over a `rows x cols` output, row by row; or over the upper triangle
/// (tiles whose first column is at or past their first row) of a symmetric `n x n` output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileGrid {
    rows: u64,
    cols: u64,
    edge: u64,
    triangle: bool,
}

impl TileGrid {
    /// Every tile of a `rows x cols` output. An edge of 0 is taken as 1.
    pub fn new(rows: u64, cols: u64, edge: u64) -> TileGrid {
        TileGrid {
            rows,
            cols,
            edge: edge.max(1),
            triangle: false,
        }
    }

    /// The tiles on and above the diagonal of a symmetric `n x n` output: the rest are their
    /// transposes.
    pub fn upper_triangle(n: u64, edge: u64) -> TileGrid {
        TileGrid {
            rows: n,
            cols: n,
            edge: edge.max(1),
            triangle: true,
        }
    }

    /// The tile edge.
    pub fn edge(&self) -> u64 {
        self.edge
    }

    /// How many tiles it has.
    pub fn len(&self) -> usize {
        let (tr, tc) = (self.rows.div_ceil(self.edge), self.cols.div_ceil(self.edge));
        if self.triangle {
            (tr * (tr + 1) / 2) as usize
        } else {
            (tr * tc) as usize
        }
    }

    /// Whether it has no tiles (an empty output).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its tiles, row of tiles by row of tiles.
    pub fn tiles(&self) -> impl Iterator<Item = Tile> + '_ {
        let e = self.edge;
        let tr = self.rows.div_ceil(e);
        let tc = self.cols.div_ceil(e);
        (0..tr).flat_map(move |i| {
            let first = if self.triangle { i } else { 0 };
            (first..tc).map(move |j| Tile {
                row0: i * e,
                rows: e.min(self.rows - i * e),
                col0: j * e,
                cols: e.min(self.cols - j * e),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_double_until_the_budget_or_the_output() {
        let cost = TileCost {
            fixed: 100,
            per_row: 8,
            per_col: 8,
            per_cell: 4,
        };
        // 1000 x 300: the last edge covers the longer side, rounded up to the unit.
        let all = TilePlanner::with_budget(u64::MAX)
            .edges(&cost, 1000, 300, 64)
            .unwrap();
        assert_eq!(all, vec![64, 128, 256, 512, 1024]);
        // A budget between two edges' costs stops before the larger.
        let b = cost.bytes(256, 256);
        let some = TilePlanner::with_budget(b)
            .edges(&cost, 1000, 1000, 64)
            .unwrap();
        assert_eq!(some, vec![64, 128, 256]);
        assert_eq!(
            TilePlanner::with_budget(b)
                .largest(&cost, 1000, 1000, 64)
                .unwrap(),
            256
        );
        // A tile is charged for the rows and columns it has, not the edge past the output.
        let thin = TilePlanner::with_budget(cost.bytes(7, 7))
            .edges(&cost, 7, 7, 64)
            .unwrap();
        assert_eq!(thin, vec![64]);
    }

    #[test]
    fn nothing_fits_is_a_typed_error() {
        let cost = TileCost {
            per_cell: 4,
            ..TileCost::default()
        };
        match TilePlanner::with_budget(1000).edges(&cost, 4096, 4096, 128) {
            Err(Error::TileTooLarge {
                tile: 128,
                needed,
                budget: 1000,
            }) => assert_eq!(needed, 128 * 128 * 4),
            other => panic!("expected TileTooLarge, got {other:?}"),
        }
        assert!(matches!(
            TilePlanner::with_budget(1 << 30).edges(&cost, 0, 10, 128),
            Err(Error::Config(_))
        ));
        assert!(matches!(
            TilePlanner::with_budget(1 << 30).edges(&cost, 10, 10, 0),
            Err(Error::Config(_))
        ));
        // Overflowing costs saturate instead of wrapping into a fit.
        let huge = TileCost {
            per_cell: u64::MAX / 2,
            ..TileCost::default()
        };
        assert!(
            TilePlanner::with_budget(u64::MAX - 1)
                .edges(&huge, 1 << 20, 1 << 20, 1 << 10)
                .is_err()
        );
    }

    #[test]
    fn grids_cover_every_output_once() {
        for (rows, cols, edge) in [
            (1, 1, 1),
            (7, 5, 3),
            (1023, 1, 256),
            (10, 10, 10),
            (9, 31, 4),
        ] {
            let grid = TileGrid::new(rows, cols, edge);
            let mut seen = vec![0u8; (rows * cols) as usize];
            for t in grid.tiles() {
                for i in t.row0..t.row0 + t.rows {
                    for j in t.col0..t.col0 + t.cols {
                        seen[(i * cols + j) as usize] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{rows} x {cols} by {edge}");
            assert_eq!(grid.tiles().count(), grid.len());
        }
        // The triangle covers each unordered pair (i <= j) once, by a tile or a transpose.
        for (n, edge) in [(1, 4), (7, 3), (64, 16), (100, 33)] {
            let grid = TileGrid::upper_triangle(n, edge);
            let mut seen = vec![0u8; (n * n) as usize];
            for t in grid.tiles() {
                assert!(t.col0 >= t.row0);
                for i in t.row0..t.row0 + t.rows {
                    for j in t.col0..t.col0 + t.cols {
                        let (a, b) = (i.min(j), i.max(j));
                        if !(t.on_diagonal() && i > j) {
                            seen[(a * n + b) as usize] += 1;
                        }
                    }
                }
            }
            for a in 0..n {
                for b in 0..n {
                    let want = u8::from(a <= b);
                    assert_eq!(
                        seen[(a * n + b) as usize],
                        want,
                        "n {n} edge {edge} ({a}, {b})"
                    );
                }
            }
            assert_eq!(grid.tiles().count(), grid.len());
        }
        assert!(TileGrid::new(0, 5, 4).is_empty());
    }
}
