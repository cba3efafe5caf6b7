//! WebDataset-style tar shards: members `KEY.jpg|jpeg|png` with a label in
//! `KEY.cls` (a class id as text) or `KEY.json` (`{"label": N}` or
//! `{"cls": N}`). Shards are given as a folder of `*.tar` or as a brace
//! pattern (`train-{000000..000127}.tar`). Listing reads only the tar
//! headers (seeking over the members' bytes) and the small label members.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Item, Listing};
use crate::error::{Error, Result};

const IMAGE_EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// The most shards a brace pattern may expand to.
const MAX_SHARDS: u64 = 1_000_000;

fn invalid(path: &Path, msg: String) -> Error {
    Error::Invalid {
        path: path.to_path_buf(),
        msg,
    }
}

/// Expands one `{A..B}` range of a pattern (`train-{000..127}.tar`), keeping
/// A's zero padding; a pattern without one is itself.
pub fn expand(pattern: &str) -> Result<Vec<PathBuf>> {
    let bad = |why: &str| {
        invalid(
            Path::new(pattern),
            format!("{why}; a shard pattern looks like train-{{000000..000127}}.tar"),
        )
    };
    let Some(open) = pattern.find('{') else {
        return Ok(vec![PathBuf::from(pattern)]);
    };
    let close = pattern[open..]
        .find('}')
        .map(|c| open + c)
        .ok_or_else(|| bad("a `{` without its `}`"))?;
    let (a, b) = pattern[open + 1..close]
        .split_once("..")
        .ok_or_else(|| bad("the braces hold no `A..B` range"))?;
    let (lo, hi) = match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(lo), Ok(hi)) if lo <= hi => (lo, hi),
        _ => return Err(bad("the range is not two whole numbers A <= B")),
    };
    if hi - lo >= MAX_SHARDS {
        return Err(bad(&format!("more than {MAX_SHARDS} shards")));
    }
    let (head, tail) = (&pattern[..open], &pattern[close + 1..]);
    if tail.contains('{') {
        return Err(bad("only one {A..B} range is supported"));
    }
    let width = a.len();
    Ok((lo..=hi)
        .map(|i| PathBuf::from(format!("{head}{i:0width$}{tail}")))
        .collect())
}

/// Whether `path` names shards: a brace pattern of `.tar` files.
pub fn is_pattern(path: &Path) -> bool {
    let s = path.to_string_lossy();
    s.contains('{') && s.contains("..") && s.ends_with(".tar")
}

/// The `*.tar` files in `dir`, sorted.
pub fn tars_in(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "tar"))
        .collect();
    out.sort();
    out
}

/// A folder of shards as `(train, test)`: `train/` and `test/` or `val/`
/// sub-folders of `*.tar`, or `train*.tar` beside `test*.tar` or
/// `val*.tar`, or every `*.tar` as the training split.
pub fn layout(dir: &Path) -> Option<(Vec<PathBuf>, Vec<PathBuf>)> {
    let train = tars_in(&dir.join("train"));
    if !train.is_empty() {
        let mut test = tars_in(&dir.join("test"));
        if test.is_empty() {
            test = tars_in(&dir.join("val"));
        }
        return Some((train, test));
    }
    let all = tars_in(dir);
    if all.is_empty() {
        return None;
    }
    let starts = |p: &Path, s: &str| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(s))
    };
    let train: Vec<PathBuf> = all.iter().filter(|p| starts(p, "train")).cloned().collect();
    if train.is_empty() {
        return Some((all, Vec::new()));
    }
    let test = all
        .into_iter()
        .filter(|p| starts(p, "test") || starts(p, "val"))
        .collect();
    Some((train, test))
}

/// A member's key and extension, WebDataset's way: the key is the path up
/// to the first dot of the file name.
fn split_name(name: &str) -> Option<(&str, String)> {
    let base = name.rfind('/').map_or(0, |s| s + 1);
    let dot = name[base..].find('.')? + base;
    Some((&name[..dot], name[dot + 1..].to_ascii_lowercase()))
}

/// A label member's class id.
fn parse_label(text: &str, ext: &str, what: &Path) -> Result<u32> {
    let bad = |why: String| invalid(what, format!("{why}; a label is a class id 0..K-1"));
    let number = match ext {
        "json" => {
            let v: serde_json::Value =
                serde_json::from_str(text).map_err(|e| bad(format!("is not JSON ({e})")))?;
            match v.get("label").or_else(|| v.get("cls")) {
                Some(serde_json::Value::Number(n)) => n.to_string(),
                _ => return Err(bad("holds no numeric \"label\" or \"cls\" field".into())),
            }
        }
        _ => text.trim().to_string(),
    };
    number
        .parse::<u32>()
        .map_err(|_| bad(format!("holds {number:?}")))
}

/// One sample being paired up within a shard.
#[derive(Default)]
struct Pair {
    image: Option<(u64, u64, String)>,
    label: Option<u32>,
}

/// Lists the samples of `shards` (in shard order, members in their order),
/// with `classes` classes or one more than the largest label.
pub fn list(
    shards: &[PathBuf],
    classes: Option<usize>,
    source: &Path,
    stop: &AtomicBool,
) -> Result<Listing> {
    let (mut items, mut labels) = (Vec::new(), Vec::new());
    for (s, path) in shards.iter().enumerate() {
        if stop.load(Ordering::Relaxed) {
            return Err(Error::Interrupted);
        }
        let before = items.len();
        list_one(path, s as u32, &mut items, &mut labels)?;
        if items.len() == before {
            return Err(invalid(
                path,
                "is an empty shard: it holds no image with a label\nHINT: remove it, or \
                 re-run `redline pack`"
                    .into(),
            ));
        }
    }
    let classes = match classes {
        Some(c) => c,
        None => labels.iter().max().map_or(0, |&m| m as usize + 1),
    };
    Ok(Listing {
        items,
        labels,
        shards: shards.to_vec(),
        classes,
        source: source.to_path_buf(),
    })
}

/// Appends one shard's samples.
fn list_one(path: &Path, shard: u32, items: &mut Vec<Item>, labels: &mut Vec<u32>) -> Result<()> {
    let io = |e: std::io::Error| Error::Io {
        path: path.to_path_buf(),
        source: e,
        hint: "a truncated or damaged tar shard? re-create it (`redline pack`)".into(),
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    // Every complete tar ends with two zero blocks; a copy cut short at a
    // member boundary would otherwise read as a smaller, complete shard.
    let mut end = [0u8; 1024];
    {
        use std::os::unix::fs::FileExt;
        if size < 1024
            || file.read_exact_at(&mut end, size - 1024).is_err()
            || end.iter().any(|&b| b != 0)
        {
            return Err(invalid(
                path,
                "is truncated or not a tar file: it does not end with tar's two zero blocks\n\
                 HINT: the copy was cut short; copy or pack the shard again"
                    .into(),
            ));
        }
    }
    let mut archive = tar::Archive::new(BufReader::new(file));
    let (mut order, mut pairs): (Vec<String>, HashMap<String, Pair>) = Default::default();
    for entry in archive.entries_with_seek().map_err(io)? {
        let mut entry = entry.map_err(io)?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let (offset, len) = (entry.raw_file_position(), entry.size());
        if offset + len > size {
            return Err(invalid(
                path,
                format!(
                    "is truncated: member {name} needs bytes up to {} of a {size}-byte file\n\
                     HINT: the copy was cut short; copy or pack the shard again",
                    offset + len
                ),
            ));
        }
        let Some((key, ext)) = split_name(&name) else {
            continue;
        };
        let what = PathBuf::from(format!("{}:{name}", path.display()));
        let slot = match pairs.get_mut(key) {
            Some(p) => p,
            None => {
                order.push(key.to_string());
                pairs.entry(key.to_string()).or_default()
            }
        };
        if IMAGE_EXTENSIONS.contains(&ext.as_str()) {
            if slot.image.is_some() {
                return Err(invalid(
                    &what,
                    format!("is a second image of the sample `{key}`"),
                ));
            }
            slot.image = Some((offset, len, name.clone()));
        } else if ext == "cls" || ext == "json" {
            if len > 1 << 20 {
                return Err(invalid(&what, "is a label of more than 1 MiB".into()));
            }
            let mut text = String::new();
            entry
                .read_to_string(&mut text)
                .map_err(|e| invalid(&what, format!("cannot be read as text: {e}")))?;
            slot.label = Some(parse_label(&text, &ext, &what)?);
        }
    }
    // A sample whose members do not pair up is refused: training on an
    // image without its label (or the reverse) is a broken shard.
    for key in order {
        let Some(pair) = pairs.remove(&key) else {
            continue;
        };
        match pair {
            Pair {
                image: Some((offset, len, name)),
                label: Some(label),
            } => {
                items.push(Item::Member {
                    shard,
                    offset,
                    len,
                    name: name.into(),
                });
                labels.push(label);
            }
            Pair {
                image: None,
                label: Some(_),
            } => {
                return Err(invalid(
                    path,
                    format!(
                        "sample `{key}` has a label but no image (.jpg, .jpeg or .png): the \
                         members do not pair up"
                    ),
                ))
            }
            Pair {
                image: Some(_),
                label: None,
            } => {
                return Err(invalid(
                    path,
                    format!(
                        "sample `{key}` has an image but no label ({key}.cls or {key}.json): \
                         the members do not pair up"
                    ),
                ))
            }
            Pair {
                image: None,
                label: None,
            } => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_expand_with_their_padding_or_say_what_is_wrong() -> Result<()> {
        let p = expand("/d/train-{0008..0011}.tar")?;
        assert_eq!(p.len(), 4);
        assert_eq!(p[0], PathBuf::from("/d/train-0008.tar"));
        assert_eq!(p[3], PathBuf::from("/d/train-0011.tar"));
        assert_eq!(expand("a.tar")?, vec![PathBuf::from("a.tar")]);
        for bad in [
            "x-{1..}.tar",
            "x-{3..1}.tar",
            "x-{1-3}.tar",
            "x-{1..3.tar",
            "x-{0..9999999}.tar",
        ] {
            assert!(expand(bad).is_err(), "{bad}");
        }
        assert!(is_pattern(Path::new("train-{0..3}.tar")));
        assert!(!is_pattern(Path::new("train.tar")));
        Ok(())
    }

    #[test]
    fn keys_split_at_the_first_dot_of_the_file_name() {
        assert_eq!(
            split_name("a/b.c/n01.x.JPG"),
            Some(("a/b.c/n01", "x.jpg".into()))
        );
        assert_eq!(split_name("k.cls"), Some(("k", "cls".into())));
        assert_eq!(split_name("noext"), None);
    }

    #[test]
    fn labels_come_from_cls_text_or_json() -> Result<()> {
        let p = Path::new("s.tar:k");
        assert_eq!(parse_label(" 7\n", "cls", p)?, 7);
        assert_eq!(parse_label(r#"{"label": 3}"#, "json", p)?, 3);
        assert_eq!(parse_label(r#"{"cls": 4, "x": 1}"#, "json", p)?, 4);
        for (t, e) in [("-1", "cls"), ("cat", "cls"), ("{}", "json"), ("{", "json")] {
            assert!(parse_label(t, e, p).is_err(), "{t}");
        }
        Ok(())
    }
}
