//! fedsel's workbench: what runs around single runs rather than inside them. Sweeps run
//! grids of configs on the core library's engine; reports and plots turn the output
//! directories of runs and sweeps into tables and figures.

pub mod arms;
pub mod error;
pub mod fuzzing;
pub mod inspect;
pub mod plot;
pub mod report;
pub mod results;
pub mod stats;
pub mod sweep;
pub mod timeline;
pub mod verdict;
