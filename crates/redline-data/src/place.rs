//! Where a split lives during training: uploaded once to the device
//! (device-resident) or kept on the host and streamed a batch at a time.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The `--data-on-device` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataOnDevice {
    /// Resident when the split fits the memory budget, else streamed.
    #[default]
    Auto,
    /// Always upload the split once (an error if it cannot fit).
    On,
    /// Always stream batches from host memory.
    Off,
}

impl FromStr for DataOnDevice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "on" | "true" | "yes" => Ok(Self::On),
            "off" | "false" | "no" => Ok(Self::Off),
            _ => Err(Error::Config(format!(
                "--data-on-device {s:?}: expected `auto`, `on` or `off`"
            ))),
        }
    }
}

impl fmt::Display for DataOnDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

/// How a loader feeds the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The split was uploaded once; batches are gathered on the device.
    Resident,
    /// The split stays on the host; batches are gathered into staging buffers
    /// (pinned on GPUs) and copied asynchronously.
    Streaming,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Resident => "device-resident",
            Self::Streaming => "streaming",
        })
    }
}

/// Share of the device's free memory a resident dataset may take under `auto`;
/// the rest is left for parameters, activations and the allocator's cache.
pub const RESIDENT_BUDGET: f64 = 0.5;

/// Decides the placement of a split of `bytes` on a device with `device_free`
/// bytes free (`None` for the CPU, whose memory the data already lives in).
pub fn place(policy: DataOnDevice, bytes: u64, device_free: Option<u64>) -> Result<Placement> {
    match (policy, device_free) {
        (DataOnDevice::Off, _) => Ok(Placement::Streaming),
        (_, None) => Ok(Placement::Resident),
        (DataOnDevice::On, Some(free)) if bytes > free => Err(Error::Config(format!(
            "--data-on-device on: the split needs {:.2} GiB but the device has {:.2} GiB free\n\
             HINT: use --data-on-device auto (streams what does not fit) or off",
            gib(bytes),
            gib(free)
        ))),
        (DataOnDevice::On, Some(_)) => Ok(Placement::Resident),
        (DataOnDevice::Auto, Some(free)) => Ok(if bytes as f64 <= free as f64 * RESIDENT_BUDGET {
            Placement::Resident
        } else {
            Placement::Streaming
        }),
    }
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_policies() -> Result<()> {
        assert_eq!("AUTO".parse::<DataOnDevice>()?, DataOnDevice::Auto);
        assert_eq!("on".parse::<DataOnDevice>()?, DataOnDevice::On);
        assert_eq!("off".parse::<DataOnDevice>()?, DataOnDevice::Off);
        let e = "sometimes"
            .parse::<DataOnDevice>()
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("expected `auto`, `on` or `off`")));
        Ok(())
    }

    #[test]
    fn auto_keeps_what_fits_half_the_free_memory() -> Result<()> {
        let gb = 1u64 << 30;
        assert_eq!(
            place(DataOnDevice::Auto, gb, Some(80 * gb))?,
            Placement::Resident
        );
        assert_eq!(
            place(DataOnDevice::Auto, 40 * gb, Some(80 * gb))?,
            Placement::Resident
        );
        assert_eq!(
            place(DataOnDevice::Auto, 41 * gb, Some(80 * gb))?,
            Placement::Streaming
        );
        // The CPU: the data is already in the memory the model computes from.
        assert_eq!(
            place(DataOnDevice::Auto, 100 * gb, None)?,
            Placement::Resident
        );
        Ok(())
    }

    #[test]
    fn on_and_off_are_obeyed_and_on_refuses_what_cannot_fit() -> Result<()> {
        let gb = 1u64 << 30;
        assert_eq!(place(DataOnDevice::Off, 1, None)?, Placement::Streaming);
        assert_eq!(place(DataOnDevice::Off, 1, Some(gb))?, Placement::Streaming);
        assert_eq!(
            place(DataOnDevice::On, 70 * gb, Some(80 * gb))?,
            Placement::Resident
        );
        let msg = place(DataOnDevice::On, 90 * gb, Some(80 * gb))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("needs 90.00 GiB") && msg.contains("HINT"),
            "{msg}"
        );
        Ok(())
    }
}
