//! TFRecord framing: each record is
//! `u64 LE length | masked crc32c(length bytes) | data | masked crc32c(data)`,
//! all integers little-endian. This is the container TensorBoard event files use.

use std::io::{self, Write};

/// Bytes before a record's data: the length (8) and its masked CRC (4).
pub(crate) const HEADER_LEN: usize = 12;
/// Bytes after a record's data: the data's masked CRC.
pub(crate) const FOOTER_LEN: usize = 4;

/// Added after the rotation so that a CRC of bytes that themselves contain
/// CRCs (a record inside a record) does not degenerate; value fixed by TFRecord.
const MASK_DELTA: u32 = 0xa282_ead8;

/// The CRC32C of `data`, masked as TFRecord stores it.
pub(crate) fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// Writes one framed record holding `data`.
pub(crate) fn write_record(out: &mut impl Write, data: &[u8]) -> io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    out.write_all(&len)?;
    out.write_all(&masked_crc32c(&len).to_le_bytes())?;
    out.write_all(data)?;
    out.write_all(&masked_crc32c(data).to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    // Spelled out as TFRecord's docs write it, to check `rotate_right` against it.
    #[allow(clippy::manual_rotate)]
    fn mask_matches_the_definition() {
        let crc = crc32c::crc32c(b"abc");
        let by_definition = ((crc >> 15) | (crc << 17)).wrapping_add(MASK_DELTA);
        assert_eq!(masked_crc32c(b"abc"), by_definition);
    }

    #[test]
    fn masked_crc_known_values() {
        // From TensorBoard's own implementation:
        //   from tensorboard.summary.writer.record_writer import masked_crc32c
        //   masked_crc32c(b"")                      -> 0xa282ead8
        //   masked_crc32c(b"123456789")             -> 0xc78ab0e5
        //   masked_crc32c(struct.pack("<Q", 5))     -> 0x3e04b2ea
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283); // the CRC-32C check value
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
        assert_eq!(masked_crc32c(&5u64.to_le_bytes()), 0x3e04_b2ea);
    }

    #[test]
    fn record_layout() {
        let mut out = Vec::new();
        write_record(&mut out, b"hello").unwrap();
        assert_eq!(out.len(), HEADER_LEN + 5 + FOOTER_LEN);
        assert_eq!(&out[..8], &5u64.to_le_bytes());
        assert_eq!(
            &out[8..12],
            &masked_crc32c(&5u64.to_le_bytes()).to_le_bytes()
        );
        assert_eq!(&out[12..17], b"hello");
        assert_eq!(&out[17..], &masked_crc32c(b"hello").to_le_bytes());
    }
}
