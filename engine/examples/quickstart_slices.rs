//! The README's quick start with the slice-level API: every rank sums a vector in place.
//!
//! ```text
//! cargo build --release --example quickstart_slices
//! cargo run --release --bin nuvec -- launch -n 2 -- target/release/examples/quickstart_slices
//! ```

fn main() -> nuvec_distributed_engine::Result<()> {
    // Under `nuvec launch` (or `mlx.launch`), MLX_HOSTFILE and MLX_RANK describe the ring.
    // With no launch variable set this is the group of this process alone; a partial or
    // unusable launch environment is an error, not a group of one.
    let group = nuvec_distributed_engine::init(false)?;
    let mut x = vec![group.rank() as f32 + 1.0; 4];
    group.all_sum(&mut x)?; // in place, the same bits on every rank
    println!("rank {} of {}: {x:?}", group.rank(), group.size());
    Ok(())
}
