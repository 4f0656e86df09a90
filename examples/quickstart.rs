//! The README's quick start, the nuvec way: nuvec arrays summed across ranks through
//! `nuvec_core::distributed`, over the group `init` made the default.
//!
//! ```text
//! cargo build --release --example quickstart
//! cargo run --release --bin nuvec -- launch -n 2 -- target/release/examples/quickstart
//! ```

use nuvec_core::{array, distributed};

fn main() -> nuvec_core::Result<()> {
    // Under `nuvec launch` (or `mlx.launch`), MLX_HOSTFILE and MLX_RANK describe the ring.
    // With no launch variable set this is the group of this process alone; a partial or
    // unusable launch environment is an error, not a group of one.
    let group = nuvec_distributed::init(false)?; // now the default group
    let x = array![1.0, 2.0];
    let total = distributed::all_sum(&x, None); // lazy: the sum runs when evaluated
    let total = total.to_vec::<f32>()?; // a failed collective is an error here
    println!("rank {} of {}: {total:?}", group.rank(), group.size());
    Ok(())
}
