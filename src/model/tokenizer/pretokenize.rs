//! BPE pre-tokenization: splitting text into words before merges, exactly as llama.cpp's
//! `unicode_regex_split` does for the pre-tokenizer types Hearth supports.
//!
//! llama.cpp runs each pre-tokenizer as a list of regexes, each one re-splitting the
//! pieces the previous one produced. The look-ahead patterns (GPT-2, Llama 3, Qwen 2)
//! are hand-written state machines over llama.cpp's own Unicode category table, and the
//! simple ones (`\p{N}`, `[0-9][0-9][0-9]`, ...) run through `std::regex` on a text where
//! each non-ASCII code point is collapsed to one byte per category. Both are ported here
//! as scanners over that same table, so the word boundaries are identical (a general
//! regex engine would disagree with these at the edges: `\s` on U+0085, categories of
//! recent code points, ...).

use super::unicode::{cpt_flags, CptFlags};

/// One regex of a pre-tokenizer, as a scanner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SplitStep {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// (`digits_max` 3), or Qwen 2's variant with `\p{N}` (`digits_max` 1).
    Llama3 {
        /// Longest digit group.
        digits_max: usize,
    },
    /// `\p{N}`: every number code point alone.
    EachNumber,
    /// `\p{N}+`: runs of number code points.
    NumberRuns,
    /// `[\p{P}\$\+<=>\^~\|]+` (default) or, with `backtick`, falcon's
    /// ``[\p{P}\$\+<=>\^~\|`]+``: runs of punctuation and those ASCII symbols.
    PunctRuns {
        /// Whether `` ` `` is in the class.
        backtick: bool,
    },
    /// `[0-9][0-9][0-9]`: groups of three ASCII digits.
    AsciiDigitTriples,
}

/// Splits `text` into words (byte ranges of `text`, in order, covering all of it).
pub(crate) fn split(text: &str, steps: &[SplitStep]) -> Vec<std::ops::Range<usize>> {
    let mut cpts = Vec::with_capacity(text.len());
    let mut starts = Vec::with_capacity(text.len() + 1);
    for (i, c) in text.char_indices() {
        starts.push(i);
        cpts.push(c as u32);
    }
    starts.push(text.len());
    let flags: Vec<CptFlags> = cpts.iter().map(|&c| cpt_flags(c)).collect();
    let text = Text {
        cpts: &cpts,
        flags: &flags,
    };

    let mut chunks = vec![cpts.len()];
    for step in steps {
        let mut out = Vec::with_capacity(chunks.len());
        let mut start = 0;
        for &len in &chunks {
            let chunk = Chunk {
                text: &text,
                ini: start,
                end: start + len,
            };
            match *step {
                SplitStep::Gpt2 => chunk.split_gpt2(&mut out),
                SplitStep::Llama3 { digits_max } => chunk.split_llama3(digits_max, &mut out),
                SplitStep::EachNumber => chunk.split_class(is_collapsed_number, false, &mut out),
                SplitStep::NumberRuns => chunk.split_class(is_collapsed_number, true, &mut out),
                SplitStep::PunctRuns { backtick: false } => {
                    chunk.split_class(is_collapsed_punct, true, &mut out)
                }
                SplitStep::PunctRuns { backtick: true } => {
                    chunk.split_class(|c, f| c == 0x60 || is_collapsed_punct(c, f), true, &mut out)
                }
                SplitStep::AsciiDigitTriples => chunk.split_digit_triples(&mut out),
            }
            start += len;
        }
        chunks = out;
    }

    let mut words = Vec::with_capacity(chunks.len());
    let mut pos = 0;
    for len in chunks {
        words.push(starts[pos]..starts[pos + len]);
        pos += len;
    }
    words
}

/// The text as code points with their flags.
struct Text<'a> {
    cpts: &'a [u32],
    flags: &'a [CptFlags],
}

/// The code points `ini..end` of the text: one piece from the previous step.
struct Chunk<'a> {
    text: &'a Text<'a>,
    ini: usize,
    end: usize,
}

/// llama.cpp's marker for a position outside the chunk.
const OUT_OF_RANGE: u32 = 0xFFFF_FFFF;

/// Pushes piece lengths; empty pieces are dropped (llama.cpp's `_add_token`).
struct Emitter<'o> {
    out: &'o mut Vec<usize>,
    prev_end: usize,
}

impl Emitter<'_> {
    /// Ends the current piece at `end`; returns its length.
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

impl Chunk<'_> {
    fn cpt(&self, pos: usize) -> u32 {
        if (self.ini..self.end).contains(&pos) {
            self.text.cpts[pos]
        } else {
            OUT_OF_RANGE
        }
    }

    fn flags(&self, pos: usize) -> CptFlags {
        if (self.ini..self.end).contains(&pos) {
            self.text.flags[pos]
        } else {
            CptFlags::NONE
        }
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (ASCII case-folded when `fold`): the length matched.
    fn contraction(&self, pos: usize, fold: bool) -> usize {
        if self.cpt(pos) != u32::from(b'\'') || pos + 1 >= self.end {
            return 0;
        }
        // llama.cpp's `unicode_tolower` only maps ASCII letters onto the letters tested here.
        let low = |c: u32| {
            if fold && (0x41..=0x5A).contains(&c) {
                c + 32
            } else {
                c
            }
        };
        let next = low(self.cpt(pos + 1));
        if [b's', b't', b'm', b'd']
            .iter()
            .any(|&b| next == u32::from(b))
        {
            return 2;
        }
        if pos + 2 < self.end {
            let next2 = low(self.cpt(pos + 2));
            let pair = |a: u8, b: u8| next == u32::from(a) && next2 == u32::from(b);
            if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
                return 3;
            }
        }
        0
    }

    /// Whitespace run at `pos`: (count, end of the last `\r`/`\n` in it or 0).
    fn whitespace_run(&self, pos: usize) -> (usize, usize) {
        let mut n = 0;
        let mut last_rn = 0;
        while self.flags(pos + n).is_whitespace() {
            let c = self.cpt(pos + n);
            if c == u32::from(b'\r') || c == u32::from(b'\n') {
                last_rn = pos + n + 1;
            }
            n += 1;
        }
        (n, last_rn)
    }

    /// Port of `unicode_regex_split_custom_gpt2`.
    fn split_gpt2(&self, out: &mut Vec<usize>) {
        let mut em = Emitter {
            out,
            prev_end: self.ini,
        };
        let mut pos = self.ini;
        let not_word =
            |f: CptFlags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.is_some();
        while pos < self.end {
            let cpt = self.cpt(pos);
            let n = self.contraction(pos, false);
            if n > 0 {
                pos += em.add(pos + n);
                continue;
            }
            let space = cpt == u32::from(b' ');
            let mut f2 = if space {
                self.flags(pos + 1)
            } else {
                self.flags(pos)
            };
            let class: Option<fn(CptFlags) -> bool> = if f2.is_letter() {
                Some(CptFlags::is_letter)
            } else if f2.is_number() {
                Some(CptFlags::is_number)
            } else if not_word(f2) {
                Some(not_word)
            } else {
                None
            };
            if let Some(class) = class {
                pos += usize::from(space);
                while class(f2) {
                    pos += 1;
                    f2 = self.flags(pos);
                }
                em.add(pos);
                continue;
            }
            pos = self.whitespace_end(pos, false);
            em.add(pos);
        }
    }

    /// Port of `unicode_regex_split_custom_llama3` (`digits_max` 3) and
    /// `unicode_regex_split_custom_qwen2` (`digits_max` 1).
    fn split_llama3(&self, digits_max: usize, out: &mut Vec<usize>) {
        let mut em = Emitter {
            out,
            prev_end: self.ini,
        };
        let mut pos = self.ini;
        let is_rn = |c: u32| c == u32::from(b'\r') || c == u32::from(b'\n');
        while pos < self.end {
            let cpt = self.cpt(pos);
            let flags = self.flags(pos);
            let n = self.contraction(pos, true);
            if n > 0 {
                pos += em.add(pos + n);
                continue;
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(is_rn(cpt) || flags.is_number())
                && (flags.is_letter() || self.flags(pos + 1).is_letter())
            {
                pos += 1;
                while self.flags(pos).is_letter() {
                    pos += 1;
                }
                em.add(pos);
                continue;
            }
            // \p{N}{1,digits_max}
            if flags.is_number() {
                pos = self.digit_groups(pos, digits_max, &mut em);
                continue;
            }
            // <space>?[^\s\p{L}\p{N}]+[\r\n]*
            let mut f2 = if cpt == u32::from(b' ') {
                self.flags(pos + 1)
            } else {
                flags
            };
            let not_word = |f: CptFlags| !(f.is_whitespace() || f.is_letter() || f.is_number());
            if not_word(f2) && flags.is_some() {
                pos += usize::from(cpt == u32::from(b' '));
                while not_word(f2) && f2.is_some() {
                    pos += 1;
                    f2 = self.flags(pos);
                }
                while is_rn(self.cpt(pos)) {
                    pos += 1;
                }
                em.add(pos);
                continue;
            }
            pos = self.whitespace_end(pos, true);
            em.add(pos);
        }
    }

    /// The alternatives after the word classes: `\s*[\r\n]+` (when `rn`), `\s+(?!\S)`,
    /// `\s+`, else one code point. Returns where the piece starting at `pos` ends.
    fn whitespace_end(&self, pos: usize, rn: bool) -> usize {
        let (num_ws, last_rn) = self.whitespace_run(pos);
        if rn && last_rn > 0 {
            last_rn
        } else if num_ws > 1 && self.cpt(pos + num_ws) != OUT_OF_RANGE {
            pos + num_ws - 1
        } else if num_ws > 0 {
            pos + num_ws
        } else {
            pos + 1
        }
    }

    /// A run of numbers at `pos`, cut into groups of `max` from the left; returns the new position.
    fn digit_groups(&self, mut pos: usize, max: usize, em: &mut Emitter<'_>) -> usize {
        let mut ini = pos;
        while self.flags(pos).is_number() {
            pos += 1;
            if pos - ini >= max {
                em.add(pos);
                ini = pos;
            }
        }
        em.add(pos);
        pos
    }

    /// `C` (`runs` false) or `C+` (`runs` true) for a code point class `C`, with
    /// `std::regex_iterator` semantics: matches and the gaps between them become pieces.
    fn split_class(&self, class: fn(u32, CptFlags) -> bool, runs: bool, out: &mut Vec<usize>) {
        let mut em = Emitter {
            out,
            prev_end: self.ini,
        };
        let mut pos = self.ini;
        while pos < self.end {
            if !class(self.text.cpts[pos], self.text.flags[pos]) {
                pos += 1;
                continue;
            }
            em.add(pos);
            pos += 1;
            while runs && pos < self.end && class(self.text.cpts[pos], self.text.flags[pos]) {
                pos += 1;
            }
            em.add(pos);
        }
        em.add(self.end);
    }

    /// `[0-9][0-9][0-9]`: leftmost non-overlapping triples of ASCII digits.
    fn split_digit_triples(&self, out: &mut Vec<usize>) {
        let mut em = Emitter {
            out,
            prev_end: self.ini,
        };
        let is_digit = |c: u32| (0x30..=0x39).contains(&c);
        let mut pos = self.ini;
        while pos + 3 <= self.end {
            let cp = &self.text.cpts[pos..pos + 3];
            if cp.iter().all(|&c| is_digit(c)) {
                em.add(pos);
                pos += 3;
                em.add(pos);
            } else {
                pos += 1;
            }
        }
        em.add(self.end);
    }
}

/// `\p{N}` on llama.cpp's collapsed text: ASCII digits, or a non-ASCII number that is not whitespace.
fn is_collapsed_number(cpt: u32, flags: CptFlags) -> bool {
    if cpt < 128 {
        return (0x30..=0x39).contains(&cpt);
    }
    !flags.is_whitespace() && flags.category() == CptFlags::NUMBER
}

/// `[\p{P}\$\+<=>\^~\|]` on the collapsed text: ASCII punctuation (llama.cpp's list) and
/// `$+<=>^~|`, or a non-ASCII punctuation code point that is not whitespace.
fn is_collapsed_punct(cpt: u32, flags: CptFlags) -> bool {
    if cpt < 128 {
        return matches!(cpt as u8,
            b'!'..=b'#' | b'%'..=b'*' | b','..=b'/' | b':' | b';' | b'?' | b'@'
            | b'['..=b']' | b'_' | b'{' | b'}' | b'$' | b'+' | b'<'..=b'>' | b'^' | b'~' | b'|');
    }
    !flags.is_whitespace() && flags.category() == CptFlags::PUNCTUATION
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words<'a>(text: &'a str, steps: &[SplitStep]) -> Vec<&'a str> {
        split(text, steps).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn gpt2_splits_like_the_regex() {
        let w = words("Hello world's  end\n\n 123", &[SplitStep::Gpt2]);
        assert_eq!(w, ["Hello", " world", "'s", " ", " end", "\n\n", " 123"]);
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        let w = words(
            "x 1234567 ok!!\n\nI'M",
            &[SplitStep::Llama3 { digits_max: 3 }],
        );
        assert_eq!(w, ["x", " ", "123", "456", "7", " ok", "!!\n\n", "I", "'M"]);
        let w = words("ab 12", &[SplitStep::Llama3 { digits_max: 1 }]);
        assert_eq!(w, ["ab", " ", "1", "2"]);
    }

    #[test]
    fn number_and_punct_classes() {
        assert_eq!(
            words("a12b", &[SplitStep::EachNumber]),
            ["a", "1", "2", "b"]
        );
        assert_eq!(words("a12b", &[SplitStep::NumberRuns]), ["a", "12", "b"]);
        assert_eq!(
            words("x...y`", &[SplitStep::PunctRuns { backtick: false }]),
            ["x", "...", "y`"]
        );
        assert_eq!(
            words("x.`y", &[SplitStep::PunctRuns { backtick: true }]),
            ["x", ".`", "y"]
        );
        assert_eq!(
            words("1234567", &[SplitStep::AsciiDigitTriples]),
            ["123", "456", "7"]
        );
    }
}
