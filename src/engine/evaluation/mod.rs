//! Evaluations (a provider bake-off): a frozen set of extractions sent to candidate
//! providers as trials, whose answers are compared with production's or with one another.

pub mod report;
