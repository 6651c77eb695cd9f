//! RunState JSON benchmark (being written).
fn main() {}
