//! Token data for language models: a `.txt` file read as its UTF-8 bytes,
//! or a folder of nanoGPT's `train.bin` (and `val.bin`), uint16 ids. Both
//! are memory-mapped ([`crate::tokens`]); the window length is the model's
//! `block_size` ([`DataOptions::block`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::Reader;
use crate::error::{Error, Result};
use crate::samples::Samples;
use crate::source::DataOptions;
use crate::tokens::{cache_dir, tokenise_cached, IdWidth, TokenFile, TokenWindows, Windows};

/// Text bytes and nanoGPT token files.
pub struct Tokens;

fn is_text(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("txt"))
}

impl Reader for Tokens {
    fn id(&self) -> &'static str {
        "tokens"
    }

    fn takes(&self) -> &'static str {
        "a .txt file (its UTF-8 bytes, for a GPT) or a folder with nanoGPT's train.bin (uint16 \
         token ids; val.bin is the test split)"
    }

    fn recognise(&self, path: &Path) -> Option<(String, PathBuf)> {
        if is_text(path) {
            return Some(("text (UTF-8 bytes)".into(), path.to_path_buf()));
        }
        (path.is_dir() && path.join("train.bin").is_file())
            .then(|| ("nanoGPT token files (uint16)".into(), path.to_path_buf()))
    }

    fn name_under(&self, name: String, opts: &DataOptions) -> String {
        match (&opts.tokenizer, name.starts_with("text")) {
            (Some(t), true) => format!("text, tokenised by {}", t.display()),
            _ => name,
        }
    }

    fn is_set_folder(&self, dir: &Path) -> bool {
        dir.join("train.bin").is_file() && dir.join("val.bin").is_file()
    }

    fn open(
        &self,
        at: &Path,
        opts: &DataOptions,
        notes: &mut Vec<String>,
        stop: &AtomicBool,
    ) -> Result<(Samples, Option<Samples>)> {
        let Some(block) = opts.block else {
            return Err(Error::Invalid {
                path: at.to_path_buf(),
                msg: "token data is cut into windows of a language model's block_size\nHINT: \
                      --model gpt-char, gpt2, or a model file with kind = \"gpt\""
                    .into(),
            });
        };
        let (train, test, vocab) = if let (true, Some(tok)) = (is_text(at), &opts.tokenizer) {
            let t = tokenise_cached(at, tok, &cache_dir(), stop)?;
            let f = Arc::new(TokenFile::open(&t.path, t.width)?);
            notes.push(format!(
                "tokenised with {} ({} tokens): {} ids, {} {}",
                tok.display(),
                t.vocab,
                f.len(),
                match t.made {
                    true => "cached now in",
                    false => "read from the cache",
                },
                t.path.display()
            ));
            (f, None, opts.classes.unwrap_or(t.vocab).max(t.vocab))
        } else if is_text(at) {
            let f = Arc::new(TokenFile::open(at, IdWidth::U8)?);
            (f, None, 256)
        } else {
            let train = Arc::new(TokenFile::open(&at.join("train.bin"), IdWidth::U16)?);
            let val = at.join("val.bin");
            let test = match val.is_file() {
                true => Some(Arc::new(TokenFile::open(&val, IdWidth::U16)?)),
                false => None,
            };
            // The ids the files use; `--classes` sets a larger vocabulary
            // (GPT-2's 50257 for its tokenizer's data).
            let bound = test
                .as_ref()
                .map_or(0, |t| t.id_bound())
                .max(train.id_bound()) as usize;
            (train, test, opts.classes.unwrap_or(bound).max(1))
        };
        notes.push(format!(
            "tokens: {} ids, vocabulary {vocab}; samples are windows of {} ids (block_size + \
             1), training windows at seeded random offsets drawn afresh every epoch",
            train.len(),
            block + 1
        ));
        let n = train.len();
        let windows = TokenWindows::new(
            train,
            0..n,
            block,
            vocab,
            Windows::Random { seed: opts.seed },
        )?;
        let test = test
            .map(|t| {
                let n = t.len();
                TokenWindows::new(t, 0..n, block, vocab, Windows::Consecutive)
            })
            .transpose()?;
        Ok((
            Samples::Tokens(Arc::new(windows)),
            test.map(|t| Samples::Tokens(Arc::new(t))),
        ))
    }
}
