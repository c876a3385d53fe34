//! The float type of the advantages handed to a trainer: f64 natively, f32 for a trainer's
//! fp32 tensors. The kernel computes in f64 and writes each result in this type.

pub trait AdvantageFloat: Copy + Default + Send + Sync {
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
}

impl AdvantageFloat for f64 {
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
}

impl AdvantageFloat for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}
