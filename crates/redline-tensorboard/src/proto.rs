//! Hand-written protobuf encoding and decoding for the three messages a scalar
//! event file needs (field numbers from tensorboard/compat/proto/event.proto
//! and summary.proto):
//!
//! ```text
//! message Event   { double wall_time = 1; int64 step = 2;
//!                   oneof what { string file_version = 3; Summary summary = 5; ... } }
//! message Summary { repeated Value value = 1; }
//! message Value   { string tag = 1; oneof value { float simple_value = 2; ... } }
//! ```
//!
//! Encoding follows proto3's canonical form (default-valued plain fields are
//! left out; a set oneof member is always written), so the bytes match what
//! Python's protobuf produces. Decoding skips fields it does not know.

/// Protobuf wire types used here.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

// Event fields.
const EVENT_WALL_TIME: u32 = 1;
const EVENT_STEP: u32 = 2;
const EVENT_FILE_VERSION: u32 = 3;
const EVENT_SUMMARY: u32 = 5;
// Summary fields.
const SUMMARY_VALUE: u32 = 1;
// Summary.Value fields.
const VALUE_TAG: u32 = 1;
const VALUE_SIMPLE_VALUE: u32 = 2;
/// The other members of `Summary.Value`'s `value` oneof (old-style histogram,
/// image, histo, audio, tensor): seeing one after `simple_value` replaces it.
const VALUE_OTHER_ONEOF: [u32; 5] = [3, 4, 5, 6, 8];

/// Appends `v` as a base-128 varint (least significant group first).
pub(crate) fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn put_key(buf: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(buf, (u64::from(field) << 3) | u64::from(wire));
}

fn put_bytes(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(buf, field, LEN);
    put_varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// Appends the Event header fields shared by every event.
fn put_event_header(buf: &mut Vec<u8>, wall_time: f64, step: i64) {
    // proto3 omits a double only when its bits are all zero (so -0.0 is kept).
    if wall_time.to_bits() != 0 {
        put_key(buf, EVENT_WALL_TIME, FIXED64);
        buf.extend_from_slice(&wall_time.to_le_bytes());
    }
    if step != 0 {
        put_key(buf, EVENT_STEP, VARINT);
        // int64 is encoded as its two's-complement u64: negatives take 10 bytes.
        put_varint(buf, step as u64);
    }
}

/// `Event { wall_time, file_version }`: the first record of every event file.
pub(crate) fn encode_file_version_event(wall_time: f64, file_version: &str) -> Vec<u8> {
    let mut buf = Vec::with_capacity(32);
    put_event_header(&mut buf, wall_time, 0);
    put_bytes(&mut buf, EVENT_FILE_VERSION, file_version.as_bytes());
    buf
}

/// `Event { wall_time, step, summary { value { tag, simple_value }... } }`.
///
/// `simple_value` is a protobuf `float`, so each value is narrowed to `f32`.
pub(crate) fn encode_scalars_event(wall_time: f64, step: i64, scalars: &[(&str, f64)]) -> Vec<u8> {
    let mut summary = Vec::with_capacity(scalars.len() * 24);
    let mut value = Vec::with_capacity(24);
    for &(tag, v) in scalars {
        value.clear();
        if !tag.is_empty() {
            put_bytes(&mut value, VALUE_TAG, tag.as_bytes());
        }
        put_key(&mut value, VALUE_SIMPLE_VALUE, FIXED32);
        value.extend_from_slice(&(v as f32).to_le_bytes());
        put_bytes(&mut summary, SUMMARY_VALUE, &value);
    }
    let mut buf = Vec::with_capacity(summary.len() + 24);
    put_event_header(&mut buf, wall_time, step);
    put_bytes(&mut buf, EVENT_SUMMARY, &summary);
    buf
}

/// What the reader keeps of one decoded `Event`.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct DecodedEvent {
    pub(crate) wall_time: f64,
    pub(crate) step: i64,
    pub(crate) file_version: Option<String>,
    /// `(tag, simple_value)` for each summary value that is a simple scalar.
    pub(crate) scalars: Vec<(String, f32)>,
}

/// A cursor over one message's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let rest = &self.buf[self.pos..];
        if rest.len() < n {
            return Err(format!(
                "{what} at message byte {} needs {n} bytes, {} left",
                self.pos,
                rest.len()
            ));
        }
        self.pos += n;
        Ok(&rest[..n])
    }

    fn varint(&mut self) -> Result<u64, String> {
        let start = self.pos;
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(format!("varint at message byte {start} runs past the end"));
            };
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!(
            "varint at message byte {start} is longer than 10 bytes"
        ))
    }

    /// Reads a field key: `(field number, wire type)`.
    fn key(&mut self) -> Result<(u32, u8), String> {
        let k = self.varint()?;
        let field =
            u32::try_from(k >> 3).map_err(|_| format!("field number {} too large", k >> 3))?;
        Ok((field, (k & 7) as u8))
    }

    fn fixed32(&mut self) -> Result<[u8; 4], String> {
        let b = self.take(4, "fixed32")?;
        Ok([b[0], b[1], b[2], b[3]])
    }

    fn fixed64(&mut self) -> Result<[u8; 8], String> {
        let b = self.take(8, "fixed64")?;
        Ok([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    fn len_delimited(&mut self) -> Result<&'a [u8], String> {
        let len = self.varint()?;
        let len = usize::try_from(len).map_err(|_| format!("length {len} too large"))?;
        self.take(len, "length-delimited field")
    }

    /// Reads a field of type `expected`, or explains the mismatch.
    fn expect_wire(field: u32, wire: u8, expected: u8) -> Result<(), String> {
        if wire == expected {
            Ok(())
        } else {
            Err(format!(
                "field {field} has wire type {wire}, expected {expected}"
            ))
        }
    }

    /// Skips a field this decoder does not use.
    fn skip(&mut self, field: u32, wire: u8) -> Result<(), String> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.fixed64().map(drop),
            LEN => self.len_delimited().map(drop),
            FIXED32 => self.fixed32().map(drop),
            _ => Err(format!("field {field} has unsupported wire type {wire}")),
        }
    }
}

fn utf8(bytes: &[u8], what: &str) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} is not valid UTF-8"))
}

/// Decodes a `Summary.Value`; `Some` only when it holds a `simple_value`.
fn decode_value(buf: &[u8]) -> Result<Option<(String, f32)>, String> {
    let mut c = Cursor::new(buf);
    let mut tag = String::new();
    let mut simple = None;
    while !c.at_end() {
        let (field, wire) = c.key()?;
        match field {
            VALUE_TAG => {
                Cursor::expect_wire(field, wire, LEN)?;
                tag = utf8(c.len_delimited()?, "tag")?;
            }
            VALUE_SIMPLE_VALUE => {
                Cursor::expect_wire(field, wire, FIXED32)?;
                simple = Some(f32::from_le_bytes(c.fixed32()?));
            }
            f if VALUE_OTHER_ONEOF.contains(&f) => {
                simple = None;
                c.skip(field, wire)?;
            }
            _ => c.skip(field, wire)?,
        }
    }
    Ok(simple.map(|v| (tag, v)))
}

fn decode_summary(buf: &[u8], scalars: &mut Vec<(String, f32)>) -> Result<(), String> {
    let mut c = Cursor::new(buf);
    while !c.at_end() {
        let (field, wire) = c.key()?;
        if field == SUMMARY_VALUE {
            Cursor::expect_wire(field, wire, LEN)?;
            scalars.extend(decode_value(c.len_delimited()?)?);
        } else {
            c.skip(field, wire)?;
        }
    }
    Ok(())
}

/// Decodes an `Event`, keeping wall time, step, file version and simple scalars.
pub(crate) fn decode_event(buf: &[u8]) -> Result<DecodedEvent, String> {
    let mut c = Cursor::new(buf);
    let mut event = DecodedEvent::default();
    while !c.at_end() {
        let (field, wire) = c.key()?;
        match field {
            EVENT_WALL_TIME => {
                Cursor::expect_wire(field, wire, FIXED64)?;
                event.wall_time = f64::from_le_bytes(c.fixed64()?);
            }
            EVENT_STEP => {
                Cursor::expect_wire(field, wire, VARINT)?;
                event.step = c.varint()? as i64;
            }
            EVENT_FILE_VERSION => {
                Cursor::expect_wire(field, wire, LEN)?;
                event.file_version = Some(utf8(c.len_delimited()?, "file_version")?);
            }
            EVENT_SUMMARY => {
                Cursor::expect_wire(field, wire, LEN)?;
                decode_summary(c.len_delimited()?, &mut event.scalars)?;
            }
            _ => c.skip(field, wire)?,
        }
    }
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(v: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        put_varint(&mut buf, v);
        buf
    }

    #[test]
    fn varint_encoding() {
        assert_eq!(varint(0), [0x00]);
        assert_eq!(varint(1), [0x01]);
        assert_eq!(varint(127), [0x7f]);
        assert_eq!(varint(128), [0x80, 0x01]);
        assert_eq!(varint(300), [0xac, 0x02]);
        assert_eq!(varint(16_384), [0x80, 0x80, 0x01]);
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(varint(u64::MAX), max);
        // A negative int64 is its two's complement: always 10 bytes.
        assert_eq!(varint(-1i64 as u64).len(), 10);
    }

    #[test]
    fn varint_roundtrip_and_errors() {
        for v in [0, 1, 127, 128, 300, 1 << 35, u64::MAX - 1, u64::MAX] {
            let bytes = varint(v);
            assert_eq!(Cursor::new(&bytes).varint().unwrap(), v);
        }
        assert!(Cursor::new(&[0x80, 0x80])
            .varint()
            .unwrap_err()
            .contains("past the end"));
        assert!(Cursor::new(&[0xff; 11])
            .varint()
            .unwrap_err()
            .contains("longer than 10"));
    }

    #[test]
    fn encoding_matches_python_protobuf() {
        // tensorboard.compat.proto.event_pb2:
        //   e = Event(wall_time=1.5, step=3)
        //   v = e.summary.value.add(); v.tag = "loss"; v.simple_value = 0.25
        //   e.SerializeToString().hex()
        let scalars = encode_scalars_event(1.5, 3, &[("loss", 0.25)]);
        assert_eq!(
            hex(&scalars),
            "09000000000000f83f10032a0d0a0b0a046c6f7373150000803e"
        );
        //   Event(wall_time=1700000000.0, file_version="brain.Event:2").SerializeToString().hex()
        let version = encode_file_version_event(1_700_000_000.0, "brain.Event:2");
        assert_eq!(
            hex(&version),
            "0900000040fc54d9411a0d627261696e2e4576656e743a32"
        );
    }

    #[test]
    fn event_roundtrip() {
        let bytes = encode_scalars_event(12.25, -7, &[("a/b", 1.0), ("", -3.5), ("c", 1e30)]);
        let event = decode_event(&bytes).unwrap();
        assert_eq!(event.wall_time, 12.25);
        assert_eq!(event.step, -7);
        assert_eq!(event.file_version, None);
        let want = [("a/b", 1.0f32), ("", -3.5), ("c", 1e30)];
        let want: Vec<(String, f32)> = want.iter().map(|&(t, v)| (t.to_owned(), v)).collect();
        assert_eq!(event.scalars, want);

        let event = decode_event(&encode_file_version_event(0.0, "brain.Event:2")).unwrap();
        assert_eq!(event.file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!((event.wall_time, event.step), (0.0, 0));
    }

    #[test]
    fn unknown_fields_are_skipped_and_other_oneof_members_replace_simple_value() {
        let mut value = Vec::new();
        put_bytes(&mut value, VALUE_TAG, b"t");
        put_key(&mut value, VALUE_SIMPLE_VALUE, FIXED32);
        value.extend_from_slice(&2.0f32.to_le_bytes());
        put_bytes(&mut value, 9, b"metadata"); // SummaryMetadata: kept scalar
        let mut tensor_value = value.clone();
        put_bytes(&mut tensor_value, 8, b"tensor"); // oneof switches to tensor
        let mut summary = Vec::new();
        put_bytes(&mut summary, SUMMARY_VALUE, &value);
        put_bytes(&mut summary, SUMMARY_VALUE, &tensor_value);
        let mut event = Vec::new();
        put_event_header(&mut event, 1.0, 5);
        put_key(&mut event, 6, LEN); // log_message
        put_varint(&mut event, 0);
        put_bytes(&mut event, EVENT_SUMMARY, &summary);
        let decoded = decode_event(&event).unwrap();
        assert_eq!(decoded.scalars, vec![("t".to_owned(), 2.0)]);
        assert_eq!(decoded.step, 5);
    }

    #[test]
    fn malformed_messages_are_errors() {
        // Field 1 (wall_time) claims 8 bytes but only 2 follow.
        assert!(decode_event(&[0x09, 1, 2]).unwrap_err().contains("fixed64"));
        // Field 2 (step) sent as length-delimited.
        assert!(decode_event(&[0x12, 0])
            .unwrap_err()
            .contains("wire type 2"));
        // Wire type 3 (start group) is not supported.
        assert!(decode_event(&[0x33])
            .unwrap_err()
            .contains("unsupported wire type"));
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
