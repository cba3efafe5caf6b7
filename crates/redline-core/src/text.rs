//! Text from files and flags, made fit to print: clipped to a width with an
//! ellipsis. A column width comes from the longest cell, and Rust's `{:w$}`
//! panics for a width past `u16::MAX` ("Formatting argument out of range"),
//! so a 70,000-character model name in a `summary.json` must never reach a
//! width or a padding unclipped.

/// The widest a single cell or name is shown (characters).
pub const MAX_SHOWN: usize = 80;

/// `text` whole when it has at most `max` characters, else its first
/// `max - 1` and `…` (so the result has at most `max` characters; `max` 0
/// gives ""). Control characters (a newline in a model name) print as `?`,
/// so one cell stays on one line.
pub fn clip(text: &str, max: usize) -> String {
    let clean = |c: char| if c.is_control() { '?' } else { c };
    if text.chars().count() <= max {
        return text.chars().map(clean).collect();
    }
    let mut out: String = text
        .chars()
        .take(max.saturating_sub(1))
        .map(clean)
        .collect();
    if max > 0 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_to_the_width_with_an_ellipsis() {
        assert_eq!(clip("mlp", 10), "mlp");
        assert_eq!(clip("abcdef", 4), "abc…");
        assert_eq!(clip("abcdef", 4).chars().count(), 4);
        assert_eq!(clip("abcdef", 0), "");
        assert_eq!(clip("ééééé", 3), "éé…", "counted in characters, not bytes");
        assert_eq!(clip("a\nb\tc", 10), "a?b?c");
        let huge = "x".repeat(70_000);
        assert_eq!(clip(&huge, MAX_SHOWN).chars().count(), MAX_SHOWN);
    }
}
