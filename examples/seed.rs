//! The crate's first example (the crate root's documentation) as a program: each rank sums
//! `[1.0, 2.0]` over every rank and prints `rank r of n: [n, 2n]`. Run it on every rank of
//! a launch, e.g. `nuvec launch -n 2 -- target/release/examples/seed`; alone it is a group
//! of one.
//!
//! tests/seed_example.rs checks that the code below is the documentation's, line for line
//! (rustfmt would wrap the `println!`, so it is told to leave `main` as written), and runs
//! it under `nuvec launch`.

use nuvec_core::{array, distributed};

#[rustfmt::skip]
fn main() -> nuvec_core::Result<()> {
    let group = nuvec_distributed::init(false)?; // size 1 without a hostfile
    let x = array![1.0, 2.0];
    let total = distributed::all_sum(&x, None); // the sum over every rank
    println!("rank {} of {}: {:?}", group.rank(), group.size(), total.to_vec::<f32>()?);
    Ok(())
}
