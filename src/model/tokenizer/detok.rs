//! Ids back to text: `token_to_piece`, `detokenize` and a streaming decoder, matching
//! llama.cpp's `llama_token_to_piece` / `llama_detokenize`.

use super::unicode::unicode_to_byte;
use super::vocab::{attr, Vocab, VocabType};
use super::Tokenizer;

/// The bytes of one token (`llama_token_to_piece(vocab, id, buf, len, lstrip, special)`):
/// control and unknown tokens are empty unless `special`; `lstrip` drops up to that many
/// leading spaces. Ids outside the vocabulary give nothing.
pub(crate) fn token_to_piece(vocab: &Vocab, id: u32, lstrip: usize, special: bool) -> Vec<u8> {
    let Some(text) = vocab.texts.get(id as usize) else {
        return Vec::new();
    };
    let a = vocab.attr(id);
    let shown = attr::UNKNOWN | attr::CONTROL;
    if !special && a & shown != 0 {
        return Vec::new();
    }
    let mut piece: Vec<u8> = if a & (shown | attr::USER_DEFINED) != 0 {
        text.as_bytes().to_vec()
    } else if a & attr::NORMAL != 0 {
        match vocab.vtype {
            VocabType::Spm => text.replace('\u{2581}', " ").into_bytes(),
            VocabType::Bpe => decode_gpt2_text(text),
        }
    } else if a & attr::BYTE != 0 {
        // `<0xXX>`: llama.cpp parses the two characters after `<0x` (strtol: 0 if not hex).
        let hex = text.get(3..5).unwrap_or("");
        vec![u8::from_str_radix(hex, 16).unwrap_or(0)]
    } else {
        Vec::new()
    };
    let skip = piece
        .iter()
        .take(lstrip)
        .take_while(|&&b| b == b' ')
        .count();
    piece.drain(..skip);
    piece
}

/// GPT-2 byte-level text back to bytes (`llama_decode_text`), with llama.cpp's marker for
/// characters that are not byte stand-ins.
fn decode_gpt2_text(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match unicode_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// `llama_detokenize(ids, remove_special, unparse_special)` as bytes.
pub(crate) fn detokenize(
    vocab: &Vocab,
    ids: &[u32],
    remove_special: bool,
    unparse_special: bool,
) -> Vec<u8> {
    let mut ids = ids;
    let mut remove_space = vocab.flags.add_space_prefix;
    if remove_special
        && vocab.flags.add_bos
        && ids.first().is_some_and(|&t| Some(t) == vocab.special.bos)
    {
        remove_space = false;
        ids = &ids[1..];
    }
    if remove_special
        && vocab.flags.add_eos
        && ids.last().is_some_and(|&t| Some(t) == vocab.special.eos)
    {
        ids = &ids[..ids.len() - 1];
    }
    let mut text = Vec::new();
    for &id in ids {
        text.extend(token_to_piece(
            vocab,
            id,
            usize::from(remove_space),
            unparse_special,
        ));
        remove_space = false;
    }
    if vocab.flags.clean_spaces {
        clean_spaces(&mut text);
    }
    text
}

/// llama.cpp's `clean_up_tokenization_spaces` passes, ported index for index (they
/// rewrite the buffer in place, and the second pass's `'\0'` write is observable).
fn clean_spaces(text: &mut Vec<u8>) {
    // Pass 1: " ?", " !", " .", " ," lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // Pass 2: " ' " becomes "'".
    let n = total;
    total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // Pass 3: " 's", " 'm", " 're", " 've" lose the space.
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if x1 != b't' && x1 != b'd' && i + 2 < n {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Turns ids into text one at a time, emitting only complete UTF-8.
///
/// A character split across tokens (byte-fallback tokens, or BPE tokens holding part of
/// an emoji) is held back until its last byte arrives. Bytes that can never form a
/// character are emitted as U+FFFD. Made with [`StreamDecoder::new`], the first piece
/// loses its leading space when the model adds a space prefix, like
/// `decode(.., remove_special = false, ..)` of a whole text; made with
/// [`StreamDecoder::continuation`] (ids that follow a prompt), it keeps it. BPE
/// clean-up of spaces before punctuation is not applied (it needs look-ahead).
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    special: bool,
    pending: Vec<u8>,
    /// Whether the next piece is a text's first (its space prefix is stripped).
    first: bool,
    /// What `first` becomes after [`StreamDecoder::finish`].
    strip_first: bool,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder for `tok`; `special` renders control tokens as their text.
    pub fn new(tok: &'t Tokenizer, special: bool) -> Self {
        StreamDecoder {
            tok,
            special,
            pending: Vec::new(),
            first: true,
            strip_first: true,
        }
    }

    /// A decoder for ids that continue earlier text (a model's output after its
    /// prompt): no piece loses its leading space.
    pub fn continuation(tok: &'t Tokenizer, special: bool) -> Self {
        StreamDecoder {
            first: false,
            strip_first: false,
            ..StreamDecoder::new(tok, special)
        }
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let vocab = &self.tok.vocab;
        let lstrip = usize::from(self.first && vocab.flags.add_space_prefix);
        self.first = false;
        self.pending
            .extend(token_to_piece(vocab, id, lstrip, self.special));
        self.take_complete(false)
    }

    /// Ends the stream: any incomplete trailing bytes come out as U+FFFD.
    pub fn finish(&mut self) -> String {
        self.first = self.strip_first;
        self.take_complete(true)
    }

    fn take_complete(&mut self, flush: bool) -> String {
        let mut out = String::new();
        take_complete_utf8(&mut self.pending, &mut out, flush);
        out
    }
}

/// Moves the complete UTF-8 prefix of `bytes` into `out`; bytes that can
/// never form a character become U+FFFD. With `flush` an incomplete tail is
/// replaced by U+FFFD too, else it stays in `bytes`.
pub(crate) fn take_complete_utf8(bytes: &mut Vec<u8>, out: &mut String, flush: bool) {
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                bytes.clear();
                return;
            }
            Err(e) => {
                let good = e.valid_up_to();
                // The first `good` bytes are valid, so this replaces nothing.
                out.push_str(&String::from_utf8_lossy(&bytes[..good]));
                match e.error_len() {
                    Some(bad) => {
                        out.push('\u{FFFD}');
                        bytes.drain(..good + bad);
                    }
                    None if flush => {
                        out.push('\u{FFFD}');
                        bytes.clear();
                        return;
                    }
                    None => {
                        bytes.drain(..good);
                        return;
                    }
                }
            }
        }
    }
}
