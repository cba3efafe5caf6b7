//! Text to token ids and back: UTF-8 bytes (the 256-id vocabulary of text
//! data), or a Hugging Face `tokenizer.json` (the `tokenizers` library: BPE,
//! WordPiece, Unigram, with their pre-tokenizers and decoders).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The largest `tokenizer.json` read (GPT-2's is 1.4 MB; large
/// multilingual ones reach tens of MB).
const MAX_TOKENIZER: u64 = 256 << 20;

/// How text becomes ids.
pub enum Codec {
    /// Each UTF-8 byte is an id (vocabulary 256).
    Bytes,
    /// A Hugging Face tokenizer, and the file it came from.
    Tokenizer(Box<tokenizers::Tokenizer>, PathBuf),
}

impl Codec {
    /// The tokenizer `path` describes (`tokenizer.json`).
    pub fn tokenizer(path: &Path) -> Result<Self> {
        let bad = |msg: String| Error::Invalid {
            path: path.to_path_buf(),
            msg,
        };
        let bytes = redline_core::files::read_input(path, MAX_TOKENIZER)
            .map_err(|e| bad(format!("cannot be read: {e}")))?;
        let hint = "HINT: give the tokenizer.json of a transformers model folder \
                    (tokenizer.save() in the tokenizers library writes one)";
        // JSON first: a clear position for a damaged file.
        serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| {
            bad(format!(
                "not a Hugging Face tokenizer.json: not JSON: {e}\n{hint}"
            ))
        })?;
        // The tokenizers library panics on some malformed sections (its
        // decoder and normaliser readers `expect` their shapes): a panic
        // there is this file's error, not a crash.
        let parsed = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(&bytes))
            .map_err(|_| {
                bad(format!(
                    "not a Hugging Face tokenizer.json: a section has the wrong shape (the \
                     tokenizers library stopped on it)\n{hint}"
                ))
            })?;
        let tok =
            parsed.map_err(|e| bad(format!("not a Hugging Face tokenizer.json: {e}\n{hint}")))?;
        Ok(Self::Tokenizer(Box::new(tok), path.to_path_buf()))
    }

    /// The ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Self::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Self::Tokenizer(t, path) => Ok(t
                .encode(text, false)
                .map_err(|e| Error::Invalid {
                    path: path.clone(),
                    msg: format!("encoding the text failed: {e}"),
                })?
                .get_ids()
                .to_vec()),
        }
    }

    /// The text of `ids`. Bytes that are not valid UTF-8, and ids a
    /// tokenizer decodes to part of a character, become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Self::Bytes => {
                let bytes: Vec<u8> = ids.iter().map(|&i| i.min(255) as u8).collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Self::Tokenizer(t, path) => t.decode(ids, false).map_err(|e| Error::Invalid {
                path: path.clone(),
                msg: format!("decoding ids failed: {e}"),
            }),
        }
    }

    /// The ids it can produce: 256 for bytes, a tokenizer's vocabulary
    /// with its added tokens.
    pub fn vocab(&self) -> usize {
        match self {
            Self::Bytes => 256,
            Self::Tokenizer(t, _) => t.get_vocab_size(true),
        }
    }

    /// For messages: `UTF-8 bytes` or the tokenizer's file.
    pub fn describe(&self) -> String {
        match self {
            Self::Bytes => "UTF-8 bytes".into(),
            Self::Tokenizer(_, p) => format!("the tokenizer {}", p.display()),
        }
    }
}

/// Text printed as ids arrive: each call gives the text the ids so far add
/// to what was given before, holding back an unfinished character (a
/// multi-byte character split across tokens) until the ids complete it.
pub struct Streamer<'a> {
    codec: &'a Codec,
    ids: Vec<u32>,
    shown: usize,
}

impl<'a> Streamer<'a> {
    /// A streamer of ids decoded by `codec`.
    pub fn new(codec: &'a Codec) -> Self {
        Self {
            codec,
            ids: Vec::new(),
            shown: 0,
        }
    }

    /// Adds `id`; the new text that is complete.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.codec.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}')
            || text.len() < self.shown
            || !text.is_char_boundary(self.shown)
        {
            return Ok(String::new());
        }
        let new = text[self.shown..].to_string();
        self.shown = text.len();
        Ok(new)
    }

    /// What is left at the end, undecodable bytes as U+FFFD.
    pub fn finish(self) -> Result<String> {
        let text = self.codec.decode(&self.ids)?;
        Ok(text.get(self.shown..).unwrap_or_default().to_string())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn golden() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden")
    }

    #[test]
    fn bytes_round_trip_and_stream_whole_characters() {
        let c = Codec::Bytes;
        let ids = c.encode("né→").unwrap();
        assert_eq!(ids.len(), 6);
        assert_eq!(c.decode(&ids).unwrap(), "né→");
        let mut s = Streamer::new(&c);
        let parts: Vec<String> = ids.iter().map(|&i| s.push(i).unwrap()).collect();
        assert_eq!(parts, ["n", "", "é", "", "", "→"]);
        let mut s = Streamer::new(&c);
        s.push(0xE2).unwrap();
        assert_eq!(s.finish().unwrap(), "\u{FFFD}");
    }

    #[test]
    fn a_tokenizer_file_encodes_as_transformers_does() {
        let text = std::fs::read_to_string(golden().join("hf_gpt2_tiny.json")).unwrap();
        let e: serde_json::Value = serde_json::from_str(&text).unwrap();
        let c = Codec::tokenizer(&golden().join("hf-gpt2-tiny/tokenizer.json")).unwrap();
        assert_eq!(c.vocab(), 320);
        let want: Vec<u32> = e["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(c.encode(e["prompt"].as_str().unwrap()).unwrap(), want);
        let greedy: Vec<u32> = e["greedy_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            c.decode(&greedy).unwrap(),
            e["greedy_text"].as_str().unwrap()
        );
        let mut s = Streamer::new(&c);
        let mut streamed = String::new();
        for &i in &greedy {
            streamed.push_str(&s.push(i).unwrap());
        }
        streamed.push_str(&s.finish().unwrap());
        assert_eq!(streamed, e["greedy_text"].as_str().unwrap());
    }

    #[test]
    fn a_broken_tokenizer_file_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("tokenizer.json");
        std::fs::write(&p, "{\"model\": 3}").unwrap();
        let err = Codec::tokenizer(&p).err().unwrap().to_string();
        assert!(err.contains("not a Hugging Face tokenizer.json"), "{err}");
        assert!(Codec::tokenizer(&tmp.path().join("none.json")).is_err());
        // A byte that is not UTF-8 inside the decoder's section: the
        // tokenizers library panicked on it (found by fuzzing); here the
        // JSON check names it.
        let golden_text =
            std::fs::read_to_string(golden().join("hf-gpt2-tiny/tokenizer.json")).unwrap();
        let at = golden_text.find("\"decoder\"").unwrap() + 12;
        let mut bytes = golden_text.clone().into_bytes();
        bytes[at] = 0xFF;
        std::fs::write(&p, &bytes).unwrap();
        let err = Codec::tokenizer(&p).err().unwrap().to_string();
        assert!(err.contains("not JSON"), "{err}");
        // Valid JSON with a section of the wrong shape.
        let mut v: serde_json::Value = serde_json::from_str(&golden_text).unwrap();
        v["decoder"] = serde_json::json!(5);
        std::fs::write(&p, v.to_string()).unwrap();
        let err = Codec::tokenizer(&p).err().unwrap().to_string();
        assert!(err.contains("not a Hugging Face tokenizer.json"), "{err}");
    }
}
