//! The paper-shaped tables, each computed from a [`crate::Run`] into plain data and rendered
//! into a [`crate::TextTable`].

pub mod behaviour;
pub mod cross;
pub mod diagnostics;
pub mod directions;
pub mod evolution;
pub mod labels;
pub mod programs;
pub mod table1;
pub mod table10;
pub mod table2;
pub mod table4;
pub mod table5;
pub mod table9;
