//! The argument of `redline_step_sums` (`cuda/tally.cu`): a step's running
//! sums added in one launch, `dst[i] += src[i] * scale[i]` on f32 scalars.
//! The GPU path ([`crate::cuda::step_sums`]) fills it with device addresses,
//! the emulated-kernel tests with host ones.

use crate::error::{Error, Result};

/// Sums one launch takes (`REDLINE_MAX_SUMS` of `cuda/tally.cu`).
pub const MAX_SUMS: usize = 16;

/// `struct SumList` of `cuda/tally.cu`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SumList {
    /// Addresses of the sums (one f32 each), updated in place.
    pub dst: [u64; MAX_SUMS],
    /// Addresses of the values added (one f32 each).
    pub src: [u64; MAX_SUMS],
    /// What each value is multiplied by first (1 for a plain add).
    pub scale: [f32; MAX_SUMS],
    /// Sums in this launch.
    pub n: u32,
}
const _: () = assert!(std::mem::size_of::<SumList>() == 328);

impl SumList {
    /// The list of `(sum, value, scale)` address triples, in order; at most
    /// [`MAX_SUMS`].
    pub fn new(items: &[(u64, u64, f32)]) -> Result<Self> {
        if items.len() > MAX_SUMS {
            return Err(Error::Shape(format!(
                "step sums: {} sums in one launch, at most {MAX_SUMS}",
                items.len()
            )));
        }
        let mut list = Self {
            dst: [0; MAX_SUMS],
            src: [0; MAX_SUMS],
            scale: [0.0; MAX_SUMS],
            n: items.len() as u32,
        };
        for (i, &(dst, src, scale)) in items.iter().enumerate() {
            list.dst[i] = dst;
            list.src[i] = src;
            list.scale[i] = scale;
        }
        Ok(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_the_order_and_refuses_too_many() -> Result<()> {
        let l = SumList::new(&[(8, 16, 64.0), (24, 16, 1.0)])?;
        assert_eq!(
            (l.n, l.dst[..2].to_vec(), l.src[..2].to_vec()),
            (2, vec![8, 24], vec![16, 16])
        );
        assert_eq!(l.scale[..2], [64.0, 1.0]);
        let many = vec![(8, 16, 1.0); MAX_SUMS + 1];
        let e = SumList::new(&many).map(|_| ()).map_err(|e| e.to_string());
        assert!(e.as_ref().is_err_and(|m| m.contains("17 sums")), "{e:?}");
        assert!(SumList::new(&many[..MAX_SUMS]).is_ok());
        Ok(())
    }
}
