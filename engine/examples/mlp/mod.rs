//! The transformer MLP block the tensor-parallel examples (`tensor_parallel.rs`, `tp_pp.rs`)
//! shard: its weights and one rank's share of its output.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One layer's weights, row-major: `w1` is hidden × ffn, `w2` is ffn × hidden.
pub struct Layer {
    pub w1: Vec<f32>,
    pub w2: Vec<f32>,
}

/// `layers` layers of width `hidden` and MLP width `ffn`, the same on every rank (a fixed
/// seed).
pub fn weights(layers: usize, hidden: usize, ffn: usize) -> Vec<Layer> {
    let mut rng = StdRng::seed_from_u64(2026);
    let (h, f) = (hidden, ffn);
    (0..layers)
        .map(|_| Layer {
            w1: (0..h * f)
                .map(|_| rng.random_range(-1.0..1.0) / (h as f32).sqrt())
                .collect(),
            w2: (0..f * h)
                .map(|_| rng.random_range(-1.0..1.0) / (f as f32).sqrt())
                .collect(),
        })
        .collect()
}

/// GELU (tanh form).
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044_715 * x * x * x)).tanh())
}

/// `x` (1 × hidden) through columns `cols` of `w1`, then the matching rows of `w2`: this
/// slice's partial sum of the layer's output (1 × hidden).
pub fn partial(layer: &Layer, x: &[f32], cols: std::ops::Range<usize>) -> Vec<f32> {
    let hidden = x.len();
    let ffn = layer.w1.len() / hidden;
    let mut h = vec![0.0f32; cols.len()];
    for (i, &xi) in x.iter().enumerate() {
        let row = &layer.w1[i * ffn + cols.start..i * ffn + cols.end];
        for (hj, &w) in h.iter_mut().zip(row) {
            *hj += xi * w;
        }
    }
    let mut y = vec![0.0f32; hidden];
    for (k, hk) in h.iter().map(|&v| gelu(v)).enumerate() {
        let row = &layer.w2[(cols.start + k) * hidden..(cols.start + k + 1) * hidden];
        for (yj, &w) in y.iter_mut().zip(row) {
            *yj += hk * w;
        }
    }
    y
}
