//! Code point classification and the GPT-2 byte <-> unicode mapping, as llama.cpp's
//! `unicode.cpp` defines them.

use super::unicode_data::{RANGES_FLAGS, WHITESPACE};

/// llama.cpp's `unicode_cpt_flags` for one code point: one category bit plus helper bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CptFlags(u16);

impl CptFlags {
    pub(crate) const UNDEFINED: u16 = 0x0001;
    pub(crate) const NUMBER: u16 = 0x0002;
    pub(crate) const LETTER: u16 = 0x0004;
    pub(crate) const PUNCTUATION: u16 = 0x0020;
    const CATEGORIES: u16 = 0x00FF;
    const WHITESPACE: u16 = 0x0100;

    /// Flags of a position outside the current chunk: no bit set (llama.cpp's `unicode_cpt_flags{}`).
    pub(crate) const NONE: CptFlags = CptFlags(0);

    pub(crate) fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub(crate) fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub(crate) fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// True for any code point inside the chunk (every real code point has some bit set).
    pub(crate) fn is_some(self) -> bool {
        self.0 != 0
    }
    /// The category bits only (`category_flag()`).
    pub(crate) fn category(self) -> u16 {
        self.0 & Self::CATEGORIES
    }
}

/// Flags of `cpt` (`unicode_cpt_flags_from_cpt`).
pub(crate) fn cpt_flags(cpt: u32) -> CptFlags {
    if cpt >= 0x110000 {
        return CptFlags(CptFlags::UNDEFINED);
    }
    // The table is sorted by first code point; find the last entry starting at or before `cpt`.
    let i = RANGES_FLAGS.partition_point(|&entry| entry >> 8 <= cpt) - 1;
    let mut flags = (RANGES_FLAGS[i] & 0xFF) as u16;
    if WHITESPACE.binary_search(&cpt).is_ok() {
        flags |= CptFlags::WHITESPACE;
    }
    CptFlags(flags)
}

/// Byte `b` as GPT-2's printable stand-in character (`unicode_byte_to_utf8`).
pub(crate) fn byte_to_unicode(b: u8) -> char {
    BYTE_TO_CHAR[b as usize]
}

/// The byte a GPT-2 stand-in character encodes (`unicode_utf8_to_byte`), if it is one.
pub(crate) fn unicode_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    let b = match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => cp as u8,
        0x100..=0x143 => *UNPRINTABLE.get((cp - 0x100) as usize)?,
        _ => return None,
    };
    Some(b)
}

/// Bytes that GPT-2 maps to U+0100.. in order (all bytes outside the printable ranges).
const UNPRINTABLE: [u8; 68] = unprintable_bytes();

const fn is_printable_byte(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn unprintable_bytes() -> [u8; 68] {
    let mut out = [0u8; 68];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        if !is_printable_byte(b as u8) {
            out[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    out
}

const BYTE_TO_CHAR: [char; 256] = byte_table();

const fn byte_table() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        out[b] = if is_printable_byte(b as u8) {
            match char::from_u32(b as u32) {
                Some(c) => c,
                None => '\0',
            }
        } else {
            let c = match char::from_u32(256 + n) {
                Some(c) => c,
                None => '\0',
            };
            n += 1;
            c
        };
        b += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_byte_map_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(
                unicode_to_byte(byte_to_unicode(b)),
                Some(b),
                "byte {b:#04x}"
            );
        }
        assert_eq!(byte_to_unicode(b' '), '\u{120}');
        assert_eq!(byte_to_unicode(b'\n'), '\u{10A}');
        assert_eq!(byte_to_unicode(b'a'), 'a');
    }

    #[test]
    fn categories_match_llamacpp() {
        assert!(cpt_flags('a' as u32).is_letter());
        assert!(cpt_flags('7' as u32).is_number());
        assert!(cpt_flags(' ' as u32).is_whitespace());
        assert!(cpt_flags(0xA0).is_whitespace());
        assert!(!cpt_flags(0x200B).is_whitespace());
        assert!(cpt_flags('中' as u32).is_letter());
        assert_eq!(cpt_flags('!' as u32).category(), CptFlags::PUNCTUATION);
        assert_eq!(cpt_flags(0x110000).category(), CptFlags::UNDEFINED);
    }
}
